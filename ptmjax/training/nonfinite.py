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
from collections.abc import Callable, MutableMapping
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
    steps in a row were skipped, naming the last good checkpoint to resume from (`--resume_step`). No
    checkpoint is saved while a streak of skipped steps lasts, and the newest checkpoint before the first
    skipped step is kept out of rotation."""

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
    """Collects each step's finiteness (device scalars, not read yet) and applies the policy when they are read.
    `saved_steps` lists the run's checkpoints, for the step a stop names as the last good one."""

    def __init__(self, policy: NonFinitePolicy, saved_steps: Callable[[], list[int]] = list):
        self.policy = policy
        self.saved_steps = saved_steps
        self.first_skipped_step: int | None = None
        self.streak_start: int | None = None  # the first skipped step of the streak the last checked step ends
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
                self._consecutive, self.streak_start = 0, None
                continue
            what = f"step {step} has loss={float(loss)} and grad_norm={float(grad_norm)}"
            if self.policy.action == "stop":
                raise NonFiniteError(
                    f"{what}; stopped without saving it, so the newest checkpoint is "
                    "the last good state; lower the learning rate, or bind NonFinitePolicy.action = 'skip'"
                )
            self._consecutive += 1
            self._unlogged_skips += 1
            self.streak_start = step if self.streak_start is None else self.streak_start
            self.first_skipped_step = step if self.first_skipped_step is None else self.first_skipped_step
            if self._consecutive >= self.policy.max_consecutive_skips:
                raise NonFiniteError(
                    f"{what}: {self._consecutive} non-finite steps in a row were skipped, "
                    f"NonFinitePolicy.max_consecutive_skips={self.policy.max_consecutive_skips}; stopped. "
                    f"{self._resume_advice()}"
                )

    @property
    def in_streak(self) -> bool:
        """Whether the last checked step was skipped: its state is no state to save."""
        return self.streak_start is not None

    def last_good_step(self) -> int | None:
        """The newest checkpoint saved before the current streak of skipped steps began."""
        good = [step for step in self.saved_steps() if self.streak_start is None or step < self.streak_start]
        return max(good, default=None)

    def _resume_advice(self) -> str:
        good = self.last_good_step()
        if good is None:
            return (f"No checkpoint precedes step {self.streak_start}, the first of them: lower the learning rate "
                    "and start the run over in a new --model_dir")
        return (f"The last good checkpoint is step {good}, saved before step {self.streak_start}, the first of "
                f"them: lower the learning rate and resume from it with `ptmjax train ... --resume_step={good}` "
                f"(in Python: train(..., resume_step={good})), which sets the newer checkpoints aside")

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
