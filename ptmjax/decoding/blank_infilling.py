"""GLM's blank-infilling decoding: one [MASK] of part A regenerated as a span of part B, with the key/value cache.

The batch gives a context per row and the blank to fill:
  decoder_input_tokens [b, P]: part A (and any spans of part B already filled), right-padded;
  decoder_causal_attention [b, P]: 1 on part A (read bidirectionally), 0 elsewhere;
  decoder_positions, decoder_block_positions [b, P]: the context's 2D positions (default: part A's, 0, 1, ...
    and 0);
  decoder_segment_ids [b, P]: 1 on the context, 0 on padding (default: part A's marks);
  blank_positions [b]: the part-A position of the [MASK] to fill.
The context fills cache slots 0..P-1 (padding masked) together with [START] (`GenerationIds.decoder_start_token_id`)
at slot P, whose logits give the first generated token; generated token i goes to slot P + 1 + i. Every token
of the span has position (blank position, k): [START] k = 1, generated token i k = i + 2, as in training.
Decoding ends at [END] (`GenerationIds.eos_token_id`); a second blank is filled by appending the first
span ([START] + its tokens, with their positions) to the context, as `fill_blanks` (fill_blanks.py) does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.decoding.cache import DecodeState
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.prefill import Prefill, _empty_state
from ptmjax.layers.attention import CacheSlots

Array = jax.Array


def blank_context(batch: Mapping[str, Array]) -> dict[str, Array]:
    """The context's fields [b, P] with their defaults filled in (see the module docstring)."""
    missing = [name for name in ("decoder_input_tokens", "decoder_causal_attention", "blank_positions")
               if name not in batch]
    if missing:
        raise ValueError(
            f"blank infilling needs batch fields {missing} (got {sorted(batch)}): part A's tokens and marks and "
            "the [MASK] to fill; ptmjax.decoding.fill_blanks builds them from a part A"
        )
    tokens = batch["decoder_input_tokens"]
    part_a = batch["decoder_causal_attention"].astype(jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return {
        "tokens": tokens, "part_a": part_a, "segment_ids": batch.get("decoder_segment_ids", part_a),
        "positions": batch.get("decoder_positions", positions),
        "block_positions": batch.get("decoder_block_positions", jnp.zeros_like(tokens)),
    }


def blank_infilling_prefill(
    module: nn.Module, params: Any, batch: Mapping[str, Array], max_decode_length: int, ids: GenerationIds
) -> Prefill:
    """The prefill of a blank per row (see the module docstring)."""
    if ids.decoder_start_token_id is None:
        raise ValueError("GenerationIds.decoder_start_token_id is None; blank infilling starts each span from "
                         "[START] (ptmjax.objectives.blank_infilling.blank_ids(vocab_size).start)")
    context = blank_context(batch)
    rows, context_length = context["tokens"].shape
    cache_length = context_length + 1 + max_decode_length
    span = jnp.ones((rows, 1 + max_decode_length), jnp.int32)
    inputs = {  # over the cache slots [b, cache length], and each row's blank
        "segment_ids": jnp.concatenate([context["segment_ids"].astype(jnp.int32), span], axis=1),
        "prefix": jnp.concatenate([context["part_a"], 0 * span], axis=1),
        "blank_positions": batch["blank_positions"].astype(jnp.int32),
    }

    def decode(state: DecodeState, tokens: Array, positions: Array, blocks: Array, index: Array | int):
        variables = {"params": params} if state.kv is None else {"params": params, "cache": state.kv}
        hidden, updated = module.apply(
            variables, tokens, state.inputs["segment_ids"], positions, state.inputs["prefix"],
            cache=CacheSlots(jnp.asarray(index, jnp.int32), cache_length), decoder_block_positions=blocks,
            method="hidden_states", mutable=["cache"],
        )
        logits = module.apply({"params": params}, hidden[:, -1:], method="logits")[:, 0]
        return logits, DecodeState(updated["cache"], state.inputs)

    def span_fields(state_inputs: dict[str, Array], block_position: Array | int) -> tuple[Array, Array]:
        """The 2D positions [n, 1] of a span token (n: the state's rows, repeated for beams and samples)."""
        blanks = state_inputs["blank_positions"][:, None]
        return blanks, jnp.full(blanks.shape, block_position, jnp.int32)

    start = jnp.full((rows, 1), ids.decoder_start_token_id, jnp.int32)
    start_positions, start_blocks = span_fields(inputs, 1)
    first = (
        jnp.concatenate([context["tokens"], start], axis=1),
        jnp.concatenate([context["positions"], start_positions], axis=1),
        jnp.concatenate([context["block_positions"], start_blocks], axis=1),
    )
    state = _empty_state(lambda tokens: decode(DecodeState(None, inputs), tokens, tokens, tokens, 0), inputs,
                         cache_length)
    first_logits, state = decode(state, *first, 0)

    def step(state: DecodeState, tokens: Array, i: Array) -> tuple[Array, DecodeState]:
        return decode(state, tokens[:, None], *span_fields(state.inputs, i + 2), context_length + 1 + i)

    return Prefill(first_logits, state, step)
