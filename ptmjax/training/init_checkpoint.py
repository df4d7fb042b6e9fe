"""Starting a run from a model folder's parameters: all of them, or the part the model shares with it.

Fine-tuning a new head on a pre-trained backbone restores every parameter
whose path the checkpoint also has, and keeps the fresh initialisation of
the rest (the head, LoRA matrices, a soft prompt); the checkpoint's
parameters the model lacks (a pre-training head) are left out. Both lists
are printed. Signs of another model are errors: a shared path with another
shape; a layer whose checkpoint parameters are only partly taken (GPT-2's
layer norms in a BERT layer, T5 v1.0's `wi` beside v1.1's `wi_0`); a
checkpoint with less than half of the model's parameter values. The optimizer state is always fresh. Parameters saved
with the other `scan_layers` setting are converted with `layer_stack.scan` or
`unscan` on the host: for example an import from Hugging Face (always
unscanned) fine-tuned with scanned layers.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax

from ptmjax.families.model_api import ModelApi
from ptmjax.layers import layer_stack
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import overlay, shapes_by_path, subtree

MIN_RESTORED_FRACTION = 0.5
SCANNED_STACK = re.compile(rf"(^|/){layer_stack.SCANNED}/")
LAYER = re.compile(r"^(.*?/)?layers(_\d+)?/")  # the path of the first layer (or layer stack) a parameter is in
LISTED = 8  # paths named per list in the printed summary


def initial_params(model_dir: str, trainer: Trainer, rng: jax.Array) -> Any:
    """The parameters of a fresh run from `model_dir`'s newest checkpoint: those it shares with the model
    restored, the rest initialised from `rng` as the trainer's `init_state(rng)` does (with the restored ones in
    place when the layouts match: see `ModelApi.init_around`), laid out and sharded as the trainer's. Reads
    only: nothing is created in `model_dir`."""
    folder = ModelDir(model_dir)
    step = folder.checkpoint_step()
    saved = shapes_by_path(folder.state_metadata(step)["params"])
    api = trainer.api
    layout = _saved_layout(api, saved)
    wanted = shapes_by_path(layout.abstract_params)
    shared = sorted(saved.keys() & wanted.keys())
    _check_shared(folder, api, saved, wanted, shared)
    subset = subtree(layout.abstract_params, shared)
    if layout is api:
        restored = folder.read_params(subset, subtree(trainer.state_shardings.params, shared), step, whole=False)
        params = restored if len(shared) == len(wanted) else trainer.init_around(rng, restored)
    else:  # the checkpoint has the other layer layout: convert on the host
        config = api.module.config
        to_saved, to_model = layer_stack.unscan, layer_stack.scan
        if not api.scanning:
            to_saved, to_model = to_model, to_saved
        fresh = jax.device_get(trainer.init_state(rng).params)
        host = overlay(to_saved(fresh, config), folder.read_params(subset, step=step, whole=False))
        params = jax.device_put(to_model(host, config), trainer.state_shardings.params)
    print(f"Initialised {len(shared)} of {len(wanted)} parameter arrays from {folder.checkpoints_path} (step {step})")
    _print_paths("newly initialised", sorted(wanted.keys() - saved.keys()))
    _print_paths("in the checkpoint but not in the model, left out", sorted(saved.keys() - wanted.keys()))
    return params


def _saved_layout(api: ModelApi, saved: dict) -> ModelApi:
    """The model with the checkpoint's `scan_layers` setting: scanned stacks save a 'layers' module."""
    saved_scanned = any(SCANNED_STACK.search(path) for path in saved)
    other = api.with_scan_layers(saved_scanned) if saved_scanned != bool(api.scanning) else None
    return api if other is None else other


def _check_shared(folder: ModelDir, api: ModelApi, saved: dict, wanted: dict, shared: list[str]) -> None:
    """Shared paths must agree in shape and hold at least MIN_RESTORED_FRACTION of the model's values."""
    name = type(api.module).__name__
    mismatched = [f"{p}: checkpoint {saved[p]}, model {wanted[p]}" for p in shared if saved[p] != wanted[p]]
    if mismatched:
        raise ValueError(
            f"the checkpoint in {folder.checkpoints_path} has {len(mismatched)} of {name}'s parameters with other "
            f"shapes: {'; '.join(mismatched[:LISTED])}. Use the model of the folder's config.gin with only the "
            "new parts changed (e.g. a head with another name or number of labels)"
        )
    partial_layers = [p for p in sorted(saved.keys() - wanted.keys())
                      if (layer := LAYER.match(p)) and any(s.startswith(layer.group(0)) for s in shared)]
    if partial_layers:
        raise ValueError(
            f"the checkpoint in {folder.checkpoints_path} has layer parameters that {name}'s layers lack: "
            f"{partial_layers[:LISTED]}; it is another architecture. Use the model of the folder's config.gin"
        )
    restored = sum(math.prod(wanted[p]) for p in shared)
    total = sum(math.prod(shape) for shape in wanted.values())
    if restored < MIN_RESTORED_FRACTION * total:
        raise ValueError(
            f"the checkpoint in {folder.checkpoints_path} does not hold {name}'s parameters: it has "
            f"{restored / total:.0%} of their values; only in the checkpoint: "
            f"{sorted(saved.keys() - wanted.keys())[:5]}, only in the model: {sorted(wanted.keys() - saved.keys())[:5]}"
            ". Use the model of the folder's config.gin (e.g. pass that file after the run's own gin files)."
        )


def _print_paths(what: str, paths: list[str]) -> None:
    if paths:
        more = f" and {len(paths) - LISTED} more" if len(paths) > LISTED else ""
        print(f"  {len(paths)} {what}: {', '.join(paths[:LISTED])}{more}")
