"""Starting a run from a model folder's parameters, whichever layer layout they were saved in."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
from flax import linen as nn

from ptmjax.layers import layer_stack
from ptmjax.training.checkpoints import Checkpointer
from ptmjax.training.trainer import Trainer, init_params


def initial_params(model_dir: str, trainer: Trainer) -> Any:
    """The newest parameters of `model_dir`'s checkpoints, laid out and sharded as the trainer's.

    Parameters saved with the other `scan_layers` setting are converted with
    `layer_stack.scan` or `unscan` on the host: for example an import from
    Hugging Face (always unscanned) fine-tuned with scanned layers.
    """
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"))
    try:
        saved = _paths(checkpointer.saved_params())
        target = trainer.abstract_state.params
        if saved == _paths(target):
            params = checkpointer.restore_params(target, trainer.state_shardings.params)
        else:
            params = jax.device_put(_converted(checkpointer, saved, trainer.model), trainer.state_shardings.params)
        print(f"Initialised the parameters from {checkpointer.directory} (step {checkpointer.latest_step()})")
    finally:
        checkpointer.close()
    return params


def _converted(checkpointer: Checkpointer, saved: set[str], model: nn.Module) -> Any:
    """Host parameters saved in the other layer layout, converted to `model`'s; a clear error if neither fits."""
    config = model.config
    other = layer_stack.with_scan_layers(model, not getattr(config, "scan_layers", False))
    other_params = None if other is None else nn.unbox(
        jax.eval_shape(functools.partial(init_params, other), jax.random.key(0))
    )
    if other_params is None or saved != _paths(other_params):
        wanted = _paths(nn.unbox(jax.eval_shape(functools.partial(init_params, model), jax.random.key(0))))
        raise ValueError(
            f"the checkpoint in {checkpointer.directory} does not hold {type(model).__name__}'s parameters; only "
            f"in the checkpoint: {sorted(saved - wanted)[:5]}, only in the model: {sorted(wanted - saved)[:5]}. "
            "Use the model of the folder's config.gin (e.g. pass that file after the run's own gin files)."
        )
    host = checkpointer.restore_params(other_params)
    return layer_stack.scan(host, config) if config.scan_layers else layer_stack.unscan(host, config)


def _paths(tree: Any) -> set[str]:
    return {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)}
