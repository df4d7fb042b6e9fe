"""Attention masks: boolean masks [batch, 1, q_len, k_len] (True = may attend), and `AttentionMask`,
the form in which models hand a mask to `MultiHeadAttention`.

Packing puts several examples in one row, marked by segment ids 1, 2, 3, ... (0 = padding); no
attention crosses segments. `pad_token_id` (0 by default; BART uses 1) is padding in encoder
inputs, and so, in unpacked rows, is the trailing run of 0s seqio pads with; decoder inputs start
with id 0 (the BOS of T5), so decoder padding is known only from segment ids, and without them
causality alone keeps real positions clean.

`AttentionMask` keeps a mask structured where it can be: segment ids of the queries and keys
(unpacked rows are segment 1, encoder padding segment 0), a causal flag, and an additive bias for
what is a real bias (T5's relative positions). That is what a flash-attention kernel takes
('pallas_tpu_flash'); 'xla' and 'cudnn' take an unpacked batch's mask as sequence lengths and a
causal flag (padding is read as each row's tail, where seqio and tokenizers put it), which spares
cuDNN a [batch, heads, q, k] bias and its gradient; `dense_bias` folds any mask into the one
additive bias that 'einsum' takes, and 'xla' and 'cudnn' for packed batches. Masks with no such
form (the prefix LM's bidirectional prefix, decoding caches, prefix tuning's prepended keys, the
permutation LM's streams) are a folded bias alone.

A sparse attention pattern (ptmjax/layers/attention_patterns.py) rides along as `pattern`, over the row's
query and key indices: the 'blockwise' kernel reads it tile by tile and 'splash' as its block-sparse mask, and
both skip the blocks it masks entirely; for every other kernel `for_kernel` folds it into the bias.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.batch_broadcast import broadcast_batch
from ptmjax.layers.common import DType

Array = jax.Array

NEG_INF = -1e10  # finite, so a fully masked row gives a uniform softmax instead of NaN


def pairwise_mask(query_valid: Array, key_valid: Array) -> Array:
    """query_valid [b, q], key_valid [b, k] (bool) -> [b, 1, q, k] where both are valid."""
    return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def segment_mask(query_segment_ids: Array, key_segment_ids: Array) -> Array:
    """[b, q], [b, k] -> [b, 1, q, k]: same nonzero segment."""
    same = query_segment_ids[:, :, None] == key_segment_ids[:, None, :]
    return (same & (query_segment_ids[:, :, None] > 0))[:, None]


def causal_mask(length: int) -> Array:
    """[1, 1, length, length]: key index <= query index."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


def prefix_lm_self_mask(
    length: int, causal_attention: Array | None = None, segment_ids: Array | None = None, batch: int = 1
) -> Array:
    """Decoder-only mask [b, 1, t, t]: causal, plus bidirectional inside a prefix, within a segment.

    causal_attention [b, t] (bool/int, as seqio's `decoder_causal_attention`)
    marks the prefix: a query and a key both inside it may attend in either
    direction. All ones gives a bidirectional model, None a causal one.
    """
    mask = jnp.broadcast_to(causal_mask(length), (batch, 1, length, length))
    if causal_attention is not None:
        prefix = causal_attention.astype(bool)
        mask = mask | pairwise_mask(prefix, prefix)
    if segment_ids is not None:
        mask = mask & segment_mask(segment_ids, segment_ids)
    return mask


def pattern_mask(pattern: AttentionPattern, num_queries: int, num_keys: int) -> Array:
    """[1, 1, q, k]: where `pattern` lets query index i attend key index j."""
    return jnp.asarray(pattern.allowed(jnp.arange(num_queries), jnp.arange(num_keys)))[None, None]


