"""Starting a decode: a family's prompt run through the model into a fresh key/value cache.

A `Prefill` holds the logits of each row's first generated token, the
rows' `DecodeState` (the key/value cache and the inputs every call reads), and
`step(state, tokens, i)`: it feeds the i-th generated tokens [n] (i from 0)
and returns the logits of the next ones and the updated state.
The search algorithms (sampling.py, beam_search.py) know nothing else of the model.

- Encoder-decoders (T5, BART): the encoder runs once; its cross-attention keys
  and values are cached by the first decoder call, which feeds the decoder
  start token at slot 0; generated token i goes to slot i + 1.
- Decoder-only (GPT-2): the prompt of each row of 'decoder_input_tokens' [b, P]
  is where 'decoder_causal_attention' is 1, read bidirectionally (a prefix LM:
  seqio's PrefixLM rows as they are), else where 'decoder_segment_ids' > 0, read
  causally (right-padded prompts), else the whole row. Prompts are right-aligned
  in slots 0..P-1, so every row generates at slot P, P + 1, ... while each token
  keeps its own position (padding slots are masked, as Hugging Face's left
  padding does). The prompt is filled in one call, and only its last position
  goes through the output layer (the module's `hidden_states` and `logits`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.decoding.cache import DecodeState
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.layers.attention import CacheSlots

Array = jax.Array
Step = Callable[[Any, Array, Array], tuple[Array, Any]]


class Prefill(NamedTuple):
    """first_logits float32 [n, vocab], the state of n rows, and the step that continues them."""

    first_logits: Array
    state: DecodeState
    step: Step


def _empty_state(create: Callable[[Array], tuple[Array, DecodeState]], inputs: Any, cache_length: int) -> DecodeState:
    """`inputs` and zeros shaped like the cache that `create(tokens [b, cache_length])` creates."""
    rows = jax.tree.leaves(inputs)[0].shape[0]
    shapes = jax.eval_shape(lambda tokens: create(tokens)[1].kv, jnp.zeros((rows, cache_length), jnp.int32))
    return DecodeState(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), inputs)


def encoder_decoder_prefill(
    module: nn.Module, params: Any, batch: Mapping[str, Array], max_decode_length: int, ids: GenerationIds
) -> Prefill:
    """batch['encoder_input_tokens'] [b, s] -> the prefill of b rows (see the module docstring)."""
    if ids.decoder_start_token_id is None:
        raise ValueError(
            "GenerationIds.decoder_start_token_id is None; an encoder-decoder's decoder needs a first input "
            "(T5: 0, BART: 2)"
        )
    inputs = batch["encoder_input_tokens"]
    rows = inputs.shape[0]
    encoded = module.apply({"params": params}, inputs, method="encode")

    def decode(state: DecodeState, tokens: Array, index: Array | int, encoded: Array | None) -> tuple[Array, Any]:
        variables = {"params": params} if state.kv is None else {"params": params, "cache": state.kv}
        slots = CacheSlots(jnp.asarray(index, jnp.int32), max_decode_length)
        logits, updated = module.apply(
            variables, encoded, state.inputs, tokens, cache=slots, method="decode", mutable=["cache"]
        )
        return logits[:, -1], DecodeState(updated["cache"], state.inputs)

    state = _empty_state(
        lambda tokens: decode(DecodeState(None, inputs), tokens, 0, encoded), inputs, max_decode_length
    )
    start = jnp.full((rows, 1), ids.decoder_start_token_id, jnp.int32)
    first_logits, state = decode(state, start, 0, encoded)

    def step(state: DecodeState, tokens: Array, i: Array) -> tuple[Array, DecodeState]:
        return decode(state, tokens[:, None], i + 1, None)

    return Prefill(first_logits, state, step)


def decoder_only_prefill(
    module: nn.Module, params: Any, batch: Mapping[str, Array], max_decode_length: int, ids: GenerationIds
) -> Prefill:
    """batch['decoder_input_tokens'] [b, P] and the prompt's marks (see the module docstring)
    -> the prefill of b rows."""
    prompts = batch["decoder_input_tokens"]
    rows, prompt_length = prompts.shape
    bidirectional = "decoder_causal_attention" in batch
    marks = batch["decoder_causal_attention"] if bidirectional else batch.get("decoder_segment_ids")
    valid = jnp.ones_like(prompts, bool) if marks is None else marks > 0
    lengths = jnp.sum(valid, axis=1).astype(jnp.int32)  # [b]
    source = jnp.arange(prompt_length)[None] - (prompt_length - lengths)[:, None]  # [b, P]: prompt index of a slot
    in_prompt = source >= 0

    def right_aligned(field: Array, fill: int) -> Array:
        return jnp.where(in_prompt, jnp.take_along_axis(field, jnp.maximum(source, 0), axis=1), fill)

    tokens = right_aligned(prompts, ids.pad_token_id)
    cache_length = prompt_length + max_decode_length
    generated = jnp.ones((rows, max_decode_length), jnp.int32)
    inputs = {  # over the cache slots [b, cache length]
        "segment_ids": jnp.concatenate([in_prompt.astype(jnp.int32), generated], axis=1), "lengths": lengths,
    }
    if bidirectional:
        inputs["prefix"] = jnp.concatenate([in_prompt.astype(jnp.int32), 0 * generated], axis=1)

    def decode(state: DecodeState, tokens: Array, positions: Array, index: Array | int) -> tuple[Array, DecodeState]:
        variables = {"params": params} if state.kv is None else {"params": params, "cache": state.kv}
        slots = CacheSlots(jnp.asarray(index, jnp.int32), cache_length)
        fields = state.inputs
        hidden, updated = module.apply(
            variables, tokens, fields["segment_ids"], positions, fields.get("prefix"), cache=slots,
            method="hidden_states", mutable=["cache"],
        )
        logits = module.apply({"params": params}, hidden[:, -1:], method="logits")[:, 0]
        return logits, DecodeState(updated["cache"], fields)

    state = _empty_state(lambda tokens: decode(DecodeState(None, inputs), tokens, tokens, 0), inputs, cache_length)
    first_logits, state = decode(state, tokens, jnp.maximum(source, 0), 0)

    def step(state: DecodeState, tokens: Array, i: Array) -> tuple[Array, DecodeState]:
        positions = (state.inputs["lengths"] + i)[:, None]
        return decode(state, tokens[:, None], positions, prompt_length + i)

    return Prefill(first_logits, state, step)
