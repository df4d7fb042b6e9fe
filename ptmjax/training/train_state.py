"""The training state: a plain pytree of step, parameters and optimizer state."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import struct


@struct.dataclass
class TrainState:
    """Everything a train step reads and returns; checkpointed as a whole."""

    step: jax.Array
    params: Any
    opt_state: optax.OptState
