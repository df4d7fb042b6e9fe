"""An exponential moving average of the trained parameters, carried in the train state as `extra['ema']`.

After every finite step, `ema = decay * ema + (1 - decay) * params`, from
`ema = params` at initialisation (an init checkpoint's parameters when a run
starts from one), in the parameters' dtype. Only the parameters the run trains
are averaged; a frozen one is its own average. `train.ema_decay` turns it on:
the run then also evaluates the averaged parameters (`eval_ema_<metric>`) and
keeps them as a model folder of their own, MODEL_DIR/ema/, that every tool
reads like a run's (ptmjax/training/callbacks/ema_folder.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ptmjax.training.extra_state import ParamsView
from ptmjax.tree_paths import overlay, subtree

EMA = "ema"


@dataclasses.dataclass(frozen=True)
class ParameterEma:
    """The ExtraState of an EMA with `decay` in [0, 1)."""

    decay: float
    name: ClassVar[str] = EMA

    def __post_init__(self) -> None:
        if isinstance(self.decay, bool) or not isinstance(self.decay, int | float) or not 0 <= self.decay < 1:
            raise ValueError(f"train.ema_decay={self.decay!r} must be a number in [0, 1), e.g. 0.999")

    def abstract(self, view: ParamsView) -> Any:
        return subtree(view.abstract_params, view.trained_paths)

    def shardings(self, view: ParamsView) -> Any:
        return subtree(view.param_shardings, view.trained_paths)

    def init(self, params: Any, view: ParamsView) -> Any:
        # A copy: an output that is the jitted function's input would share its buffer, donated by every step.
        return jax.tree.map(jnp.copy, subtree(params, view.trained_paths))

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        decay = self.decay
        return jax.tree.map(lambda average, new: (decay * average + (1 - decay) * new).astype(new.dtype),
                            value, subtree(params, view.trained_paths))


def averaged_params(params: Any, extra: dict[str, Any]) -> Any:
    """The parameters with the trained ones replaced by their EMA in `extra`."""
    return overlay(params, extra[EMA])
