"""The training state: a plain pytree of step, parameters, optimizer state and non-trained state."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import struct


@struct.dataclass
class TrainState:
    """Everything a train step reads and returns; checkpointed as a whole.

    `extra`: state that is carried between steps but not trained, one entry per
    `ExtraState` of the trainer (ptmjax/training/extra_state.py), e.g. 'ema':
    an exponential moving average of the parameters. Sharded, saved, restored
    and checked on resume like the parameters; the optimizer never sees it.
    """

    step: jax.Array
    params: Any
    opt_state: optax.OptState
    extra: dict[str, Any] = struct.field(default_factory=dict)
