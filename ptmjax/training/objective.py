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
from typing import Any, Protocol

import jax

from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.token_loss import LossConfig


class Objective(Protocol):
    """A train step's loss, which may read and update the run's extra state."""

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """(summed token loss, per-batch loss, stats, {entry name: new value}) on `batch`, as `ModelApi.loss`
        returns the first three (see ptmjax/training/steps.py for how the step combines them)."""


def family_loss(
    api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
    extra: Mapping[str, Any],
) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
    """The family's own loss (`ModelApi.loss`); reads no extra state and changes none."""
    return (*api.loss(params, batch, loss_config, rng), {})
