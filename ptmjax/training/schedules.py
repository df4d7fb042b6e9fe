"""Learning-rate schedules: T5's inverse square root, and warmup + cosine."""

from __future__ import annotations

import gin
import jax.numpy as jnp
import optax


@gin.configurable
def rsqrt_with_warmup(
    peak_learning_rate: float = 0.01, warmup_steps: int = 10_000, linear_warmup: bool = False
) -> optax.Schedule:
    """T5's schedule: `peak * sqrt(warmup / max(step, warmup))`.

    Constant at `peak_learning_rate` for `warmup_steps` (T5 used 0.01 for 10k
    steps), then decaying as 1/sqrt(step). With `linear_warmup`, the constant
    phase is replaced by a ramp from 0.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        decay = jnp.sqrt(warmup_steps / jnp.maximum(step, warmup_steps))
        ramp = jnp.minimum(1.0, (step + 1) / warmup_steps) if linear_warmup else 1.0
        return peak_learning_rate * decay * ramp

    return schedule


@gin.configurable
def warmup_cosine(
    peak_learning_rate: float = 1e-3, warmup_steps: int = 1_000, total_steps: int = 100_000,
    final_fraction: float = 0.1,
) -> optax.Schedule:
    """Linear warmup to the peak, then cosine decay to `final_fraction` of it."""
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps < total_steps, got {warmup_steps} and {total_steps}"
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak_learning_rate, warmup_steps=warmup_steps,
        decay_steps=total_steps, end_value=peak_learning_rate * final_fraction,
    )
