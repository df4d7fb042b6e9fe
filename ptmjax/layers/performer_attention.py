"""attention_kernel='performer': Performer's FAVOR+ (Choromanski et al., 2021), softmax attention approximated
in time and memory linear in the sequence length.

exp(q . k) = E_w[phi(q) . phi(k)] with positive random features phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) for
the m rows of W drawn from N(0, I_d) (here orthogonal in blocks of d, each row rescaled to a Gaussian's norm,
which keeps the estimate unbiased and lowers its variance). Attention is then
    out_i = phi(q_i) . sum_j phi(k_j) v_j^T  /  phi(q_i) . sum_j phi(k_j),
the sums over the keys the query may attend: all of its row's real keys (bidirectional), or those up to i
within its segment (causal, packed or not), computed as a scan over chunks of CHUNK positions that carries
the running sums [m, d + 1] (the extra column is the denominator's) and multiplies within a chunk exactly.
Its error falls as 1/sqrt(m) (tests/layers/test_performer_attention.py measures it against float64 softmax
attention).

Numerics: each query's features are divided by their largest, and every key's by the largest of its row's keys
(constants that cancel in the ratio). W is drawn from a fixed seed per layer name: a model's projections do not
change between steps or restarts (the paper redraws them during training; this module does not).
Masks: causality, segment ids (padding as segment 0; packing only with causality) and nothing else: a bias
(T5's relative positions, a prefix LM's bidirectional prefix, a decoding cache's slots) or a sparse pattern has no
linear form and is refused. No dropout on the probabilities, which are never formed.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.precision import BFLOAT16, PLAIN

Array = jax.Array

CHUNK = 64  # positions per step of the causal scan: exact products within a chunk, running sums across
POLICIES = {PLAIN: "every product in float32", BFLOAT16: "every product in float32, the operands cast up and the "
            "context cast back to bfloat16"}


def random_projection(seed: int, num_features: int, head_dim: int) -> Array:
    """float32 [m, d]: rows orthogonal within each block of d, each scaled to the norm of a d-dim Gaussian."""
    key, norm_key = jax.random.split(jax.random.key(seed))
    blocks = [jnp.linalg.qr(jax.random.normal(k, (head_dim, head_dim)))[0].T
              for k in jax.random.split(key, -(-num_features // head_dim))]
    rows = jnp.concatenate(blocks)[:num_features]
    return rows * jnp.linalg.norm(jax.random.normal(norm_key, (num_features, head_dim)), axis=1, keepdims=True)


def layer_seed(name: str) -> int:
    """The projection's seed for a layer: fixed by its name."""
    return zlib.crc32(name.encode())


def positive_features(x: Array, projection: Array, queries: bool) -> Array:
    """x [b, h, n, d] -> phi(x) [b, h, n, m], divided by its largest entry per query (`queries`) or per row."""
    logits = jnp.einsum("bhnd,md->bhnm", x, projection) - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    over = -1 if queries else (-2, -1)
    return jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=over, keepdims=True)))


def favor_attention(query: Array, key: Array, value: Array, mask: AttentionMask, projection: Array) -> Array:
    """query [b, h, q, d], key and value [b, h, k, d] -> context [b, h, q, d] ~ softmax(q k^T) v under `mask`."""
    check_mask(mask)
    dtype = query.dtype
    query, key, value = (a.astype(jnp.float32) for a in (query, key, value))
    q_features = positive_features(query, projection, queries=True)
    k_features = positive_features(key, projection, queries=False)
    query_ids, key_ids = mask.query_segment_ids, mask.key_segment_ids
    if key_ids is not None:  # a padding key adds nothing to any sum
        k_features = k_features * (key_ids > 0)[:, None, :, None]
    value = jnp.concatenate([value, jnp.ones(value.shape[:-1] + (1,), value.dtype)], axis=-1)  # [b, h, k, d + 1]
    if mask.causal:
        out = _causal(q_features, k_features, value, query_ids)
    else:
        out = jnp.einsum("bhqm,bhmd->bhqd", q_features, jnp.einsum("bhkm,bhkd->bhmd", k_features, value))
    context = out[..., :-1] / jnp.maximum(out[..., -1:], jnp.finfo(jnp.float32).tiny)
    return context.astype(dtype)


def check_mask(mask: AttentionMask) -> None:
    """Raise unless `mask` has a linear form (see the module docstring)."""
    if mask.bias is not None or mask.pattern is not None:
        raise ValueError("attention_kernel='performer' takes causality and segment ids only, not an additive bias "
                         "(T5's relative positions, a prefix LM, a decoding cache) or a sparse pattern; use "
                         "attention_kernel='einsum' for such a model")
    if mask.query_segment_ids is not None and not (mask.causal or mask.unpacked):
        raise ValueError("attention_kernel='performer' packs sequences only with causal attention; set "
                         "train.pack=False for a bidirectional model")


def _causal(q_features: Array, k_features: Array, value: Array, segment_ids: Array | None) -> Array:
    """sum over keys j <= i of the query's segment of (phi(q_i) . phi(k_j)) v_j, by a scan over chunks."""
    b, h, n, m = q_features.shape
    chunks = -(-n // CHUNK)
    pad = chunks * CHUNK - n
    ids = jnp.ones((b, n), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    q_c, k_c, v_c = (jnp.moveaxis(jnp.pad(a, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(
        b, h, chunks, CHUNK, a.shape[-1]), 2, 0) for a in (q_features, k_features, value))
    ids_c = jnp.moveaxis(jnp.pad(ids, ((0, 0), (0, pad))).reshape(b, chunks, CHUNK), 1, 0)  # [chunks, b, c]
    within = np.tril(np.ones((CHUNK, CHUNK), bool))

    def step(carry, chunk):
        sums, sums_segment = carry  # [b, h, m, d + 1], [b]: the running sums over the keys of that segment so far
        q, k, v, seg = chunk
        carried = jnp.einsum("bhcm,bhmd->bhcd", q, sums) * (seg == sums_segment[:, None])[:, None, :, None]
        allowed = within & (seg[:, :, None] == seg[:, None, :])  # [b, c, c]
        scores = jnp.einsum("bhcm,bhkm->bhck", q, k) * allowed[:, None]
        last = seg[:, -1]
        keep = (last == sums_segment)[:, None, None, None]
        in_last = (seg == last[:, None])[:, None, :, None]  # the chunk's keys of its last segment
        sums = jnp.where(keep, sums, 0) + jnp.einsum("bhkm,bhkd->bhmd", k * in_last, v)
        return (sums, last), carried + jnp.einsum("bhck,bhkd->bhcd", scores, v)

    start = (jnp.zeros((b, h, m, value.shape[-1]), jnp.float32), jnp.full((b,), -1, jnp.int32))
    _, out = jax.lax.scan(step, start, (q_c, k_c, v_c, ids_c))  # [chunks, b, h, c, d + 1]
    return jnp.moveaxis(out, 0, 2).reshape(b, h, chunks * CHUNK, -1)[:, :, :n]
