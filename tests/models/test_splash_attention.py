"""attention_kernel='splash' (JAX's Pallas TPU splash-attention kernel, here in TPU interpret mode on the CPU):
the mask it builds from a causal flag and a sparse pattern equals the pattern's rule written in NumPy
(test_sparse_attention.PATTERNS), for every pattern, bidirectional and causal; the blocks it computes are
those where that NumPy mask has a True (and the blockwise kernel's live tiles), and fall with the window as
counted by hand; an attention layer with the kernel equals the einsum path given the NumPy mask as a bias,
outputs at real positions and gradients, on packed rows with padding (one case by default, the others and a
sharded layer slow: interpret mode is slow); a bias is refused. The TPU evidence of the skipped blocks (memory
and compile) is docs/aot_compile.md's sparse table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import attention_outputs_and_grads, random_normal
from flax import linen as nn
from test_sparse_attention import LENGTH, PATTERNS, D, packed_rows

from ptmjax import partitioning
from ptmjax.layers.attention_mask import AttentionMask, mask_to_bias
from ptmjax.layers.attention_patterns import SlidingWindow, live_tiles
from ptmjax.layers.splash_attention import BLOCK, live_blocks, splash_attention, splash_mask

PADDED = 3 * BLOCK  # LENGTH (260) padded up to whole blocks, as the kernel runs it


def rule(name: str, causal: bool) -> np.ndarray:
    """The NumPy mask [LENGTH, LENGTH] of pattern `name`, ANDed with causality."""
    return PATTERNS[name][1] & (D >= 0 if causal else True)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_splash_mask_equals_the_patterns_rule(name, causal):
    mask = splash_mask(PATTERNS[name][0], causal, LENGTH, LENGTH)
    np.testing.assert_array_equal(mask[:, :], rule(name, causal))
    np.testing.assert_array_equal(mask[100:200, 7:250], rule(name, causal)[100:200, 7:250])  # any slice


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_kernel_computes_the_blocks_the_pattern_reaches(name, causal):
    pattern = PATTERNS[name][0]
    positions = np.arange(PADDED)
    allowed = np.asarray(pattern.allowed(positions, positions))
    allowed &= positions[:, None] >= positions[None, :] if causal else True
    want = allowed.reshape(3, BLOCK, 3, BLOCK).any(axis=(1, 3))
    got = live_blocks(pattern, causal, PADDED, PADDED)
    np.testing.assert_array_equal(got, want)
    tiles = live_tiles(pattern, PADDED, PADDED, BLOCK, causal)  # the blockwise kernel's plan, tiles of 128
    assert [tuple(np.flatnonzero(row)) for row in got] == list(tiles)


def test_blocks_computed_fall_with_the_window():
    """At 2048 causal positions (16 x 16 blocks, 136 on or below the diagonal): a window of 128 reaches the
    diagonal block and the one before it (16 + 15 = 31 blocks), 256 two before it (16 + 15 + 14 = 45)."""
    assert live_blocks(None, True, 2048, 2048).sum() == 136
    assert live_blocks(SlidingWindow(128), True, 2048, 2048).sum() == 31
    assert live_blocks(SlidingWindow(256), True, 2048, 2048).sum() == 45
    assert live_blocks(SlidingWindow(128), False, 2048, 2048).sum() == 16 + 2 * 15


def assert_splash_equals_einsum(name: str, causal: bool):
    """A layer (2 heads of 8) with 'splash' and pattern `name` on two packed rows (two segments; padding)
    equals the einsum path given the NumPy mask as an explicit bias: outputs at real positions, gradients."""
    ids, x = packed_rows(), random_normal(1, (2, LENGTH, 16))
    segments = np.asarray(ids)
    explicit = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0) & rule(name, causal)
    real = jnp.asarray(segments > 0)
    reference = AttentionMask(mask_to_bias(jnp.asarray(explicit[:, None])))
    want, want_grads = attention_outputs_and_grads("einsum", x, x, reference, real, (2, 8))
    mask = AttentionMask(None, ids, ids, causal=causal, pattern=PATTERNS[name][0])
    got, got_grads = attention_outputs_and_grads("splash", x, x, mask, real, (2, 8))
    np.testing.assert_allclose(got[real], want[real], atol=1e-5 * float(jnp.max(jnp.abs(want[real]))))
    want_grads = want_grads[:3]  # the reference's bias gradient has no counterpart: splash takes no bias
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale), got_grads[:3], want_grads)


def test_layer_with_a_causal_sliding_window_equals_einsum():
    assert_splash_equals_einsum("sliding_window", causal=True)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", ["bigbird", "dilated_window", "fixed_chunks"])
def test_layer_with_each_pattern_equals_einsum(name, causal):
    assert_splash_equals_einsum(name, causal)


@pytest.mark.slow
def test_sharded_layer_equals_one_device():
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, tensor=2), jax.devices()[:4])  # rows, heads
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        assert_splash_equals_einsum("bigbird", causal=True)


def test_a_bias_is_refused():
    x = jnp.zeros((1, 2, BLOCK, 8))
    refusal = r"attention_kernel='splash' takes no additive bias .*; use attention_kernel='pallas_tpu_flash'"
    with pytest.raises(ValueError, match=refusal):
        splash_attention(x, x, x, AttentionMask(jnp.zeros((1, 1, BLOCK, BLOCK))))
