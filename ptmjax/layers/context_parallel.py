"""Context parallelism: self-attention over a sequence split into blocks along a mesh axis (the 'context' axis
that the rules map 'activation_length' to; ptmjax/layers/sequence_sharding.py), in one of two forms:

'all_gather' (MaxText's default): each device keeps its block of queries and gathers the keys and values of
  the whole row over the context axis (`jax.lax.all_gather`); its logits are [b, h, l/n, l].
'ring': the keys and values travel around the ring of the context axis (`jax.lax.ppermute`), one block per
  step, and each device folds every block into its queries' online softmax (running maximum, running sum,
  float32), so that a step's logits are [b, h, l/n, l/n]. Each step is rematerialised (`jax.checkpoint`):
  the backward pass keeps a step's inputs, recomputes its logits, and ppermute's transpose sends the key
  and value gradients back around the ring.

Masks (`ContextMask`): segment ids (packing, padding), causal, a prefix LM's bidirectional prefix, and T5's
relative-position bias, whose table is looked up per (query block, key block) from the blocks' positions
(`PositionBias.block`): no [b, h, l, l] tensor is built. A causal ring without a prefix skips (`lax.cond`)
the steps whose keys all follow the device's queries; the work is then unbalanced: device i of n computes
i + 1 blocks, and the step takes as long as the last device's n (MaxText's load-balanced order, blocks i
and 2n - 1 - i on device i, is not done here). A query that attends nothing (padding) averages the keys
of the blocks it computed where the einsum path averages all: outputs at padding positions may differ,
those at real positions (and every loss and gradient) do not.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ptmjax.layers.attention_mask import NEG_INF, AttentionMask, mask_to_bias, prefix_lm_self_mask, segment_mask
from ptmjax.layers.common import DType
from ptmjax.layers.precision import BFLOAT16, PLAIN
from ptmjax.layers.relative_position import PositionBias
from ptmjax.layers.sequence_sharding import context_axis

Array = jax.Array

CONTEXT_PARALLEL_FORMS = ("all_gather", "ring")
# The precision policies (ptmjax/layers/precision.py) it takes: it computes every product in float32.
POLICIES = {PLAIN: "every product in float32", BFLOAT16: "every product in float32, the operands cast up and the "
            "context cast back to bfloat16"}
_KV_AXES = ("activation_batch", "activation_heads", "activation_length", "activation_kv")  # [b, h, l, d]


@flax.struct.dataclass
class ContextMask(AttentionMask):
    """A self-attention mask that context-parallel attention reads block by block (query_segment_ids is
    key_segment_ids, [b, l]); elsewhere `for_kernel` folds it into the AttentionMask a kernel reads.

    prefix [b, l] (bool), with `causal`: a prefix LM's prefix, whose tokens also attend each other in
      either direction; position_bias: T5's relative-position bias as its table and positions (a dense
      `bias` is folded in off a context axis, refused on one).
    """

    prefix: Array | None = None
    position_bias: PositionBias | None = None

    @classmethod
    def of(cls, mask: AttentionMask, prefix: Array | None = None,
           position_bias: PositionBias | None = None) -> ContextMask:
        """The self-attention `mask` (segment ids, causal flag) with a prefix LM's `prefix` and T5's bias."""
        fields = {field.name: getattr(mask, field.name) for field in dataclasses.fields(AttentionMask)}
        return cls(**fields, prefix=None if prefix is None else prefix.astype(bool), position_bias=position_bias)

    def dense_bias(self, dtype: DType) -> Array | None:
        """The mask folded into one additive bias [b|1, heads|1, q, k]."""
        return self.folded(dtype).dense_bias(dtype)

    def folded(self, dtype: DType) -> AttentionMask:
        """The same mask as an AttentionMask: structured without a prefix, else one folded bias."""
        bias = self.bias
        if self.position_bias is not None:
            bias = self.position_bias.dense() if bias is None else bias + self.position_bias.dense()
        if self.prefix is None:
            fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(AttentionMask)}
            return AttentionMask(**{**fields, "bias": bias})
        ids = self.query_segment_ids
        folded = mask_to_bias(prefix_lm_self_mask(ids.shape[1], self.prefix, ids, ids.shape[0]), dtype)
        return AttentionMask(folded if bias is None else bias + folded)

    def for_kernel(self, kernel: str, dtype: DType) -> AttentionMask:
        """This mask under a context axis (each attention layer reads it as it runs), else `folded` as `kernel`
        reads it."""
        return self if context_axis() is not None else self.folded(dtype).for_kernel(kernel, dtype)


@flax.struct.dataclass
class _Tokens:
    """What attention reads of each token of a block of the row: index [1, l] (its place in the row),
    segment_ids [b, l], prefix [b, l] and positions [b|1, l] (T5's bias; None where unused)."""

    index: Array
    segment_ids: Array | None = None
    prefix: Array | None = None
    positions: Array | None = None


def context_parallel_attention(query: Array, key: Array, value: Array, mask: ContextMask, form: str) -> Array:
    """query, key and value [b, h, l, d] of self-attention -> context [b, h, l, d] (logits not scaled), the
    sequence split over the context axis, by `form` (one of CONTEXT_PARALLEL_FORMS)."""
    if form not in CONTEXT_PARALLEL_FORMS:
        raise ValueError(f"context_parallel_attention={form!r} is unknown; use one of {list(CONTEXT_PARALLEL_FORMS)}")
    if getattr(mask, "pattern", None) is not None:  # a sparse pattern (ptmjax/layers/attention_patterns.py)
        raise ValueError("context-parallel attention takes no sparse attention pattern; drop the pattern "
                         "(attention_pattern = None) or the context axis")
    if mask.bias is not None:
        raise ValueError("context-parallel attention reads no dense bias (it would be [b, h, l, l]); give T5's "
                         "relative-position bias as ContextMask.position_bias")
    axis = context_axis()
    batch_axes, head_axes, _, _ = nn.logical_to_mesh_axes(_KV_AXES)
    _check_divides(query.shape, (batch_axes, head_axes, axis))
    bias = mask.position_bias
    tokens = _Tokens(jnp.arange(query.shape[2])[None], mask.query_segment_ids, mask.prefix,
                     None if bias is None else bias.query_positions)
    table = None if bias is None else bias.replace(query_positions=None, key_positions=None)
    token_specs = jax.tree.map(lambda x: PartitionSpec(batch_axes if x.shape[0] > 1 else None, axis), tokens)
    table_specs = None if bias is None else table.replace(table=PartitionSpec(None, head_axes))
    qkv_spec = PartitionSpec(batch_axes, head_axes, axis, None)
    skip = mask.causal and mask.prefix is None
    local = (functools.partial(_ring, axis=axis, causal=mask.causal, skip_future=skip) if form == "ring"
             else functools.partial(_all_gather, axis=axis, causal=mask.causal))
    attend = jax.shard_map(local, in_specs=(qkv_spec,) * 3 + (token_specs, table_specs), out_specs=qkv_spec)
    context = attend(*(x.astype(jnp.float32) for x in (query, key, value)), tokens, table)
    return context.astype(query.dtype)


def _check_divides(shape: tuple[int, ...], axes: tuple) -> None:
    """Raise unless the batch, heads and length of `shape` [b, h, l, d] divide over their mesh axes."""
    mesh = jax.sharding.get_abstract_mesh()
    for name, size, names in zip(("batch", "heads", "sequence length"), shape, axes, strict=False):
        names = (names,) if isinstance(names, str) else tuple(names or ())
        ways = math.prod(mesh.shape[n] for n in names)
        if size % ways:
            raise ValueError(f"context-parallel attention: the {name} {size} does not divide over mesh axes {names} "
                             f"({ways} ways); pad it to a multiple of {ways} or change the mesh")


def _block_logits(query: Array, key: Array, queries: _Tokens, keys: _Tokens, causal: bool,
                  bias: PositionBias | None) -> Array:
    """float32 logits [b, h, q, k] of a block of queries against a block of keys, masked and biased."""
    logits = jnp.einsum("bhqd,bhkd->bhqk", query, key)
    if bias is not None:
        logits = logits + bias.block(queries.positions, keys.positions).astype(jnp.float32)
    allowed = jnp.ones((1, 1, 1), bool)
    if causal:
        allowed = queries.index[:, :, None] >= keys.index[:, None, :]
        if queries.prefix is not None:
            allowed = allowed | (queries.prefix[:, :, None] & keys.prefix[:, None, :])
    if queries.segment_ids is not None:
        allowed = allowed & segment_mask(queries.segment_ids, keys.segment_ids)[:, 0]
    return logits + jnp.where(allowed, 0.0, NEG_INF)[:, None]


def _varying(bias: PositionBias | None, like: Array) -> PositionBias | None:
    """The bias with its table marked as varying over the mesh axes `like` varies over (the blocks' bias does):
    the table's gradient is then summed over them (the custom VJP of its lookup needs that typed explicitly)."""
    if bias is None:
        return None
    missing = tuple(sorted(jax.typeof(like).manual_axis_type.varying - jax.typeof(bias.table).manual_axis_type.varying))
    return bias.replace(table=jax.lax.pcast(bias.table, missing, to="varying")) if missing else bias


def _all_gather(query, key, value, tokens, bias, *, axis, causal):
    """One device's queries [b, h, l/n, d] against the keys and values of the whole row, gathered."""
    bias = _varying(bias, query)
    key, value = (jax.lax.all_gather(x, axis, axis=2, tiled=True) for x in (key, value))
    keys = jax.tree.map(lambda x: jax.lax.all_gather(x, axis, axis=1, tiled=True), tokens)
    weights = jax.nn.softmax(_block_logits(query, key, tokens, keys, causal, bias), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, value)


def _ring(query, key, value, tokens, bias, *, axis, causal, skip_future):
    """One device's queries [b, h, l/n, d] against each block of keys and values as the ring brings it."""
    size, me = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
    bias = _varying(bias, query)
    ring = [(i, (i + 1) % size) for i in range(size)]
    fold = jax.checkpoint(functools.partial(_fold_block, causal=causal))
    state = (jnp.full(query.shape[:3], -jnp.inf), jnp.zeros(query.shape[:3]), jnp.zeros(query.shape))
    block = (key, value, tokens)
    for step in range(size):
        if step:
            block = jax.lax.ppermute(block, axis, ring)
        if skip_future and step:  # the block of device me - step: after me's queries when step > me
            state = jax.lax.cond(step <= me, fold, lambda s, *_: s, state, query, tokens, *block, bias)
        else:
            state = fold(state, query, tokens, *block, bias)
    _, total, accumulated = state
    return accumulated / total[..., None]


def _fold_block(state, query, queries, key, value, keys, bias, *, causal):
    """The online softmax's running (maximum, sum, weighted values) after one more block of keys."""
    peak, total, accumulated = state
    logits = _block_logits(query, key, queries, keys, causal, bias)
    new_peak = jnp.maximum(peak, jax.lax.stop_gradient(jnp.max(logits, axis=-1)))
    rescale = jnp.exp(peak - new_peak)
    weights = jnp.exp(logits - new_peak[..., None])
    return (new_peak, total * rescale + jnp.sum(weights, axis=-1),
            accumulated * rescale[..., None] + jnp.einsum("bhqk,bhkd->bhqd", weights, value))
