"""Hugging Face directories <-> ptmjax checkpoint folders (what `ptmjax convert` does).

An imported model becomes an ordinary ptmjax model folder: `config.gin` binds
`train.model` to the converted model (so `ptmjax inspect`, `train.init_checkpoint`
and the export read it like any run's) and `checkpoints/0/` holds its
parameters. Fine-tune it with `--gin_bindings="train.init_checkpoint = 'DIR'"`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import flax.linen as nn
import jax

from ptmjax.convert import hf
from ptmjax.layers import layer_stack
from ptmjax.tools.inspection import model_and_mesh_from_gin
from ptmjax.training.checkpoints import Checkpointer


def model_gin(model: nn.Module) -> str:
    """Gin bindings that rebuild `model`: `train.model = @Class()`, its config and every config field."""
    config = model.config
    config_name, model_name = type(config).__name__, type(model).__name__
    lines = [f"train.model = @{model_name}()", f"{model_name}.config = @{config_name}()"]
    lines += [f"{config_name}.{f.name} = {getattr(config, f.name)!r}" for f in dataclasses.fields(config)]
    return "\n".join(lines) + "\n"


def import_hf(hf_dir: str, model_dir: str) -> str:
    """Converts a Hugging Face directory into a ptmjax model folder; returns the checkpoint path."""
    model, params = hf.load(hf_dir)
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.gin"), "w") as f:
        f.write(f"# Imported from {os.path.abspath(hf_dir)} by `ptmjax convert`.\n" + model_gin(model))
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"), asynchronous=False)
    checkpointer.save_params(0, params)
    checkpointer.close()
    return os.path.join(checkpointer.directory, "0")


def read_params(model_dir: str, model: nn.Module, step: int | None = None) -> Any:
    """The parameters of a model folder's checkpoint (default: the newest) as numpy arrays."""
    from ptmjax.training.trainer import init_params

    abstract = nn.unbox(jax.eval_shape(functools.partial(init_params, model), jax.random.key(0)))
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"))
    try:
        return checkpointer.restore_params(abstract, step=step)
    finally:
        checkpointer.close()


def export_hf(model_dir: str, hf_dir: str, step: int | None = None) -> str:
    """Writes a model folder's checkpoint (default: the newest) as a Hugging Face directory."""
    model, _ = model_and_mesh_from_gin(model_dir)
    params = read_params(model_dir, model, step)
    if layer_stack.scanning_config(model):  # Hugging Face's layout is the unscanned one
        params, model = layer_stack.unscan(params, model.config), layer_stack.with_scan_layers(model, False)
    return hf.save(model, params, hf_dir)
