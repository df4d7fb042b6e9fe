"""T5 multi-head attention, and the key/value cache of decoding.

Masks come as an `AttentionMask` (ptmjax/layers/attention_mask.py): segment ids, a causal flag and
an additive bias, folded into one bias for 'einsum' (and for 'xla' and 'cudnn' when the batch is packed;
an unpacked one reaches them as sequence lengths).

Decoding keeps keys and values in the 'cache' collection (see `CacheSlots`
and `MultiHeadAttention`): self-attention writes each step's keys into a
fixed-size cache, cross-attention projects the encoder output once.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.attention_mask import AttentionMask, pairwise_mask
from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.blockwise_attention import POLICIES as BLOCKWISE_POLICIES
from ptmjax.layers.blockwise_attention import blockwise_attention, loop_pays
from ptmjax.layers.common import DType, target_platform
from ptmjax.layers.context_parallel import ContextMask, context_parallel_attention
from ptmjax.layers.dense import Dense
from ptmjax.layers.pallas_attention import POLICIES as PALLAS_POLICIES
from ptmjax.layers.pallas_attention import tpu_flash_attention
from ptmjax.layers.performer_attention import POLICIES as PERFORMER_POLICIES
from ptmjax.layers.performer_attention import favor_attention, layer_seed, random_projection
from ptmjax.layers.sequence_sharding import context_axis
from ptmjax.layers.softmax import softmax
from ptmjax.layers.splash_attention import POLICIES as SPLASH_POLICIES
from ptmjax.layers.splash_attention import splash_attention

Array = jax.Array

HEAD_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_kv")  # [b, l, heads, head_dim]
# Keys and values (and their caches) are head-major, [b, heads, l, head_dim]: XLA's batched matmuls read
# them without a transposed copy, which matters most when decoding reads the whole cache every step.
KV_AXES = ("activation_batch", "activation_heads", "activation_length", "activation_kv")
# How attention probabilities and context are computed: 'einsum' (the reference) spells them out;
# 'xla' and 'cudnn' call `jax.nn.dot_product_attention` with that implementation (cuDNN's fused
# flash attention needs a GPU and bfloat16 or float16 activations); 'pallas_tpu_flash' calls JAX's
# Pallas TPU flash-attention kernel (ptmjax/layers/pallas_attention.py: compiled on TPU, interpreted
# on CPU, slowly, for tests); 'blockwise' loops over the examples and query blocks where the batch's
# logits are large (ptmjax/layers/blockwise_attention.py: the fastest on a CPU) and is 'einsum' elsewhere;
# 'splash' calls JAX's Pallas TPU splash-attention kernel, whose block-sparse mask skips the blocks that
# causality and a sparse pattern mask (ptmjax/layers/splash_attention.py); 'performer' approximates softmax
# attention with random features, linear in the length (ptmjax/layers/performer_attention.py).
ATTENTION_KERNELS = ("einsum", "xla", "cudnn", "pallas_tpu_flash", "blockwise", "splash", "performer")
# The precision policies (ptmjax/layers/precision.py) each kernel takes, and how. 'einsum' runs its two
# products on the seam; the fused ones run their own.
KERNEL_POLICIES = {
    "einsum": {precision.PLAIN: "the seam's products", precision.BFLOAT16: "the seam's products"},
    "xla": {precision.PLAIN: "JAX's reference attention",
            precision.BFLOAT16: "JAX's reference attention, its logits accumulated in float32"},
    "cudnn": {precision.BFLOAT16: "cuDNN's fused flash attention, accumulated in float32 (GPU only)"},
    "pallas_tpu_flash": PALLAS_POLICIES,
    "blockwise": BLOCKWISE_POLICIES,
    "splash": SPLASH_POLICIES,
    "performer": PERFORMER_POLICIES,
}


@flax.struct.dataclass
class CacheSlots:
    """Where a decoding call's tokens go in the key/value cache.

    index: int32 scalar, the cache slot of the call's first token (its others follow).
    length: the cache's number of slots (static).
    window: None, or a ring buffer of `window` slots (static) for a sliding-window model: slot s is written in
      ring slot s % window, and a call attends the ring as it was before the call (the last `window` slots
      written) followed by its own tokens; the cache's memory then does not grow with `length`.
    """

    index: Array
    length: int = flax.struct.field(pytree_node=False)
    window: int | None = flax.struct.field(pytree_node=False, default=None)

    def query_slots(self, num_queries: int) -> Array:
        """int32 [num_queries]: the slots of the call's tokens."""
        return self.index + jnp.arange(num_queries, dtype=jnp.int32)

    def key_slots(self, num_queries: int = 0) -> Array:
        """int32 [length] (a ring: [window + num_queries]): the slot each attended key was written at (a ring slot
        not yet written: a negative one)."""
        if self.window is None:
            return jnp.arange(self.length, dtype=jnp.int32)
        last = self.index - 1
        written = last - (last - jnp.arange(self.window, dtype=jnp.int32)) % self.window
        return jnp.concatenate([written, self.query_slots(num_queries)])

    def causal_mask(self, num_queries: int) -> Array:
        """[1, 1, q, keys]: a query sees the written slots up to its own."""
        keys = self.key_slots(num_queries)
        return ((keys[None, :] <= self.query_slots(num_queries)[:, None]) & (keys >= 0)[None, :])[None, None]


