"""The weights of the distillation terms: each a number, or a schedule of the run's steps.

A schedule is any optax schedule (a function of the step count), bound in gin as, e.g.

    Distillation.hidden_weight = @hidden/optax.linear_schedule()
    hidden/optax.linear_schedule.init_value = 1.0
    hidden/optax.linear_schedule.end_value = 0.0
    hidden/optax.linear_schedule.transition_steps = 1000

(TinyBERT's two stages are `optax.piecewise_constant_schedule`: the layer terms first, then the logits). Its step
is the run's count of finite train steps, carried in the train state as `extra['distillation_step']`, so a resumed
run goes on where it stopped and a fine-tune from an init checkpoint starts its schedules at 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ptmjax.training.extra_state import ParamsView

Weight = float | Callable[[jax.Array], jax.Array]
STEP = "distillation_step"


def bad_weights(weights: Mapping[str, Any]) -> list[str]:
    """'Distillation.{name}={value!r}' of each weight that is neither a number >= 0 nor a schedule."""
    return [f"Distillation.{name}={value!r}" for name, value in weights.items()
            if not callable(value) and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0)]


def scheduled(weights: Mapping[str, Weight]) -> bool:
    """Whether any of `weights` is a schedule."""
    return any(callable(value) for value in weights.values())


def weight_at(weight: Weight, extra: Mapping[str, Any]) -> jax.Array | float:
    """`weight` at the run's step (`extra[STEP]`), float32; a number as it is."""
    return jnp.asarray(weight(extra[STEP]), jnp.float32) if callable(weight) else weight


def is_on(weight: Weight) -> bool:
    """Whether a term of this weight is computed: a schedule always is (it may be zero only at some steps)."""
    return callable(weight) or weight != 0


@dataclasses.dataclass(frozen=True)
class DistillationStep:
    """The ExtraState counting the run's finite train steps, for the weights' schedules."""

    name: ClassVar[str] = STEP

    def abstract(self, view: ParamsView) -> Any:
        return jax.ShapeDtypeStruct((), jnp.int32)

    def shardings(self, view: ParamsView) -> Any:
        return NamedSharding(view.mesh, PartitionSpec())

    def init(self, params: Any, view: ParamsView) -> Any:
        return jnp.zeros((), jnp.int32)

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        return value + 1
