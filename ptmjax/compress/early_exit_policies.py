"""When an example leaves an early-exit model: DeeBERT's entropy threshold and PABEE's patience, layer by layer.

A policy reads one exit's logits at a time, in layer order, and updates an `ExitState`: which rows
have left, at which layer (1-based) and with which logits. A row leaves at the first layer the
policy accepts, and at the last layer if none does. The same `step` serves both paths:
`exit_decisions` runs every layer's logits through it in one jitted computation (all layers
computed, the exits reported), and the layer-by-layer runner (`early_exit_runner`) calls it after
each layer it computes, stopping once every row has left.

- `EntropyExit(threshold)` (DeeBERT): leave at the first layer whose prediction's entropy (nats) is
  below `threshold`; 0 never leaves early (an entropy is never negative), `math.inf` leaves at layer 1.
- `PatienceExit(patience)` (PABEE): a counter starts at 0 at layer 1, grows by one at each layer whose
  argmax (the first on ties) equals the previous layer's, and falls to 0 otherwise; leave when it
  reaches `patience` (so `patience` + 1 layers in a row agree). `math.inf` never leaves early.
"""

from __future__ import annotations

import abc
import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class ExitState:
    """layer int32 [b]: the 1-based exit layer, 0 while the row stays; logits float32 [b, C]: those at the exit
    (the latest layer's while it stays); previous int32 [b]: the latest argmax; streak int32 [b]: PABEE's counter."""

    layer: Array
    logits: Array
    previous: Array
    streak: Array

    @classmethod
    def start(cls, logits: Array) -> ExitState:
        """The state before layer 1, for rows shaped as `logits` [b, C]."""
        zeros = jnp.zeros(logits.shape[:1], jnp.int32)
        return cls(zeros, jnp.zeros(logits.shape, jnp.float32), zeros - 1, zeros)

    @property
    def exited(self) -> Array:
        return self.layer > 0

    @property
    def predictions(self) -> Array:
        """int32 [b]: the class at each row's exit."""
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)


def entropy(logits: Array) -> Array:
    """The softmax's entropy in nats over the last axis, float32."""
    log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


class ExitPolicy(abc.ABC):
    """A rule for leaving: `accepts`, the rows that may leave at a layer."""

    @abc.abstractmethod
    def accepts(self, logits: Array, streak: Array) -> Array:
        """bool [b]: the rows this layer's logits [b, C] (and PABEE's counter [b]) let leave."""

    def step(self, state: ExitState, logits: Array, layer: int, last: bool) -> ExitState:
        """The state after the 1-based `layer`, whose exit gave `logits` [b, C]; every row leaves at the `last`."""
        logits = logits.astype(jnp.float32)
        argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        streak = jnp.where(argmax == state.previous, state.streak + 1, 0)
        leaving = ~state.exited & (jnp.ones_like(argmax, bool) if last else self.accepts(logits, streak))
        staying = ~state.exited & ~leaving
        return ExitState(
            layer=jnp.where(leaving, layer, state.layer),
            logits=jnp.where((leaving | staying)[:, None], logits, state.logits),
            previous=argmax, streak=streak,
        )


@dataclasses.dataclass(frozen=True)
class EntropyExit(ExitPolicy):
    """DeeBERT: leave where the entropy (nats) is below `threshold` (>= 0; `math.inf` leaves at layer 1)."""

    threshold: float

    def __post_init__(self) -> None:
        value = self.threshold
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
            raise ValueError(f"EntropyExit threshold={value!r} must be a number >= 0 (0: never leave early).")

    def accepts(self, logits: Array, streak: Array) -> Array:
        return entropy(logits) < self.threshold


@dataclasses.dataclass(frozen=True)
class PatienceExit(ExitPolicy):
    """PABEE: leave when the argmax has not changed for `patience` layers (an int >= 1, or `math.inf`)."""

    patience: int | float

    def __post_init__(self) -> None:
        value = self.patience
        if isinstance(value, bool) or not (isinstance(value, int) or value == math.inf) or value < 1:
            raise ValueError(f"PatienceExit patience={value!r} must be an int >= 1, or math.inf to never leave early.")

    def accepts(self, logits: Array, streak: Array) -> Array:
        return streak >= self.patience


def exit_decisions(policy: ExitPolicy, logits: Array) -> ExitState:
    """Every row's exit under `policy`, from all L exits' logits [L, b, C] (jit it; L is static)."""
    state = ExitState.start(logits[0])
    for index in range(logits.shape[0]):
        state = policy.step(state, logits[index], index + 1, last=index == logits.shape[0] - 1)
    return state


def layers_saved(exit_layers: Array, depth: int) -> float:
    """The fraction of the rows' layer computations an exit at `exit_layers` (1-based) leaves out of `depth` each."""
    return 1.0 - float(jnp.mean(jnp.asarray(exit_layers, jnp.float32))) / depth
