"""Layer schedules: a run that skips some of its layers as its step says (progressive stacking, progressive
layer dropping).

A `LayerSchedule` is an ExtraState (ptmjax/training/extra_state.py, given in `train.extra_state`) that also
says, for each layer stack of the model and a state, which layers are active and with what probability each
active layer is kept in training. The train step applies the model with the 'layer_schedule' collection its
schedules give (ptmjax/layers/layer_stack.py): an inactive layer is the identity, and in training an active one
is skipped with probability 1 - keep, one draw per layer and step. The evaluation step applies it with the
same active layers, every one of them kept. Several schedules combine: a layer is active where all say so,
kept with the product of their probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.layers.layer_stack import LAYER_SCHEDULE, LayerStackConfig
from ptmjax.training.extra_state import ParamsView


@runtime_checkable
class LayerSchedule(Protocol):
    """An ExtraState that also schedules the layers of the model's stacks."""

    name: str

    def abstract(self, view: ParamsView) -> Any: ...

    def shardings(self, view: ParamsView) -> Any: ...

    def init(self, params: Any, view: ParamsView) -> Any: ...

    def update(self, value: Any, params: Any, view: ParamsView) -> Any: ...

    def layers(self, step: jax.Array, value: Any, depth: int) -> tuple[jax.Array, jax.Array]:
        """(active bool [depth], keep float32 [depth]) of a stack `depth` layers deep, for the step that
        starts from `step` steps done and this schedule's `value` (traced)."""


def layer_schedules(extra_state: Sequence[Any]) -> tuple[LayerSchedule, ...]:
    """The LayerSchedules among a run's extra state."""
    return tuple(slot for slot in extra_state if isinstance(slot, LayerSchedule))


def schedule_variables(
    schedules: Sequence[LayerSchedule], model: nn.Module, step: jax.Array, extra: dict[str, Any], train: bool
) -> dict[str, Any]:
    """{'layer_schedule': ...}: each stack's `active` and `keep` for one application of `model` (train: the
    train step's, else the evaluation's, every active layer kept); {} without schedules."""
    if not schedules:
        return {}
    config = getattr(model, "config", None)
    if not isinstance(config, LayerStackConfig):
        raise ValueError(
            f"train.extra_state schedules layers ({', '.join(s.name for s in schedules)}), but "
            f"{type(model).__name__} has no LayerStackConfig; schedule the layers of a single family's model."
        )
    tree: dict[str, Any] = {}
    for path, depth in config.layer_stacks().items():
        active, keep = jnp.ones((depth,), jnp.bool_), jnp.ones((depth,), jnp.float32)
        for schedule in schedules:
            schedule_active, schedule_keep = schedule.layers(step, extra[schedule.name], depth)
            active, keep = active & schedule_active, keep * schedule_keep
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[LAYER_SCHEDULE] = {"active": active, "keep": keep if train else jnp.ones_like(keep)}
    return {LAYER_SCHEDULE: tree}
