"""Transformer-XL's segment-level recurrence in training: the memory carried from each step to the next.

`train.objective = @RecurrentMemory()` with a TransformerXL model and rows from SegmentStreamFeatureConverter
(row r of each batch continues row r of the batch before; ptmjax/data/segment_stream_converter.py). The memory
(ptmjax/models/transformer_xl.py: each layer's last `memory_length` inputs per row, and how many slots hold
them) is the extra state entry 'memory' (ptmjax/training/extra_state.py): it starts empty, each train step
reads it as a constant (no gradient flows into the previous segment) and returns the memory after its batch,
kept after a finite step, so a non-finite step leaves it as it was. It is split over the batch like the rows,
saved with every checkpoint beside the data position, and restored with it, so a resumed run reads the memory
an uninterrupted one reads. The evaluation step scores segments alone (the family's loss, 'eval_loss');
ptmjax/evaluation/segment_perplexity.py scores a split with and without memory.

`rows` is the train batch size (the memory has one row per batch row): bind it as the converter's,
`RecurrentMemory.rows = %BATCH_SIZE`. Micro-batches and chunked logits are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gin
import jax
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec

from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.registry import TRANSFORMER_XL, family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.transformer_xl import MEMORY_AXES, empty_memory
from ptmjax.training.extra_state import ParamsView

MEMORY = "memory"


@dataclasses.dataclass(frozen=True)
class MemoryState:
    """The ExtraState 'memory' of a Transformer-XL `config` over `rows` rows: {'hidden', 'filled'}."""

    config: Any
    rows: int
    name: str = MEMORY

    def abstract(self, view: ParamsView) -> Any:
        return jax.eval_shape(lambda: empty_memory(self.config, self.rows))

    def shardings(self, view: ParamsView) -> Any:
        def sharding(axes: tuple[str | None, ...]) -> NamedSharding:
            return NamedSharding(view.mesh, nn.logical_to_mesh_axes(axes, view.rules) or PartitionSpec())

        return {"hidden": sharding(MEMORY_AXES), "filled": sharding(("activation_batch",))}

    def init(self, params: Any, view: ParamsView) -> Any:
        return empty_memory(self.config, self.rows)

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        """Unchanged: the objective returns the memory after the step's batch."""
        return value


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RecurrentMemory:
    """The train step's loss with Transformer-XL's memory (see the module doc); `rows`: the train batch size."""

    rows: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"RecurrentMemory.rows={self.rows!r} must be the train batch size; bind "
                             "RecurrentMemory.rows = %BATCH_SIZE")

    def extra_state(self, model: nn.Module) -> tuple[MemoryState]:
        if family_of(model) is not TRANSFORMER_XL:
            raise ValueError(f"RecurrentMemory trains a Transformer-XL, got {type(model).__name__}; set "
                             "train.model = @TransformerXL()")
        return (MemoryState(model.config, self.rows),)

    def initial_params(self, params: Any, extra: Mapping[str, Any]) -> None:
        return None

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """The family's loss on the batch read after the memory, and the memory after it."""
        if loss_config.logits_chunk_size is not None:
            raise ValueError("RecurrentMemory computes whole logits; unset LossConfig.logits_chunk_size")
        train = rng is not None
        (logits, memory), variables = api.module.apply(
            {"params": params, **api.variables}, **api.model_inputs(batch), memory=extra[MEMORY],
            enable_dropout=train, rngs=api.rngs(rng, train), mutable=["losses"], method="with_memory",
        )
        return (*api.loss_terms(params, logits, variables, batch, loss_config), {MEMORY: memory})
