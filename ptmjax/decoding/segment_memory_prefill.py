"""Transformer-XL's cached decoding: the prompt and the generated tokens read in segments after the memory, as
the original evaluates (Dai et al., 2019), with a cache bounded by memory_length + segment length - 1.

With memory M (`TransformerXLConfig.memory_length`) and segments of S (`decode_segment_length`), a row's
token p (0 = the first prompt token; segments start at 0, S, 2S, ...) reads each layer's inputs at positions
s * S - M ... p, s = p // S, its segment's start: its segment so far and the M positions before the segment,
which is what reading segment after segment with the memory the segments before leave gives (the model's
`with_memory`). Those are at most M + S - 1 earlier positions, so each layer keeps the keys and values of
each row's last M + S - 1 positions (`RecentKeys`), contiguous and oldest first, and a step masks the ones
before its segment's memory: the cache does not grow with the decode length.

The batch: 'decoder_input_tokens' [b, P], prompts right-padded ('decoder_segment_ids' > 0 marks them; without
it every row is all prompt); optionally a memory to read the prompts after, as `with_memory` leaves it:
'memory_hidden' [b, layers, M, embed] (row-major: it is split over the batch like the prompts) and
'memory_filled' int32 [b] (how many of the last slots hold states; default all if 'memory_hidden' is given).
The prompt runs in one call over [memory; prompt] under the mask above; its last token's logits are the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.decoding.cache import DecodeState
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.prefill import Prefill
from ptmjax.layers.attention_mask import mask_to_bias
from ptmjax.layers.xl_relative_attention import RecentKeys

Array = jax.Array


def visible_from(positions: Array, filled: Array, memory_length: int, segment_length: int) -> Array:
    """The first position each query at `positions` [b, q] reads (see the module doc): its segment's start
    minus the memory, and never a memory slot not filled (row's `filled` [b] slots before position 0)."""
    start = (positions // segment_length) * segment_length - memory_length
    return jnp.maximum(start, -filled[:, None])


def segment_memory_prefill(
    module: nn.Module, params: Any, batch: Mapping[str, Array], max_decode_length: int, ids: GenerationIds
) -> Prefill:
    """The prefill of b prompts of a Transformer-XL `module` (see the module doc)."""
    c = module.config
    memory_length, segment_length = c.memory_length, c.decode_segment_length
    slots = memory_length + segment_length - 1
    prompts = batch["decoder_input_tokens"]
    rows, prompt_length = prompts.shape
    marks = batch.get("decoder_segment_ids")
    lengths = jnp.full((rows,), prompt_length, jnp.int32) if marks is None else jnp.sum(marks > 0, axis=1)
    lengths = lengths.astype(jnp.int32)
    memory, filled = memory_fields(batch, c, rows)

    keys = jnp.arange(memory_length + prompt_length) - memory_length  # the position of each column
    queries = jnp.broadcast_to(jnp.arange(prompt_length), (rows, prompt_length))
    allowed = (keys[None, None] <= queries[..., None]) & (
        keys[None, None] >= visible_from(queries, filled, memory_length, segment_length)[..., None])
    bias = mask_to_bias(allowed[:, None], c.dtype)
    hidden, cache = module.apply({"params": params}, prompts, bias, RecentKeys(memory_length + lengths, slots), memory,
                                 method="decode", mutable=["cache"])
    last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)
    first_logits = module.apply({"params": params}, last, method="logits")[:, 0]

    def step(state: DecodeState, tokens: Array, i: Array) -> tuple[Array, DecodeState]:
        position = state.inputs["lengths"] + i  # [n]: the position of generated token i
        keys = position[:, None] - slots + jnp.arange(slots + 1)  # [n, slots + 1]: the cached ones, then its own
        first = visible_from(position[:, None], state.inputs["filled"], memory_length, segment_length)
        bias = mask_to_bias((keys >= first)[:, None, None], c.dtype)
        ends = jnp.full(position.shape, slots + 1, jnp.int32)
        hidden, cache = module.apply(
            {"params": params, "cache": state.kv}, tokens[:, None], bias, RecentKeys(ends, slots), method="decode",
            mutable=["cache"],
        )
        logits = module.apply({"params": params}, hidden, method="logits")[:, 0]
        return logits, DecodeState(cache["cache"], state.inputs)

    return Prefill(first_logits, DecodeState(cache["cache"], {"lengths": lengths, "filled": filled}), step)


def memory_fields(batch: Mapping[str, Array], config: Any, rows: int) -> tuple[Array, Array]:
    """The batch's memory as the model reads it: hidden [layers, b, M, embed] and filled int32 [b] (none: an
    empty memory)."""
    want = (rows, config.num_layers, config.memory_length, config.d_model)
    if "memory_hidden" not in batch:
        return jnp.zeros((want[1], rows, *want[2:]), jnp.float32), jnp.zeros((rows,), jnp.int32)
    hidden = batch["memory_hidden"]
    if tuple(hidden.shape) != want:
        raise ValueError(f"batch['memory_hidden'] of shape {tuple(hidden.shape)} does not fit: want {want} "
                         "[rows, layers, memory_length, d_model], the model's memory['hidden'] with rows first")
    filled = batch.get("memory_filled", jnp.full((rows,), config.memory_length, jnp.int32))
    return jnp.swapaxes(hidden, 0, 1), jnp.asarray(filled, jnp.int32)
