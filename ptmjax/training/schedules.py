"""Learning-rate schedules: T5's inverse square root, warmup + cosine, and ULMFiT's slanted triangle."""

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


@gin.configurable
def slanted_triangular(
    peak_learning_rate: float = 0.01, total_steps: int = 1_000, cut_fraction: float = 0.1, ratio: float = 32.0
) -> optax.Schedule:
    """ULMFiT's schedule (Howard and Ruder, 2018): a short linear rise over the first `cut_fraction` of
    `total_steps` to the peak, then a long linear fall; the lowest rate is `peak / ratio`.

    With cut = floor(total_steps * cut_fraction): p = step / cut before the
    cut, else 1 - (step - cut) / (cut * (1 / cut_fraction - 1)); the rate is
    `peak * (1 + p * (ratio - 1)) / ratio`.
    """
    cut = int(total_steps * cut_fraction)
    if not (0 < cut_fraction < 1 and cut >= 1 and ratio >= 1):
        raise ValueError(
            f"slanted_triangular needs 0 < cut_fraction < 1 with total_steps * cut_fraction >= 1 and ratio >= 1; got "
            f"total_steps={total_steps}, cut_fraction={cut_fraction}, ratio={ratio}"
        )

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        p = jnp.where(step < cut, step / cut, 1.0 - (step - cut) / (cut * (1.0 / cut_fraction - 1.0)))
        return peak_learning_rate * (1.0 + jnp.clip(p, 0.0, 1.0) * (ratio - 1.0)) / ratio

    return schedule
