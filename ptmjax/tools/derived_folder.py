"""A model folder derived from another's checkpoint (quantized, head-pruned, layer-pruned), written whole.

Its config.gin is the source's with the lines that rebuild the derived model appended (gin's last binding
wins; `unscanned_config` adds those that unscan a scanned model), so `ptmjax.load`, `eval`, `infer` and
`inspect` read it as any other folder; its checkpoint, at the source's step, holds the derived parameters and
nothing else (no optimizer state); an import's tokenizer/, generation.json and sentence-transformers files come
along. A failed command leaves what was at the target.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from flax import linen as nn

from ptmjax import gin_files
from ptmjax.convert.checkpoint import refuse_non_empty
from ptmjax.data import sentence_pooling
from ptmjax.storage.model_dir import ModelDir
from ptmjax.storage.written_whole import written_whole


def source_config(folder: ModelDir, model: str = "train.model") -> tuple[str, str]:
    """The folder's config.gin and the reference it last binds to `model` (e.g. '@EncoderDecoder()')."""
    with open(folder.config_path) as f:
        config = f.read()
    found = re.findall(rf"^{re.escape(model)}\s*=\s*(@\S+)\s*$", config, re.MULTILINE)
    if not found:
        raise ValueError(f"{folder.config_path} binds no {model} on one line (e.g. '{model} = @GPT2()')")
    return config, found[-1]


def unscanned_config(folder: ModelDir, config: str, unscanned: nn.Module) -> str:
    """The folder's `config` with each `scan_layers = True` line it holds bound False after it; refused in one
    line unless it then builds `unscanned`, the folder's model with plain layers."""
    keys = sorted(set(re.findall(r"^([\w./]+\.scan_layers)\s*=\s*True\s*$", config, re.MULTILINE)))
    config += "\n# Layers unscanned: each holds its own parameters.\n" + "".join(f"{key} = False\n" for key in keys)
    with tempfile.TemporaryDirectory() as scratch:
        with open(ModelDir(scratch).config_path, "w") as f:
            f.write(config)
        built, _ = gin_files.read_model_config(ModelDir(scratch))
    if built != unscanned:
        raise ValueError(f"{folder.config_path} scans the model's layers, but not by a line 'SomeConfig.scan_layers = "
                         "True' that can be bound False after it; write that binding into its config.gin")
    return config


def refuse_target(target: str, what: str, command: str, overwrite: bool) -> None:
    """Before any work: a non-empty `target` is refused unless `overwrite`."""
    if not overwrite:
        refuse_non_empty(target, "--to", what, command)


def write_derived_folder(
    source: ModelDir, target: str, config: str, params: Any, step: int, records: Mapping[str, Any] | None = None,
) -> str:
    """Writes `params` at `step` with `config` (and each of `records` as a JSON file) as the model folder `target`
    derived from `source`; returns the checkpoint's path."""
    with written_whole(target) as staging:
        staged = ModelDir(staging)
        for name in (os.path.basename(source.tokenizer_path), os.path.basename(source.generation_path)):
            path = os.path.join(source.path, name)
            if os.path.exists(path):
                (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, os.path.join(staging, name))
        sentence_pooling.copy_pooling_files(source.path, staging)
        with open(staged.config_path, "w") as f:
            f.write(config)
        for name, record in (records or {}).items():
            with open(os.path.join(staging, name), "w") as f:
                json.dump(record, f, indent=1)
        checkpointer = staged.checkpointer(asynchronous=False)
        checkpointer.save_params(step, params)
        checkpointer.close()
    return os.path.join(ModelDir(target).checkpoints_path, str(step))


def checkpoint_bytes(checkpoint: str) -> int:
    """The bytes of a checkpoint folder's files."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(checkpoint) for name in names)
