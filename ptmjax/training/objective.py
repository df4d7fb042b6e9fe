"""What the train step minimises: by default the family's own loss. An `Objective` may also read the run's
extra state (a frozen teacher's parameters, pruning masks, a recurrent memory: ptmjax/training/extra_state.py)
and return new values for some of its entries.

The step differentiates an objective with respect to the trained parameters only, so whatever it reads from
the extra state is a constant of the step. As with `ModelApi.loss`, the token loss is summed over the batch's
tokens and divided by their count, and the per-batch loss (a regulariser, an auxiliary loss) counts once per
batch. With micro-batches the objective runs once per micro-batch, and the extra state is carried from one to
the next (each reads the values the previous one returned). The new values are kept only after a finite
step, and before each `ExtraState.update`; the evaluation step scores the family's own loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import jax
from flax import linen as nn

from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.token_loss import LossConfig
from ptmjax.training.extra_state import ExtraState


class Objective(Protocol):
    """A train step's loss, which may read and update the run's extra state."""

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """(summed token loss, per-batch loss, stats, {entry name: new value}) on `batch`, as `ModelApi.loss`
        returns the first three (see ptmjax/training/steps.py for how the step combines them)."""


@runtime_checkable
class StatefulObjective(Objective, Protocol):
    """An objective that brings the extra state it reads (a distillation's frozen teacher)."""

    def extra_state(self, model: nn.Module) -> tuple[ExtraState, ...]:
        """The ExtraState entries it reads, for a run training `model`."""

    def initial_params(self, params: Any, extra: Mapping[str, Any]) -> Any | None:
        """A fresh run's first parameters, given those initialised and the extra state (a student taking its
        teacher's layers), or None to keep them; not called for a run from an init checkpoint or a resume."""


def family_loss(
    api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
    extra: Mapping[str, Any],
) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
    """The family's own loss (`ModelApi.loss`); reads no extra state and changes none."""
    return (*api.loss(params, batch, loss_config, rng), {})
