"""attention_kernel='blockwise': large attention one example and query block at a time, for XLA:CPU.

The einsum reference builds the logits and probabilities [b, heads, q, k] of the whole batch: each pass
of its softmax streams them through memory, and the backward pass reads the probabilities back. Here a
loop over the batch takes a few whole examples, or one example's query blocks one after another, so
that a step's logits stay in the caches (BLOCK_BYTES), as in flash attention: the forward pass keeps
each query's logit peak and softmax denominator [b, heads, q] in place of the probabilities, and the
backward pass (this module's VJP) recomputes them, transposed, as [heads, k, block]. That makes every
product of the backward pass one that XLA:CPU gives its matmul library without a transposed operand
(dV = P^T dO, dK = dS^T Q, and dQ as (K^T dS^T)^T), where the einsum path's backward pass runs some in
Eigen's slower loops. Where the batch's logits are small enough for the last-level cache (below
LOOP_BYTES), the einsum path was faster and MultiHeadAttention takes it (`loop_pays`). Measured on a
2-core CPU, forward and backward of one layer (docs/performance_log.md): T5-small's encoder attention
(batch 8, 8 heads, 512 positions, its bias) 112 ms against the einsum path's 144 ms and PyTorch's fused
CPU kernel's 120 ms; GPT-2 small's (12 heads, causal) 120-136 against 221-232 ms.

Masks. Segment ids and the causal flag are applied block by block (no [b, 1, q, k] mask is built); a
causal block skips the keys after its last query. A query that may attend nothing (padding) then
averages its block's keys where the einsum path averages all: outputs at padding positions may differ,
those at real positions (and so every loss and gradient) do not. The bias (T5's relative positions, or
a folded mask) is sliced per step, and its gradient summed over the examples in the loop when the
batch shares it. Computes in float32; no dropout on the probabilities.

Sparse patterns. With a pattern on the mask (ptmjax/layers/attention_patterns.py) the query blocks are tiles
of PATTERN_TILE and each attends only its live key tiles (`live_tiles`, static given the lengths), gathered
from their runs; the others are never read, so the work falls with the live fraction (a causal sliding window
of 128 over 1,024 positions: 15 of the causal triangle's 36 tiles, 0.417 of its FLOPs by XLA's cost analysis).

Sharding. The loop runs over the batch, which is for one device (a CPU): under a mesh that shards the
batch the results are the same, but nothing is gained.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.layers.attention_mask import NEG_INF, AttentionMask
from ptmjax.layers.attention_patterns import AttentionPattern, live_tiles
from ptmjax.layers.precision import BFLOAT16, PLAIN

Array = jax.Array

# The float32 logits [group, heads, q block, k] of one step of the loop: at most the two L2 caches of the 2-core Xeon
# it was tuned on (2 MiB each; query blocks of 512, 256 and 128 did equally well for T5-small, 128 best for GPT-2).
BLOCK_BYTES = 4 * 2**20
# The batch's float32 logits from which the loop pays: below, where the last-level cache holds them, the einsum
# path's whole-batch products were faster (T5-small's decoder: 3.3 and 15 MiB, 7.3 against 9.9 ms and 33 against
# 41 ms forward and backward; 32 MiB: 56 against 70 ms).
LOOP_BYTES = 32 * 2**20
# The query and key tiles of a sparse pattern's plan: a key tile that the pattern masks for every query of a query
# tile is never read (`live_tiles`), so the work falls with the fraction of live tiles.
PATTERN_TILE = 128
# The precision policies (ptmjax/layers/precision.py) it takes: it computes every product in float32.
POLICIES = {PLAIN: "every product in float32", BFLOAT16: "every product in float32, the operands cast up and the "
            "context cast back to bfloat16"}


def loop_pays(batch: int, heads: int, num_queries: int, num_keys: int) -> bool:
    """Whether attention over [batch, heads, num_queries, num_keys] logits is faster here than by the einsum path."""
    return 4 * batch * heads * num_queries * num_keys >= LOOP_BYTES


def blockwise_attention(query: Array, key: Array, value: Array, mask: AttentionMask) -> Array:
    """query [b, h, q, d], key and value [b, h, k, d] -> context [b, h, q, d] (logits not scaled), attending as
    `mask` says (its segment ids, causal flag and bias broadcastable to [b, h, q, k])."""
    (batch, heads, num_queries, _), num_keys = query.shape, key.shape[2]
    if mask.causal and num_queries != num_keys:
        raise ValueError(f"a causal mask needs as many queries as keys, got {num_queries} and {num_keys}")
    bias = mask.bias
    if bias is not None:
        bias = jnp.asarray(bias, jnp.float32)
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        if bias.shape[0] not in (1, batch) or bias.shape[1] not in (1, heads):
            raise ValueError(
                f"the attention bias {mask.bias.shape} does not broadcast to {(batch, heads, num_queries, num_keys)}"
            )
        bias = jnp.broadcast_to(bias, bias.shape[:2] + (num_queries, num_keys))
    if mask.pattern is None:
        plan = _Plan.of(batch, heads, num_queries, num_keys, mask.causal)
    else:
        plan = _Plan.sparse(batch, heads, num_queries, num_keys, mask.causal, mask.pattern)
    segments = None if mask.query_segment_ids is None else (mask.query_segment_ids, mask.key_segment_ids)
    context = _attention(plan, *(x.astype(jnp.float32) for x in (query, key, value)), bias, segments)
    return context.astype(query.dtype)


def _largest_divisor(n: int, most: int) -> int:
    return max(size for size in range(1, max(1, min(most, n)) + 1) if n % size == 0)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What one step of the loop takes: `group` examples, whose query blocks [start, end) (`spans`) it runs in
    turn, each attending the keys in its `key_ranges` ([lo, hi) runs: a causal block none after its last query,
    a sparse pattern's only its live tiles), masked by causality and `pattern` where `causal` and `pattern` say."""

    group: int
    spans: tuple[tuple[int, int], ...]
    causal: bool
    key_ranges: tuple[tuple[tuple[int, int], ...], ...] = ()
    pattern: AttentionPattern | None = None

    @classmethod
    def of(cls, batch: int, heads: int, num_queries: int, num_keys: int, causal: bool) -> _Plan:
        """Whole examples, as many as fit BLOCK_BYTES, or else one example in query blocks that do."""
        rows = BLOCK_BYTES // (4 * heads * num_keys)  # the query rows whose logits fit
        group = _largest_divisor(batch, rows // num_queries) if rows >= num_queries else 1
        size = num_queries if rows >= num_queries else _largest_divisor(num_queries, rows)
        spans = tuple((start, start + size) for start in range(0, num_queries, size))
        key_ranges = tuple(((0, end if causal else num_keys),) for _, end in spans)
        return cls(group, spans, causal, key_ranges)

    @classmethod
    def sparse(
        cls, batch: int, heads: int, num_queries: int, num_keys: int, causal: bool, pattern: AttentionPattern
    ) -> _Plan:
        """Query blocks of PATTERN_TILE, each attending only the key tiles that `pattern` (and causality) leave
        live (`live_tiles`: static, given the lengths); a block with none takes its first key, masked."""
        group = cls.of(batch, heads, num_queries, num_keys, causal).group
        spans = tuple((start, min(start + PATTERN_TILE, num_queries)) for start in range(0, num_queries, PATTERN_TILE))
        key_ranges = []
        for (start, end), tiles in zip(spans, live_tiles(pattern, num_queries, num_keys, PATTERN_TILE, causal),
                                       strict=True):
            last = end if causal else num_keys
            runs = _runs([(k * PATTERN_TILE, min((k + 1) * PATTERN_TILE, last)) for k in tiles])
            key_ranges.append(runs or ((start, start + 1),))
        return cls(group, spans, causal, tuple(key_ranges), pattern)

    def mask_bias(self, segments, span: int, transposed: bool = False) -> Array | float:
        """The mask of query block `span` over its keys as an additive bias [group, 1, q block, keys], or [.., keys,
        q block] (0.0: none).

        The masks of `segment_mask` and `causal_mask` (attention_mask.py), built here in the block's orientation:
        those functions' masks sliced and transposed made GPT-2's causal attention about 5% slower (131 against
        138 ms forward and backward)."""
        if segments is None and not self.causal and self.pattern is None:
            return 0.0
        (start, end), ranges = self.spans[span], self.key_ranges[span]
        query_positions = np.arange(start, end)
        key_positions = np.concatenate([np.arange(lo, hi) for lo, hi in ranges])
        allowed = np.ones((end - start, len(key_positions)), bool)
        if self.causal:
            allowed &= query_positions[:, None] >= key_positions[None, :]
        if self.pattern is not None:
            allowed &= np.asarray(self.pattern.allowed(query_positions, key_positions))
        allowed = jnp.asarray(allowed.T if transposed else allowed)
        if segments is not None:
            queries, keys = (slice(None), slice(None), None), (slice(None), None, slice(None))
            if transposed:
                queries, keys = keys, queries
            query_ids, key_ids = segments[0][:, start:end], _gather(segments[1], ranges, 1)
            allowed = allowed & (query_ids[queries] == key_ids[keys]) & (query_ids[queries] > 0)
        return jnp.where(allowed, 0.0, NEG_INF)[..., None, :, :]

    def grouped(self, x):
        """[b, ...] -> [b / group, group, ...] (None as it is)."""
        return None if x is None else x.reshape((x.shape[0] // self.group, self.group) + x.shape[1:])


def _runs(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted [lo, hi) ranges with adjacent ones merged (empty ones dropped)."""
    runs: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if hi <= lo:
            continue
        if runs and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return tuple(runs)


def _gather(x: Array, ranges: tuple[tuple[int, int], ...], axis: int) -> Array:
    """The positions of `ranges` along `axis` of x, in order."""
    pieces = [jax.lax.slice_in_dim(x, lo, hi, axis=axis) for lo, hi in ranges]
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis)


def _scatter(x: Array, ranges: tuple[tuple[int, int], ...], length: int, axis: int) -> Array:
    """The inverse of `_gather`: x's positions put back at `ranges` along `axis` of a zero array of `length`."""
    if ranges == ((0, length),):
        return x
    zeros = functools.partial(jnp.zeros, dtype=x.dtype)
    pieces, at, previous = [], 0, 0
    for lo, hi in ranges:
        pieces += [zeros(x.shape[:axis] + (lo - previous,) + x.shape[axis + 1:]),
                   jax.lax.slice_in_dim(x, at, at + hi - lo, axis=axis)]
        at, previous = at + hi - lo, hi
    pieces.append(zeros(x.shape[:axis] + (length - previous,) + x.shape[axis + 1:]))
    return jnp.concatenate(pieces, axis)


def _split_bias(plan: _Plan, bias: Array | None) -> tuple[Array | None, Array | None]:
    """The bias shared by the batch [1, h|1, q, k], and the grouped bias of each example (one is None)."""
    shared = bias is not None and bias.shape[0] == 1
    return (bias, None) if shared else (None, plan.grouped(bias))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan, query, key, value, bias, segments):
    return _forward(plan, query, key, value, bias, segments)[0]


def _forward(plan, query, key, value, bias, segments):
    shared_bias, grouped_bias = _split_bias(plan, bias)

    def step(inputs):
        q, k, v, example_bias, ids = inputs
        example_bias = shared_bias if example_bias is None else example_bias
        outputs, peaks, inverse_totals = [], [], []
        for span, ((start, end), ranges) in enumerate(zip(plan.spans, plan.key_ranges, strict=True)):
            logits = jnp.einsum("ghqd,ghkd->ghqk", q[:, :, start:end], _gather(k, ranges, 2))
            if example_bias is not None:
                logits = logits + _gather(example_bias[:, :, start:end], ranges, 3)
            logits = logits + plan.mask_bias(ids, span)
            peak = jnp.max(logits, -1, keepdims=True)
            unnormalized = jnp.exp(logits - peak)
            total = jnp.sum(unnormalized, -1, keepdims=True)
            outputs.append(jnp.einsum("ghqk,ghkd->ghqd", unnormalized, _gather(v, ranges, 2)) / total)
            peaks.append(peak[..., 0])
            inverse_totals.append(1.0 / total[..., 0])
        return tuple(jnp.concatenate(x, 2) for x in (outputs, peaks, inverse_totals))

    grouped = [plan.grouped(x) for x in (query, key, value)]
    ids = None if segments is None else tuple(plan.grouped(x) for x in segments)
    context, *row_stats = jax.lax.map(step, (*grouped, grouped_bias, ids))
    context, row_stats = context.reshape(query.shape), [x.reshape(query.shape[:3]) for x in row_stats]
    return context, (query, key, value, bias, segments, context, *row_stats)


def _backward(plan, residuals, d_context):
    query, key, value, bias, segments, context, peaks, inverse_totals = residuals
    num_keys = key.shape[2]
    shared_bias, grouped_bias = _split_bias(plan, bias)
    bias_t = None if shared_bias is None else jnp.swapaxes(shared_bias, 2, 3)  # [1, h|1, k, q]
    row_dots = jnp.sum(d_context * context, -1)  # [b, h, q]: sum_k P dP per query, as flash attention's D

    def step(d_shared_bias_t, inputs):
        q, k, v, d_out, peak, inverse_total, dots, example_bias, ids = inputs
        example_bias_t = bias_t if example_bias is None else jnp.swapaxes(example_bias, 2, 3)
        k_t = jax.lax.optimization_barrier(jnp.swapaxes(k, 2, 3))  # [g, h, d, k]: dQ^T = K^T dS^T, row-major
        d_q, d_k, d_v, d_bias_t = [], jnp.zeros_like(k), jnp.zeros_like(v), []
        for span, ((start, end), ranges) in enumerate(zip(plan.spans, plan.key_ranges, strict=True)):
            block = slice(start, end)
            logits_t = jnp.einsum("ghkd,ghqd->ghkq", _gather(k, ranges, 2), q[:, :, block])
            if bias is not None:
                logits_t = logits_t + _gather(example_bias_t[..., block], ranges, 2)
            logits_t = logits_t + plan.mask_bias(ids, span, transposed=True)
            probs_t = jnp.exp(logits_t - peak[:, :, None, block]) * inverse_total[:, :, None, block]  # [g, h, k, q]
            d_probs_t = jnp.einsum("ghkd,ghqd->ghkq", _gather(v, ranges, 2), d_out[:, :, block])
            d_logits_t = probs_t * (d_probs_t - dots[:, :, None, block])
            d_v_live = jnp.einsum("ghkq,ghqd->ghkd", probs_t, d_out[:, :, block])
            d_k_live = jnp.einsum("ghkq,ghqd->ghkd", d_logits_t, q[:, :, block])
            at = 0
            for lo, hi in ranges:
                d_v = d_v.at[:, :, lo:hi].add(d_v_live[:, :, at:at + hi - lo])
                d_k = d_k.at[:, :, lo:hi].add(d_k_live[:, :, at:at + hi - lo])
                at += hi - lo
            d_q_t = jax.lax.optimization_barrier(jnp.einsum("ghdk,ghkq->ghdq", _gather(k_t, ranges, 3), d_logits_t))
            d_q.append(jnp.swapaxes(d_q_t, 2, 3))
            if bias is not None:
                d_block = d_logits_t if bias.shape[1] > 1 else jnp.sum(d_logits_t, 1, keepdims=True)
                d_bias_t.append(_scatter(d_block, ranges, num_keys, 2))
        d_bias_t = jnp.concatenate(d_bias_t, 3) if d_bias_t else None
        d_q = jnp.concatenate(d_q, 2)
        if shared_bias is not None:
            return d_shared_bias_t + jnp.sum(d_bias_t, 0, keepdims=True), (d_q, d_k, d_v, None)
        return d_shared_bias_t, (d_q, d_k, d_v, d_bias_t)

    grouped = [plan.grouped(x) for x in (query, key, value, d_context, peaks, inverse_totals, row_dots)]
    ids = None if segments is None else tuple(plan.grouped(x) for x in segments)
    init = None if shared_bias is None else jnp.zeros_like(bias_t)
    d_shared_bias_t, (d_query, d_key, d_value, d_bias_t) = jax.lax.scan(step, init, (*grouped, grouped_bias, ids))
    d_inputs = [d.reshape(x.shape) for d, x in zip((d_query, d_key, d_value), (query, key, value), strict=True)]
    if bias is None:
        return (*d_inputs, None, None)
    d_bias_t = d_shared_bias_t if shared_bias is not None else d_bias_t.reshape(_transposed_shape(bias))
    return (*d_inputs, jnp.swapaxes(d_bias_t, 2, 3), None)


def _transposed_shape(bias: Array) -> tuple[int, ...]:
    """The shape of `bias` [b|1, h|1, q, k] transposed: [b|1, h|1, k, q]."""
    return bias.shape[:2] + bias.shape[:1:-1]


_attention.defvjp(_forward, _backward)
