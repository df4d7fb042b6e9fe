"""Starting a run from a model folder's parameters, whichever layer layout they were saved in."""

from __future__ import annotations

from typing import Any

import jax

from ptmjax.layers import layer_stack
from ptmjax.model_dir import ModelDir
from ptmjax.training.trainer import Trainer


def initial_params(model_dir: str, trainer: Trainer) -> Any:
    """The newest parameters of `model_dir`'s checkpoints, laid out and sharded as the trainer's.

    Parameters saved with the other `scan_layers` setting are converted with
    `layer_stack.scan` or `unscan` on the host: for example an import from
    Hugging Face (always unscanned) fine-tuned with scanned layers. Reads only:
    nothing is created in `model_dir`.
    """
    folder = ModelDir(model_dir)
    step = folder.checkpoint_step()
    saved = _paths(folder.state_metadata(step)["params"])
    api = trainer.api
    if saved == _paths(api.abstract_params):
        params = folder.read_params(api.abstract_params, trainer.state_shardings.params, step)
    else:
        other = api.with_scan_layers(not api.scanning)
        if other is None or saved != _paths(other.abstract_params):
            wanted = _paths(api.abstract_params)
            raise ValueError(
                f"the checkpoint in {folder.checkpoints_path} does not hold {type(api.module).__name__}'s parameters; "
                f"only in the checkpoint: {sorted(saved - wanted)[:5]}, only in the model: {sorted(wanted - saved)[:5]}"
                ". Use the model of the folder's config.gin (e.g. pass that file after the run's own gin files)."
            )
        host = folder.read_params(other.abstract_params, step=step)
        config = api.module.config
        host = layer_stack.scan(host, config) if api.scanning else layer_stack.unscan(host, config)
        params = jax.device_put(host, trainer.state_shardings.params)
    print(f"Initialised the parameters from {folder.checkpoints_path} (step {step})")
    return params


def _paths(tree: Any) -> set[str]:
    return {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)}
