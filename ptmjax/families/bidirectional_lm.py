"""ELMo's family: forward and backward language models over one row (ptmjax/models/elmo.py), the loss that sums
their mean NLLs, and the layers the probing tools read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.families.family import ConverterName, Family, Kind, ProbedStack, token_inputs
from ptmjax.families.losses import LossTerms, Stats
from ptmjax.families.token_loss import LossConfig, argmax_hits, token_cross_entropy

Array = jax.Array
DIRECTIONS = ("forward", "backward")


def bidirectional_lm_loss(outputs: Any, batch: Mapping[str, Array], loss_config: LossConfig) -> LossTerms:
    """Both directions' token cross-entropies summed, counted by the forward predictions: a row of n words has
    n - 1 of each, so the optimised 'loss' is the forward mean NLL plus the backward one. 'forward_nll' and
    'backward_nll' (without z-loss) are each direction's mean, reported with their perplexities; 'accuracy' is
    over the predictions of both.

    outputs: `.forward_logits`, `.backward_logits` [b, s, V]; the batch gives '{forward,backward}_{targets,weights}'.
    """
    sums, total, z_total, hits = {}, 0.0, 0.0, 0.0
    for name in DIRECTIONS:
        logits, targets = getattr(outputs, f"{name}_logits"), batch[f"{name}_targets"]
        weights = batch[f"{name}_weights"].astype(jnp.float32)
        loss, z = token_cross_entropy(logits, targets, loss_config.z_loss, loss_config.label_smoothing)
        total, z_total = total + jnp.sum(loss * weights), z_total + jnp.sum(z * weights)
        hits = hits + jnp.sum(argmax_hits(logits, targets) * weights)
        sums[f"{name}_nll"] = (jnp.sum((loss - z) * weights), jnp.sum(weights))
    count = sums["forward_nll"][1]
    stats = Stats.of(token_loss=(total, count), z_loss=(z_total, count),
                     accuracy=(hits, count + sums["backward_nll"][1]), **sums)
    return LossTerms(total, jnp.zeros((), jnp.float32), stats)


def elmo_stack(module: nn.Module) -> ProbedStack:
    """The character encoder's output and each LSTM layer's, as `Elmo.layer_representations` returns them."""
    return ProbedStack("layer_representations", "input_tokens", (), 0, characters_field="input_chars")


def bidirectional_lm_family(module: nn.Module) -> Family:
    """ELMo's record: its rows (BidirectionalLmFeatureConverter), its loss, scored by the forward LM."""
    return Family(
        Kind.ENCODER, ConverterName("ptmjax.data.bidirectional_lm_converter", "BidirectionalLmFeatureConverter"),
        {**token_inputs("input_tokens"),
         "input_chars": jax.ShapeDtypeStruct((1, 1, module.config.max_characters), jnp.int32)},
        ("forward_targets", "forward_weights", "backward_targets", "backward_weights"), "forward_targets",
        "forward_weights", bidirectional_lm_loss, target_logits=lambda outputs: outputs.forward_logits,
        probed_stack=elmo_stack,
    )
