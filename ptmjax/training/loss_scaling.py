"""Dynamic loss scaling for float16 activations, carried in the train state as `extra['loss_scale']`.

float16 holds magnitudes up to 65504 and down to 6e-8 (subnormal), so small gradients of a float16
backward pass underflow to zero. The train step multiplies the loss by `scale` (a power of two) before
differentiating and divides the float32 gradients by it, which is exact: with no overflow the update
equals the unscaled one bit for bit. When a gradient is not finite while the loss is, the step is an
overflow: it is skipped (parameters and optimizer state kept), the scale halves (not below
`minimum_scale`) and the step counts as finite for the non-finite policy (ptmjax/training/nonfinite.py).
After `growth_interval` finite steps in a row the scale doubles (not above `maximum_scale`). A step
whose loss is not finite, or that overflows at the minimum scale, goes to the non-finite policy.
`train.extra_state = [@DynamicLossScale()]` turns it on; the step reports the scale it used as the
metric 'loss_scale'. The parameters stay in their own dtype (float32 master weights).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import gin
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ptmjax.training.extra_state import ParamsView

LOSS_SCALE = "loss_scale"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """The ExtraState of a dynamic loss scale: {'scale': float32, 'finite_steps': int32}, replicated."""

    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    minimum_scale: float = 1.0
    maximum_scale: float = 2.0**24
    name: ClassVar[str] = LOSS_SCALE

    def __post_init__(self) -> None:
        for field in ("initial_scale", "minimum_scale", "maximum_scale"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or \
                    math.frexp(value)[0] != 0.5:
                raise ValueError(f"DynamicLossScale.{field}={value!r} must be a positive power of two, e.g. 32768.0")
        if not self.minimum_scale <= self.initial_scale <= self.maximum_scale:
            raise ValueError(f"DynamicLossScale.initial_scale={self.initial_scale} must lie in [minimum_scale="
                             f"{self.minimum_scale}, maximum_scale={self.maximum_scale}]")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int) or \
                self.growth_interval < 1:
            raise ValueError(f"DynamicLossScale.growth_interval={self.growth_interval!r} must be a positive "
                             "integer, e.g. 2000")

    def abstract(self, view: ParamsView) -> Any:
        return {"scale": jax.ShapeDtypeStruct((), jnp.float32), "finite_steps": jax.ShapeDtypeStruct((), jnp.int32)}

    def shardings(self, view: ParamsView) -> Any:
        replicated = NamedSharding(view.mesh, PartitionSpec())
        return {"scale": replicated, "finite_steps": replicated}

    def init(self, params: Any, view: ParamsView) -> Any:
        return {"scale": jnp.asarray(self.initial_scale, jnp.float32), "finite_steps": jnp.zeros((), jnp.int32)}

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        """Unchanged: the step moves the scale itself with `after_step`, on finite and skipped steps alike."""
        return value

    def overflowed(self, value: Any, loss_finite: jax.Array, grads_finite: jax.Array) -> jax.Array:
        """Whether a step is the expected overflow: a finite loss, a non-finite gradient, room to halve."""
        return loss_finite & ~grads_finite & (value["scale"] > self.minimum_scale)

    def after_step(self, value: Any, finite: jax.Array) -> Any:
        """The state after a step: doubled after `growth_interval` finite steps in a row, halved after a
        non-finite one."""
        scale, count = value["scale"], value["finite_steps"] + 1
        grow = finite & (count >= self.growth_interval)
        scale = jnp.where(finite, jnp.where(grow, jnp.minimum(scale * 2, self.maximum_scale), scale),
                          jnp.maximum(scale / 2, self.minimum_scale))
        return {"scale": scale.astype(jnp.float32),
                "finite_steps": jnp.where(finite & ~grow, count, 0).astype(jnp.int32)}
