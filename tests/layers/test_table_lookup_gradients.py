"""bf16 table lookups sum their gradient in float32 (ptmjax/layers/embed.py's `lookup` and
`small_table_lookup`).

A token embedding's row and a T5 relative-position bucket are gathered once per occurrence, so
their gradients sum thousands of terms; against float64 numpy on the same bf16 cotangents, the
summed gradients stay exact to float32 rounding where a bfloat16 scatter-add lost 3% (a frequent
token) and 29% (the buckets of a 512-token sequence). The forward values are the cast table's. The
relative-position gradient is a matmul, never a scatter-add (whose atomics contend on a GPU), in
bfloat16 and float32 alike.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.embed import Embed
from ptmjax.layers.relative_position import RelativePositionBias, relative_position_bucket


def bf16_cotangent(shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.bfloat16)


def table_gradient(module: nn.Module, params: dict, cotangent: jax.Array, *inputs: jax.Array) -> np.ndarray:
    """d sum(module(*inputs) * cotangent) / d (the module's only parameter), as float64."""

    def loss(p):
        return jnp.sum(module.apply(p, *inputs).astype(jnp.float32) * cotangent.astype(jnp.float32))

    (gradient,) = jax.tree.leaves(jax.grad(loss)(params))
    return np.asarray(gradient, np.float64)


def summed_by_id(ids: np.ndarray, cotangent: jax.Array, num_ids: int) -> np.ndarray:
    """float64 sum of the cotangent rows [n, features] of each id: the exact table gradient."""
    reference = np.zeros((num_ids, cotangent.shape[-1]))
    np.add.at(reference, ids.ravel(), np.asarray(cotangent.astype(jnp.float32), np.float64).reshape(ids.size, -1))
    return reference


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_a_frequent_tokens_embedding_gradient_sums_in_float32():
    tokens = np.random.default_rng(0).zipf(1.3, (8, 512)) % 500  # token 1 occurs about 1,000 times
    embed = Embed(500, 32, dtype=jnp.bfloat16)
    params = nn.unbox(embed.init(jax.random.key(0), tokens))
    cotangent = bf16_cotangent((8, 512, 32))
    assert np.bincount(tokens.ravel()).max() > 500
    gradient = table_gradient(embed, params, cotangent, tokens)
    assert relative_error(gradient, summed_by_id(tokens, cotangent, 500)) < 1e-6
    table = params["params"]["embedding"]
    np.testing.assert_array_equal(embed.apply(params, tokens), jnp.asarray(table, jnp.bfloat16)[tokens])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_t5_relative_position_gradient_is_a_float32_matmul_over_a_long_sequence(dtype):
    bias = RelativePositionBias(32, 128, num_heads=4, bidirectional=True, dtype=dtype)
    positions = jnp.arange(512)[None]
    params = nn.unbox(bias.init(jax.random.key(0), positions, positions))
    cotangent = bf16_cotangent((1, 4, 512, 512)).astype(dtype)
    gradient = table_gradient(bias, params, cotangent, positions, positions)
    buckets = np.asarray(relative_position_bucket(positions[:, None, :] - positions[:, :, None], True, 32, 128))
    by_pair = jnp.transpose(cotangent, (0, 2, 3, 1))  # [1, q, k, heads], as the buckets
    assert np.bincount(buckets.ravel()).max() > 80_000
    assert relative_error(gradient, summed_by_id(buckets, by_pair, 32)) < 1e-6
    backward = str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(bias.apply(p, positions, positions))))(params))
    assert "scatter" not in backward and "dot_general" in backward
