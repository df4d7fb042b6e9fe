"""What a run does when a train step's loss or gradient norm is not finite (NaN or inf).

The jitted step (ptmjax/training/steps.py) checks them and, when either is not
finite, keeps the previous parameters and optimizer state, so a non-finite
gradient is never trained on. It reports the check as the metric
`FINITE`, which `NonFiniteMonitor` reads back only where the loop reads
metrics anyway (log steps, before each checkpoint, at the end): no extra host
sync per step. `NonFinitePolicy` says what happens then. `check_finite_state`
reads the whole state before each checkpoint, so that an optimizer that turns
finite gradients into a non-finite state (an overflow, a NaN learning rate)
never reaches a checkpoint either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from typing import Any

import gin
import jax
import jax.numpy as jnp

FINITE = "finite"
SKIPPED_STEPS = "skipped_steps"
ACTIONS = ("stop", "skip")


class NonFiniteError(ValueError):
    """Training produced a non-finite loss or gradients (a ValueError, so `ptmjax train` prints one line)."""


@gin.configurable
@dataclasses.dataclass(frozen=True)
class NonFinitePolicy:
    """action='stop': stop with an error naming the first non-finite step; no checkpoint is saved after it.
    action='skip': leave that step's update out, log `skipped_steps`, and stop once `max_consecutive_skips`
    steps in a row were skipped; the newest checkpoint before the first skipped step is kept out of rotation."""

    action: str = "stop"
    max_consecutive_skips: int = 10

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"NonFinitePolicy.action={self.action!r} is unknown; use 'stop' or 'skip'")
        if self.max_consecutive_skips < 1:
            raise ValueError(
                f"NonFinitePolicy.max_consecutive_skips={self.max_consecutive_skips} must be a positive integer"
            )


class NonFiniteMonitor:
    """Collects each step's finiteness (device scalars, not read yet) and applies the policy when they are read."""

    def __init__(self, policy: NonFinitePolicy):
        self.policy = policy
        self.first_skipped_step: int | None = None
        self._pending: list[tuple[int, jax.Array, jax.Array, jax.Array]] = []
        self._consecutive = 0
        self._unlogged_skips = 0

    def add(self, step: int, metrics: MutableMapping[str, jax.Array]) -> None:
        """Takes the FINITE flag out of step `step`'s metrics (no host sync)."""
        self._pending.append((step, metrics.pop(FINITE), metrics["loss"], metrics["grad_norm"]))

    def check(self) -> None:
        """Reads the flags added since the last check; raises NonFiniteError as the policy says."""
        pending, self._pending = jax.device_get(self._pending), []
        for step, finite, loss, grad_norm in pending:
            if finite:
                self._consecutive = 0
                continue
            what = f"step {step} has loss={float(loss)} and grad_norm={float(grad_norm)}"
            if self.policy.action == "stop":
                raise NonFiniteError(
                    f"{what}; stopped without saving it, so the newest checkpoint is "
                    "the last good state; lower the learning rate, or bind NonFinitePolicy.action = 'skip'"
                )
            self._consecutive += 1
            self._unlogged_skips += 1
            if self.first_skipped_step is None:
                self.first_skipped_step = step
            if self._consecutive >= self.policy.max_consecutive_skips:
                raise NonFiniteError(
                    f"{what}: {self._consecutive} non-finite steps in a row were skipped, "
                    f"NonFinitePolicy.max_consecutive_skips={self.policy.max_consecutive_skips}; stopped; lower "
                    "the learning rate and resume"
                )

    def skipped_since_last_call(self) -> dict[str, float]:
        """{'skipped_steps': n} for a metrics record under the 'skip' policy (checked steps since the last call)."""
        if self.policy.action != "skip":
            return {}
        skipped, self._unlogged_skips = self._unlogged_skips, 0
        return {SKIPPED_STEPS: float(skipped)}


def check_finite_state(step: int, state: Any) -> None:
    """Raises NonFiniteError unless every floating-point entry of `state` (the state after step `step`) is finite."""
    if not bool(_all_finite(state)):
        raise NonFiniteError(
            f"the state after step {step} is not finite although its steps' losses and gradient norms were: the "
            "optimizer's update overflowed or its learning rate is not finite; stopped without saving it, so the "
            "newest checkpoint is the last good state; check the learning-rate schedule or lower the learning rate"
        )


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point entry of `tree` is finite."""
    leaves = [leaf for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves]))
