"""How a sentence-transformers folder pools its encoder into one vector per text: `modules.json` lists the
modules (the Transformer, then `Pooling` with its `config.json`, optionally `Normalize`), and
`sentence_bert_config.json` the longest input (`max_seq_length`). `ptmjax convert` copies these files into an
import and back out of it, so the import embeds as the folder does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from ptmjax.data.hf_tokenizer_vocabulary import read_json

MODULES, SENTENCE_CONFIG, POOLING_CONFIG = "modules.json", "sentence_bert_config.json", "config.json"
MODULE_TYPE = "sentence_transformers.models."
MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
SUPPORTED = ("Transformer", "Pooling", "Normalize")


@dataclasses.dataclass(frozen=True)
class SentencePooling:
    """pooling: 'mean', 'cls' or 'max'; normalize: L2-normalised vectors; max_seq_length: inputs are cut there."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None


def read_pooling(folder: str) -> SentencePooling | None:
    """The folder's sentence-transformers pooling, or None without a modules.json; errors name the file."""
    path = os.path.join(folder, MODULES)
    if not os.path.isfile(path):
        return None
    modules = read_json(path)
    kinds = {module.get("type", "").removeprefix(MODULE_TYPE): module.get("path", "") for module in modules}
    unsupported = sorted(set(kinds) - set(SUPPORTED))
    if unsupported or "Pooling" not in kinds:
        raise ValueError(f"{path} lists modules {sorted(kinds)}; ptmjax embeds with Transformer, Pooling and "
                         "Normalize only: drop the others (or embed with the encoder alone)")
    pooling_path = os.path.join(folder, kinds["Pooling"], POOLING_CONFIG)
    config = read_json(pooling_path)
    modes = [mode for key, mode in MODES.items() if config.get(key)]
    others = [key for key, value in config.items() if key.startswith("pooling_mode_") and value and key not in MODES]
    if len(modes) != 1 or others:
        raise ValueError(f"{pooling_path} turns on {modes + others}; ptmjax pools with exactly one of "
                         f"{', '.join(MODES)}")
    sentence = os.path.join(folder, SENTENCE_CONFIG)
    length = read_json(sentence).get("max_seq_length") if os.path.isfile(sentence) else None
    return SentencePooling(modes[0], "Normalize" in kinds, length)


def copy_pooling_files(source: str, destination: str) -> None:
    """Copies modules.json, sentence_bert_config.json and the Pooling and Normalize folders, where they exist."""
    if not os.path.isfile(os.path.join(source, MODULES)):
        return
    for name in (MODULES, SENTENCE_CONFIG):
        if os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(destination, name))
    for module in read_json(os.path.join(source, MODULES)):
        folder = module.get("path", "")
        if folder and os.path.isdir(os.path.join(source, folder)):
            shutil.copytree(os.path.join(source, folder), os.path.join(destination, folder), dirs_exist_ok=True)