def cached_self_mask(
    cache: CacheSlots, num_queries: int, key_segment_ids: Array | None = None, prefix: Array | None = None,
    pattern: AttentionPattern | None = None, query_positions: Array | None = None,
) -> Array:
    """Decoder-only mask [b|1, 1, q, keys] of a decoding call: causal over the cache slots, within
    the non-padding slots (key_segment_ids [b, length] > 0), bidirectional among the slots that
    `prefix` [b, length] marks (a prefix-LM prompt), and as `pattern` says over positions: the queries'
    `query_positions` [b, q], the keys' those of their slots (a row's positions are its slots shifted)."""
    mask = cache.causal_mask(num_queries)
    keys = jnp.maximum(cache.key_slots(num_queries), 0)  # the unwritten ring slots are masked above

    def at_keys(per_slot: Array) -> Array:  # [b, length] -> [b, keys]
        return per_slot if cache.window is None else jnp.take(per_slot, keys, axis=1)

    if prefix is not None:
        prefix = prefix.astype(bool)
        query_prefix = jax.lax.dynamic_slice_in_dim(prefix, cache.index, num_queries, axis=1)
        mask = mask | pairwise_mask(query_prefix, at_keys(prefix))
    if key_segment_ids is not None:
        mask = mask & (at_keys(key_segment_ids) > 0)[:, None, None, :]
    if pattern is not None:
        shift = cache.query_slots(num_queries)[-1] - query_positions[:, -1]  # [b]: slot minus position
        key_positions = cache.key_slots(num_queries)[None, :] - shift[:, None]
        mask = mask & jax.vmap(pattern.allowed)(query_positions, key_positions)[:, None]
    return mask