def mask_to_bias(mask: Array, dtype: DType = jnp.float32) -> Array:
    """Boolean mask -> additive bias: 0 where allowed, a large negative number elsewhere (in float16 half its
    lowest finite value, so that the bias plus a logit stays finite and a fully masked row gives no NaN)."""
    return jnp.where(mask, 0.0, max(NEG_INF, float(jnp.finfo(dtype).min) / 2)).astype(dtype)


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query attends to, and what is added to its logits.

    query_segment_ids [b, q], key_segment_ids [b, k] (int): a query attends the keys of its own
      segment, and none if that is 0 (padding); None: every key (`bias` alone masks).
    causal: also only the keys at or before the query's index (self-attention; set with segment ids).
    bias: added to the logits, broadcastable to [b, heads, q, k]: T5's relative-position bias, or a
      mask with no structured form folded by `mask_to_bias`; None: nothing.
    unpacked: the segment ids only mark padding (1: a token, 0: padding), expected at each row's tail: the
      kernels that read it as sequence lengths ('xla', 'cudnn') take a padding id before a row's last
      token for a token.
    pattern: a sparse attention pattern over the query and key indices, ANDed with the rest (set with
      segment ids); None: none.
    """

    bias: Array | None = None
    query_segment_ids: Array | None = None
    key_segment_ids: Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    unpacked: bool = flax.struct.field(pytree_node=False, default=False)
    pattern: AttentionPattern | None = flax.struct.field(pytree_node=False, default=None)

    def dense_bias(self, dtype: DType) -> Array | None:
        """The mask folded into one additive bias [b|1, heads|1, q, k] (None: no mask, no bias)."""
        if self.query_segment_ids is None:
            return self.bias
        mask = segment_mask(self.query_segment_ids, self.key_segment_ids)
        if self.causal:
            mask = causal_mask(mask.shape[-1]) & mask
        if self.pattern is not None:
            mask = mask & pattern_mask(self.pattern, *mask.shape[2:])
        return _plus(self.bias, mask_to_bias(mask, dtype))

    def with_pattern(self, pattern: AttentionPattern, num_queries: int, num_keys: int, dtype: DType) -> AttentionMask:
        """This mask ANDed with `pattern` over the query and key indices: carried as `pattern` where segment ids
        structure the mask (a kernel may read it), else folded into the bias."""
        if self.query_segment_ids is not None:
            return self.replace(pattern=pattern)
        allowed = pattern_mask(pattern, num_queries, num_keys)
        bias = mask_to_bias(allowed, dtype) if self.bias is None else jnp.where(allowed, self.bias, mask_to_bias(
            False, dtype))
        return self.replace(bias=bias)

    def sequence_lengths(self) -> tuple[Array, Array]:
        """int32 [b] each: the queries' and the keys' lengths up to each row's last nonzero segment id (of an
        `unpacked` mask, whose padding is what follows that)."""
        ids = (self.query_segment_ids, self.key_segment_ids)
        return tuple(jnp.max(jnp.where(segments > 0, jnp.arange(1, segments.shape[1] + 1), 0), axis=1).astype(jnp.int32)
                     for segments in ids)

    def for_kernel(self, kernel: str, dtype: DType) -> AttentionMask:
        """The mask as `kernel` reads it: this one for 'pallas_tpu_flash', 'blockwise', 'splash' and 'performer', and
        for 'xla' and 'cudnn' if `unpacked`; else `dense_bias`, folded once where a stack's layers share it."""
        if self.pattern is not None and kernel not in ("blockwise", "splash"):  # the others take it as a bias
            sizes = (self.query_segment_ids.shape[1], self.key_segment_ids.shape[1])
            pattern_bias = mask_to_bias(pattern_mask(self.pattern, *sizes), dtype)
            return self.replace(bias=_plus(self.bias, pattern_bias), pattern=None).for_kernel(kernel, dtype)
        structured = kernel in ("pallas_tpu_flash", "blockwise", "splash", "performer") or (
            self.unpacked and kernel in ("xla", "cudnn"))
        return self if structured else AttentionMask(self.dense_bias(dtype))


def _plus(bias: Array | None, folded: Array) -> Array:
    """`folded` (a mask's bias [b|1, 1, q, k]) added to `bias` (None: nothing) broadcast over its batch."""
    return folded if bias is None else broadcast_batch(bias, folded.shape[0]) + folded


def encoder_attention_mask(
    tokens: Array, segment_ids: Array | None = None, pad_token_id: int = 0, bias: Array | None = None
) -> AttentionMask:
    """Bidirectional self-attention among the tokens != pad_token_id of a segment, plus `bias`."""
    ids = _unpadded_segments(tokens, segment_ids, pad_token_id)
    return AttentionMask(bias, ids, ids, unpacked=segment_ids is None)


def decoder_attention_mask(tokens: Array, segment_ids: Array | None = None, bias: Array | None = None) -> AttentionMask:
    """Causal self-attention within a segment (padding masked only by segment ids), plus `bias`."""
    ids = _segments(tokens, segment_ids)
    return AttentionMask(bias, ids, ids, causal=True, unpacked=segment_ids is None)


def cross_attention_mask(
    decoder_tokens: Array,
    encoder_tokens: Array,
    decoder_segment_ids: Array | None = None,
    encoder_segment_ids: Array | None = None,
    pad_token_id: int = 0,
) -> AttentionMask:
    """Decoder-to-encoder attention: to the encoder tokens != pad_token_id of the query's segment."""
    if (decoder_segment_ids is None) != (encoder_segment_ids is None):
        raise ValueError(
            "cross_attention_mask needs both decoder_segment_ids and encoder_segment_ids (packed data) or neither; "
            f"got decoder_segment_ids={'set' if decoder_segment_ids is not None else None}, "
            f"encoder_segment_ids={'set' if encoder_segment_ids is not None else None}."
        )
    query_ids = _segments(decoder_tokens, decoder_segment_ids)
    key_ids = _unpadded_segments(encoder_tokens, encoder_segment_ids, pad_token_id)
    return AttentionMask(None, query_ids, key_ids, unpacked=decoder_segment_ids is None)


def _segments(tokens: Array, segment_ids: Array | None) -> Array:
    """[b, l]: the packing's segment ids, or 1 everywhere in an unpacked row."""
    return jnp.ones_like(tokens) if segment_ids is None else segment_ids


def _unpadded_segments(tokens: Array, segment_ids: Array | None, pad_token_id: int) -> Array:
    """[b, l]: `_segments`, with 0 (padding) where tokens == pad_token_id, and, in rows without segment ids, in
    the trailing run of 0s that seqio's feature converters pad with whatever the model's pad id (Hugging Face
    BART's and RoBERTa's 1, whose id 0 `<s>` is a real token at the start of a row)."""
    padding = tokens == pad_token_id
    if segment_ids is None and pad_token_id != 0:
        padding |= jnp.cumsum((tokens != 0)[:, ::-1], axis=1)[:, ::-1] == 0
    return jnp.where(padding, 0, _segments(tokens, segment_ids))
