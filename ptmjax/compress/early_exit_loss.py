"""Training an early-exit model's exits: `train.objective = @ExitLoss()` (ptmjax/training/objective.py).

The loss is a weighted sum over the L exits (ptmjax/compress/early_exit.py) of each exit's
cross-entropy, each the family's sequence-classification loss on that exit's logits (summed over
'example_weight', with LossConfig's z-loss and label smoothing), so the step's division by the
examples makes it a mean per example:

- `weighting='pabee'` (PABEE): exit j (1-based) weighs j / (1 + 2 + ... + L), the weighted average;
- `weighting='deebert'` (DeeBERT's second stage): the sum of exits 1 ... L - 1, the last (the model's
  head) left out. Its first stage is a plain fine-tuning run of the classifier (final layer and
  backbone); the second starts from it (`train.init_checkpoint`) and trains the exits alone,
  `train.trainable = [%ptmjax.compress.EXIT_PARAMS]`, so the backbone and head stay bit-identical.

Besides 'loss', the step logs 'accuracy' (the last exit's) and 'exit{j}_accuracy' for every exit.
The evaluation step scores the family's own loss, the last exit's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ptmjax.compress.early_exit import check_exit_model
from ptmjax.families import losses
from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.token_loss import LossConfig

WEIGHTINGS = ("pabee", "deebert")


def exit_weights(weighting: str, depth: int) -> jax.Array:
    """float32 [depth]: each exit's weight in the loss under `weighting`."""
    layers = jnp.arange(1, depth + 1, dtype=jnp.float32)
    if weighting == "pabee":
        return layers / jnp.sum(layers)
    return (layers < depth).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class ExitLoss:
    """The exits' weighted cross-entropy (see the module docstring); `weighting`: 'pabee' or 'deebert'."""

    weighting: str = "pabee"

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"ExitLoss.weighting={self.weighting!r} is unknown; use one of {list(WEIGHTINGS)}.")

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """The Objective: (the weighted summed loss, 0, stats, {})."""
        check_exit_model(api.module, "ExitLoss")
        train = rng is not None
        logits = api.module.apply(
            {"params": params}, **api.model_inputs(batch), enable_dropout=train, rngs=api.rngs(rng, train),
            method="exit_logits",
        )  # [L, b, C]
        terms = [losses.sequence_classification_loss(exit_logits, batch, loss_config) for exit_logits in logits]
        weights = exit_weights(self.weighting, len(terms))
        total = sum(w * t.token_loss for w, t in zip(weights, terms, strict=True))
        final = terms[-1].stats
        examples = final.counts["token_loss"]
        stats = Stats(sums={**final.sums, "token_loss": total}, counts=final.counts).merge(Stats.of(**{
            f"exit{j}_accuracy": (t.stats.sums["accuracy"], examples) for j, t in enumerate(terms, 1)
        }))
        return total, jnp.zeros((), jnp.float32), stats, {}