class MultiHeadAttention(nn.Module):
    """Multi-head attention; by default T5's: no biases, no 1/sqrt(head_dim) scaling (folded into the query init).

    `use_bias=True, scale_logits=True` gives BERT/GPT-2 attention: biased
    projections and logits divided by sqrt(head_dim).
    Attention probabilities are sown into 'intermediates' as `attention_weights`
    [b, heads, q, k]; apply with `mutable=['intermediates']` to read them.
    Self-attention given a `ContextMask` under a mesh whose rules split 'activation_length' runs
    context-parallel attention in the form `context_parallel` names ('all_gather' or 'ring';
    ptmjax/layers/context_parallel.py) whatever `attention_kernel`, with no dropout on its probabilities.
    `attention_kernel` (one of ATTENTION_KERNELS): other than 'einsum', `jax.nn.dot_product_attention`
    ('xla', 'cudnn') or the Pallas TPU flash-attention kernel ('pallas_tpu_flash') computes the
    context: the Pallas kernel reads `mask`'s segment ids, causal flag and bias, the others its
    `dense_bias`; they sow no weights and have no dropout on the probabilities, so they refuse
    `enable_dropout` with `dropout_rate` > 0.
    `attention_pattern` (ptmjax/layers/attention_patterns.py): a sparse pattern ANDed with `mask` over the
    query and key indices, read tile by tile by 'blockwise' and as splash's block-sparse mask by 'splash' (both
    skip the blocks it masks entirely) and as a bias by the others ('performer', with `performer_features`
    random features, refuses it); not applied with a cache, whose mask
    (`cached_self_mask`) takes it over positions.

    Decoding (`cache` given, apply with `mutable=['cache']`): self-attention
    writes the call's keys and values at `cache.index` of a [b, heads,
    cache.length, head_dim] cache and attends to every slot (`mask`, a bias [.., q,
    cache.length], masks the unwritten ones); `cross_attention=True` projects
    `inputs_kv` (the encoder output) once into the cache, and later calls pass
    `inputs_kv=None` to read it. The first call creates the cache without
    writing (run it under `jax.eval_shape` with `cache.length` queries).
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    use_bias: bool = False
    scale_logits: bool = False
    cross_attention: bool = False
    attention_kernel: str = "einsum"
    performer_features: int = 256
    attention_pattern: AttentionPattern | None = None
    context_parallel: str = "all_gather"
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(
        self, inputs_q: Array, inputs_kv: Array | None, mask: AttentionMask | Array | None = None,
        enable_dropout: bool = False, cache: CacheSlots | None = None,
    ) -> Array:
        """inputs_q [b, q, embed], inputs_kv [b, k, embed] -> [b, q, embed], attending as `mask` says: an
        AttentionMask, or an additive bias alone, broadcastable to [b, heads, q, k]."""
        embed = inputs_q.shape[-1]
        proj = {
            "features": (self.num_heads, self.head_dim),
            "kernel_axes": ("embed", "heads", "kv"),
            "kernel_distribution": "normal",
            "use_bias": self.use_bias,
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
        }
        query_scale = 1.0 if self.scale_logits else 1.0 / self.head_dim
        query = Dense(name="query", kernel_scale=query_scale, **proj)(inputs_q)  # [b, q, h, d]
        query = nn.with_logical_constraint(query, HEAD_AXES)
        if cache is not None and inputs_kv is None:  # a later decoding step of cross-attention
            key, value = self.get_variable("cache", "cross_key"), self.get_variable("cache", "cross_value")
        else:
            key, value = (
                nn.with_logical_constraint(jnp.swapaxes(Dense(name=name, **proj)(inputs_kv), 1, 2), KV_AXES)
                for name in ("key", "value")
            )  # [b, h, k, d]
            if cache is not None and self.cross_attention:
                self.put_variable("cache", "cross_key", key)
                self.put_variable("cache", "cross_value", value)
            elif cache is not None:
                key, value = self._write_to_cache(key, value, cache)  # [b, h, cache length, d]

        mask = mask if isinstance(mask, AttentionMask) else AttentionMask(mask)
        if self.attention_pattern is not None and cache is None:
            mask = mask.with_pattern(self.attention_pattern, query.shape[1], key.shape[2], self.dtype)
        key, value, mask = self.attended(key, value, mask)
        if mask.pattern is not None:  # 'blockwise' and 'splash' read a sparse pattern as it is; the others as a bias
            mask = mask.for_kernel(self.attention_kernel, self.dtype)
        if self.scale_logits:
            query = query * jnp.asarray(self.head_dim**-0.5, query.dtype)
        if self.attention_kernel != "einsum" and not self.is_initializing():
            self._check_no_dropout(enable_dropout)
        # Every kernel initialises through the einsum path: init needs only the shapes, so a host without the
        # kernel's device can initialise (cuDNN needs a GPU), and on CPU the Pallas kernel's interpret mode
        # (callbacks that run JAX) can deadlock against flax's eager parameter init.
        whole = self.attention_kernel == "blockwise" and mask.pattern is None and not loop_pays(
            *key.shape[:2], query.shape[1], key.shape[2])
        if isinstance(mask, ContextMask) and (self.is_initializing() or context_axis() is None):
            mask = mask.folded(self.dtype).for_kernel(self.attention_kernel, self.dtype)
        if isinstance(mask, ContextMask):  # self-attention over a sequence split along the context axis
            context = self._context_parallel_context(query, key, value, mask, enable_dropout)
        elif self.attention_kernel == "einsum" or self.is_initializing() or whole:
            logits = precision.einsum("bqhd,bhkd->bhqk", query, key)  # [b, h, q, k]
            bias = mask.dense_bias(self.dtype)
            if bias is not None:
                logits = logits + jnp.asarray(bias, logits.dtype)
            weights = self.probabilities(softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype))
            self.sow("intermediates", "attention_weights", weights)
            self.sow("intermediates", "values", value)  # MiniLM's value relation (compress/distillation.py)
            weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not enable_dropout)
            context = precision.einsum("bhqk,bhkd->bqhd", weights, value)  # [b, q, h, d]
        else:
            context = self._fused_context(query, key, value, mask)
        context = nn.with_logical_constraint(context, HEAD_AXES)
        out = Dense(
            name="out",
            features=(embed,),
            axis=(-2, -1),
            kernel_axes=("heads", "kv", "embed"),
            kernel_distribution="normal",
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )(context)  # [b, q, embed]
        return nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_embed"))

    def attended(self, key: Array, value: Array, mask: AttentionMask) -> tuple[Array, Array, AttentionMask]:
        """The keys and values [b, h, k, d] (decoding: the whole cache) and the mask the queries attend with.

        As given; prefix tuning (ptmjax.adapt.prefix_tuning) intercepts this call to prepend its keys and values.
        """
        return key, value, mask

    def probabilities(self, weights: Array) -> Array:
        """The 'einsum' path's attention probabilities [b, h, q, k], as computed; PoWER-BERT's token extraction
        (ptmjax/compress/token_dropping.py) intercepts this call to read them."""
        return weights

    def _fused_context(self, query: Array, key: Array, value: Array, mask: AttentionMask) -> Array:
        """query [b, q, h, d], head-major key and value [b, h, k, d] -> context [b, q, h, d]
        by `jax.nn.dot_product_attention`, the Pallas TPU kernel or the blockwise loop (logits not scaled
        again: T5 folds the scale into the query kernel, `scale_logits` scaled the query above)."""
        if self.attention_kernel == "blockwise":
            return jnp.swapaxes(blockwise_attention(jnp.swapaxes(query, 1, 2), key, value, mask), 1, 2)
        if self.attention_kernel == "pallas_tpu_flash":
            return jnp.swapaxes(tpu_flash_attention(jnp.swapaxes(query, 1, 2), key, value, mask), 1, 2)
        if self.attention_kernel == "splash":
            return jnp.swapaxes(splash_attention(jnp.swapaxes(query, 1, 2), key, value, mask), 1, 2)
        if self.attention_kernel == "performer":  # q . k split evenly between the two feature maps' inputs
            split = self.head_dim**0.25 if self.scale_logits else 1.0
            projection = random_projection(layer_seed(self.name), self.performer_features, self.head_dim)
            context = favor_attention(jnp.swapaxes(query, 1, 2) * split, key / split, value, mask, projection)
            return jnp.swapaxes(context, 1, 2)
        if self.attention_kernel == "cudnn":
            _check_cudnn(query.dtype)
        structure = {}
        if mask.unpacked:  # padding as sequence lengths, causality as a flag; the bias (T5's) as it is
            query_lengths, key_lengths = mask.sequence_lengths()
            structure = {"is_causal": mask.causal, "query_seq_lengths": query_lengths,
                         "key_value_seq_lengths": key_lengths}
            bias = mask.bias
        else:
            bias = mask.dense_bias(self.dtype)
            if bias is not None:
                bias = jnp.broadcast_to(bias, (query.shape[0], bias.shape[1], query.shape[1], key.shape[2]))
        bias = None if bias is None else jnp.asarray(bias, query.dtype)
        key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # [b, k, h, d]
        return jax.nn.dot_product_attention(
            query, key, value, bias, scale=1.0, implementation=self.attention_kernel, **structure
        )

    def _context_parallel_context(
        self, query: Array, key: Array, value: Array, mask: ContextMask, enable_dropout: bool
    ) -> Array:
        """query [b, q, h, d], key and value [b, h, k, d] -> context [b, q, h, d] by context-parallel attention
        (ptmjax/layers/context_parallel.py) in the form `context_parallel` names."""
        if enable_dropout and self.dropout_rate > 0:
            raise ValueError(
                f"context-parallel attention has no dropout on attention probabilities but '{self.name}' has "
                f"dropout_rate={self.dropout_rate}; set the attention dropout rate to 0 or drop the context axis"
            )
        context = context_parallel_attention(jnp.swapaxes(query, 1, 2), key, value, mask, self.context_parallel)
        return jnp.swapaxes(context, 1, 2)

    def _check_no_dropout(self, enable_dropout: bool) -> None:
        """Raise if this layer would drop attention probabilities: only 'einsum' does."""
        if enable_dropout and self.dropout_rate > 0:
            raise ValueError(
                f"attention_kernel={self.attention_kernel!r} has no dropout on attention probabilities but "
                f"'{self.name}' has dropout_rate={self.dropout_rate}; set the attention dropout rate to 0 or "
                "use attention_kernel='einsum'"
            )

    def _write_to_cache(self, key: Array, value: Array, cache: CacheSlots) -> tuple[Array, Array]:
        """Writes key and value [b, h, q, d] at slot `cache.index` of the cache; returns the keys and values the
        call attends: the whole cache, or, of a ring (`cache.window`), the ring before the write and the call's own.

        The call that creates the cache (sized by its own length, or the window) writes nothing.
        """
        created = self.has_variable("cache", "cached_key")
        cached = []
        for name, new in (("cached_key", key), ("cached_value", value)):
            slots = new.shape[2] if cache.window is None else cache.window
            variable = self.variable("cache", name, jnp.zeros, new.shape[:2] + (slots,) + new.shape[3:], new.dtype)
            new = new.astype(variable.value.dtype)
            if cache.window is not None:
                cached.append(jnp.concatenate([variable.value, new], axis=2))
                if created:
                    variable.value = nn.with_logical_constraint(_ring_write(variable.value, new, cache), KV_AXES)
            elif created:
                updated = jax.lax.dynamic_update_slice(variable.value, new, (0, 0, cache.index, 0))
                variable.value = nn.with_logical_constraint(updated, KV_AXES)
                cached.append(variable.value)
            else:
                cached.append(new)
        return tuple(cached)


def _ring_write(ring: Array, new: Array, cache: CacheSlots) -> Array:
    """`ring` [b, h, window, d] with the call's keys or values `new` [b, h, q, d] written at their slots modulo
    the window (of more than `window`, the last `window`)."""
    kept = min(new.shape[2], cache.window)
    slots = (cache.index + new.shape[2] - kept + jnp.arange(kept, dtype=jnp.int32)) % cache.window
    return ring.at[:, :, slots].set(new[:, :, new.shape[2] - kept:], unique_indices=True)


def _check_cudnn(dtype: DType) -> None:
    """Raise unless cuDNN's fused attention can run: on an NVIDIA GPU, in bfloat16 or float16."""
    platform = target_platform()
    if platform != "gpu":
        raise ValueError(
            f"attention_kernel='cudnn' runs on an NVIDIA GPU, not on {platform!r}; use attention_kernel='xla' or "
            "'einsum' there ('pallas_tpu_flash' on TPU)"
        )
    if dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"attention_kernel='cudnn' needs bfloat16 or float16 activations, got {jnp.dtype(dtype).name}; set the "
            "model config's dtype='bfloat16' or use attention_kernel='xla'"
        )
