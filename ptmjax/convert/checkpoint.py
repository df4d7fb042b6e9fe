"""Hugging Face directories <-> ptmjax checkpoint folders (what `ptmjax convert` does).

An imported model becomes an ordinary ptmjax model folder: `config.gin` binds
`train.model` to the converted model (so `ptmjax inspect`, `train.init_checkpoint`
and the export read it like any run's), `checkpoints/0/` holds its
parameters, `tokenizer/` the directory's tokenizer files, `generation.json`
its generation ids, and a sentence-transformers folder's pooling files their own
(data/sentence_pooling.py). Fine-tune it with `--gin_bindings="train.init_checkpoint = 'DIR'"`.
An export writes the tokenizer and generation ids back: an import's as they
came, a run's from its task's vocabulary.
"""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn

from ptmjax import gin_files
from ptmjax.compress.float_model import float_model
from ptmjax.compress.head_pruning import pruning_of
from ptmjax.convert import hf, hf_tokenizer
from ptmjax.data import sentence_pooling
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack
from ptmjax.models.sentence_encoder import encoder_of
from ptmjax.storage.model_dir import ModelDir
from ptmjax.storage.written_whole import written_whole

MODULE_FIELDS_NOT_BOUND = ("config", "parent", "name")


def model_gin(model: nn.Module) -> str:
    """Gin bindings that rebuild `model`: `train.model = @Class()`, its own fields that differ from their defaults
    (a task head's num_labels), its config and every config field."""
    config = model.config
    config_name, model_name = type(config).__name__, type(model).__name__
    lines = [f"train.model = @{model_name}()", f"{model_name}.config = @{config_name}()"]
    lines += [
        f"{model_name}.{f.name} = {getattr(model, f.name)!r}" for f in dataclasses.fields(model)
        if f.name not in MODULE_FIELDS_NOT_BOUND and f.init and getattr(model, f.name) != f.default
    ]
    lines += [f"{config_name}.{f.name} = {getattr(config, f.name)!r}" for f in dataclasses.fields(config)]
    return "\n".join(lines) + "\n"


def import_hf(hf_dir: str, model_dir: str, overwrite: bool = False) -> str:
    """Converts a Hugging Face directory (weights, tokenizer files, generation ids) into a ptmjax model folder.

    `model_dir` must be missing, empty, or an import of the same directory as the same model (it is then
    written again); anything else (a training run, another model) is refused unless `overwrite`, which
    replaces it. The folder is written whole (ptmjax/storage/written_whole.py): a failed import leaves what
    was there. Returns the checkpoint path.
    """
    model, params = hf.load(hf_dir)
    generation_ids = GenerationIds.from_hf_dir(hf_dir)
    config = f"# Imported from {os.path.abspath(hf_dir)} by `ptmjax convert`.\n" + model_gin(model)
    same_import = _read(ModelDir(model_dir).config_path) == config
    if not (overwrite or same_import):
        refuse_non_empty(model_dir, "--to", "a ptmjax model folder")
    with written_whole(model_dir) as staging:
        folder = ModelDir(staging)
        hf_tokenizer.copy_tokenizer_files(hf_dir, folder.tokenizer_path)
        sentence_pooling.copy_pooling_files(hf_dir, staging)
        generation_ids.write(folder.generation_path)
        with open(folder.config_path, "w") as f:
            f.write(config)
        checkpointer = folder.checkpointer(asynchronous=False)
        checkpointer.save_params(0, params)
        checkpointer.close()
    return os.path.join(ModelDir(model_dir).checkpoints_path, "0")


def export_hf(model_dir: str, hf_dir: str, step: int | None = None, overwrite: bool = False) -> str:
    """Writes a model folder's checkpoint (default: the newest) as a Hugging Face directory.

    With the folder's tokenizer and generation ids where it has them: an
    import's tokenizer/ and generation.json, or a run's task vocabulary.
    A LoRA model is written merged, a quantized or fake-quantized one dequantized (printed: float_model).
    A non-empty `hf_dir` is refused unless `overwrite`, which replaces it; the directory is written whole.
    """
    if not overwrite:
        refuse_non_empty(hf_dir, "--to-hf", "a Hugging Face directory")
    folder = ModelDir(model_dir)
    model, _ = gin_files.read_model_config(folder)
    if pruning_of(model) is not None:
        raise ValueError(
            f"{folder.path} holds a head-pruned model, and transformers 5 has no per-layer head counts (its configs "
            "dropped pruned_heads); write the same heads zeroed at full size with `ptmjax prune-heads ... "
            "--keep_shapes` from the source folder and export that"
        )
    api = model_api(model)
    model, params, notes = float_model(model, folder.read_params(api.abstract_params, step=step))
    for note in notes:  # LoRA merged, quantized kernels dequantized
        print(f"Hugging Face export of {folder.path}: {note}")
    model = encoder_of(model)  # a sentence encoder is written as the encoder it wraps, its pooling files beside it
    model, params = layer_stack.unscanned(model, params)  # Hugging Face's layout is the unscanned one
    imported = os.path.isfile(folder.generation_path)
    trained = "mixture_or_task_name" in gin_files.read_train_bindings(folder)
    with written_whole(hf_dir) as staging:
        hf.save(model, params, staging, gin_files.folder_generation_ids(folder) if imported or trained else None)
        sentence_pooling.copy_pooling_files(folder.path, staging)
        if os.path.isdir(folder.tokenizer_path):
            hf_tokenizer.copy_tokenizer_files(folder.tokenizer_path, staging)
        elif trained:
            hf_tokenizer.write_tokenizer(gin_files.folder_vocabulary(folder), staging)
    return hf_dir


def _read(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read()


def refuse_non_empty(path: str, flag: str, what: str, command: str = "ptmjax convert") -> None:
    """Raises, naming what `path` holds, unless it is missing or empty."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise FileExistsError(
            f"{path} is not empty (it holds {shown}); `{command}` writes {what} of its own there: give "
            f"{flag} a new folder, or add --overwrite to replace everything in it"
        )
