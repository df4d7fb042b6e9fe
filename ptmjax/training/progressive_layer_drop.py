"""Progressive layer dropping (Zhang and He, 2020): in training, skip layers more often as the run goes on,
and the deeper ones more often.

`train.extra_state = [@ProgressiveLayerDrop()]`. The step after t steps keeps the whole model with
probability

    theta(t) = (1 - theta_bar) * exp(-gamma * t) + theta_bar

and layer l = 1 ... L of each stack (1 the lowest) with probability p_l = 1 - l / L * (1 - theta(t)), so the top
layer is kept with theta(t) and the lowest nearly always. Each layer is drawn once per step for the whole batch
from the step's 'dropout' rng; a skipped layer is the identity (ptmjax/training/layer_schedule.py,
ptmjax/layers/layer_stack.py). Evaluation runs every layer. The schedule is a function of the step alone, which
the checkpoint holds, so a resumed run draws what an uninterrupted one draws. The paper's defaults (as
DeepSpeed's): theta_bar = 0.5, gamma = 0.001. Its switchable Transformer blocks (pre-LN with gates) are not
part of this: the family's own layers are skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import gin
import jax
import jax.numpy as jnp

from ptmjax.training.extra_state import ParamsView

PROGRESSIVE_LAYER_DROP = "progressive_layer_drop"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ProgressiveLayerDrop:
    """The LayerSchedule of progressive layer dropping: `theta_bar`, the keep probability it decays to, in
    (0, 1]; `gamma`, the decay rate per step, >= 0 (see the module docstring). It carries no state."""

    theta_bar: float = 0.5
    gamma: float = 0.001
    name: ClassVar[str] = PROGRESSIVE_LAYER_DROP

    def __post_init__(self) -> None:
        theta_bar = self.theta_bar
        if isinstance(theta_bar, bool) or not isinstance(theta_bar, int | float) or not 0 < theta_bar <= 1:
            raise ValueError(f"ProgressiveLayerDrop.theta_bar={self.theta_bar!r} must be a probability in (0, 1], "
                             "e.g. 0.5 (1 keeps every layer)")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int | float) or self.gamma < 0:
            raise ValueError(f"ProgressiveLayerDrop.gamma={self.gamma!r} must be a decay rate >= 0, e.g. 0.001")

    def theta(self, step: jax.Array) -> jax.Array:
        """theta(t): the keep probability of the top layer at the step after `step` steps (float32)."""
        t = jnp.asarray(step, jnp.float32)
        return (1.0 - self.theta_bar) * jnp.exp(-self.gamma * t) + self.theta_bar

    def layers(self, step: jax.Array, value: Any, depth: int) -> tuple[jax.Array, jax.Array]:
        """Every layer active; layer l = 1 ... depth kept with probability 1 - l / depth * (1 - theta(step))."""
        depth_fraction = jnp.arange(1, depth + 1, dtype=jnp.float32) / depth
        return jnp.ones((depth,), jnp.bool_), 1.0 - depth_fraction * (1.0 - self.theta(step))

    # The ExtraState: nothing is carried; the schedule reads the step.

    def abstract(self, view: ParamsView) -> dict:
        return {}

    def shardings(self, view: ParamsView) -> dict:
        return {}

    def init(self, params: Any, view: ParamsView) -> dict:
        return {}

    def update(self, value: Any, params: Any, view: ParamsView) -> dict:
        return value
