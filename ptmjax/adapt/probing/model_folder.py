"""A model folder (a `ptmjax train` run or a `ptmjax convert` import) read for probing: its model, its
parameters on the host (unscanned, whatever layout it trained in) and its vocabulary."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
import seqio

from ptmjax import gin_files
from ptmjax.adapt.probing.layer_features import plain_model
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import CONFIG_FILE, ModelDir


@dataclasses.dataclass(frozen=True)
class FrozenModel:
    module: nn.Module
    params: Any
    vocabulary: seqio.Vocabulary
    source: str


def read_model_folder(path: str, step: int | None = None) -> FrozenModel:
    """The folder's model and checkpoint `step` (default: the newest)."""
    folder = ModelDir(os.path.abspath(os.path.expanduser(path)))
    if not os.path.isfile(folder.config_path):
        raise FileNotFoundError(f"{folder.path} has no {CONFIG_FILE}; pass a `ptmjax train` run or a `ptmjax convert "
                                "--from-hf` import")
    module, _ = gin_files.read_model_config(folder)
    params = folder.read_params(model_api(module).abstract_params, step=step)
    module, params = plain_model(module, params)
    source = f"{folder.path} (step {folder.checkpoint_step(step)})"
    return FrozenModel(module, params, gin_files.folder_vocabulary(folder), source)
