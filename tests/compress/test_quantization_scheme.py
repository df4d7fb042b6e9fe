"""The weight schemes beyond absmax integers (quantization_scheme.py) against float64 NumPy written from their
papers: TernaryBERT's ternary (TWN), binary (BWN) and QLoRA's NormalFloat4, per channel and per tile; a zero
channel (a pruned row) stays zero in every scheme; and the refusals."""

import jax
import numpy as np
import pytest
import qwix

from ptmjax.compress.quantization_scheme import QuantizationScheme

# QLoRA's NF4 levels (Dettmers et al., 2023, Appendix E)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0])


def groups(w, contracted, tile):
    """w with the last contracted dim split into tiles, and the axes one scale covers."""
    if tile is None:
        return w, tuple(range(contracted))
    split = w.reshape(w.shape[:contracted - 1] + (w.shape[contracted - 1] // tile, tile) + w.shape[contracted:])
    return split, tuple(range(contracted - 1)) + (contracted,)


def numpy_dequantized(kernel, contracted, weights, tile=None):
    """float64 NumPy: (the integers, the dequantized kernel) of each scheme, from the papers' formulas."""
    w = np.asarray(kernel, np.float64)
    g, axes = groups(w, contracted, tile)
    a = np.abs(g)
    if weights == "ternary":  # TWN: Δ = 0.7 E|w|, α = E[|w| : |w| > Δ]
        kept = a > 0.7 * a.mean(axis=axes, keepdims=True)
        alpha = (a * kept).sum(axis=axes, keepdims=True) / np.maximum(kept.sum(axis=axes, keepdims=True), 1)
        q = np.sign(g) * kept
        out = q * alpha
    elif weights == "binary":  # BWN: α = E|w|, sign with sign(0) = 1
        q = np.where(g >= 0, 1.0, -1.0)
        out = q * a.mean(axis=axes, keepdims=True)
    else:  # NF4: the nearest level of w / absmax
        absmax = a.max(axis=axes, keepdims=True)
        ratio = np.divide(g, absmax, out=np.zeros_like(g), where=absmax > 0)
        q = np.abs(ratio[..., None] - NF4).argmin(axis=-1)
        out = NF4[q] * absmax
    return q.reshape(w.shape), out.reshape(w.shape)


@pytest.mark.parametrize("weights", ["ternary", "binary", "nf4"])
@pytest.mark.parametrize("tile, shape, contracted", [(None, (32, 2, 16), 1), (None, (2, 16, 32), 2),
                                                     (8, (32, 64), 1), (4, (2, 16, 32), 2)])
def test_each_scheme_quantizes_as_its_float64_numpy_formula(weights, tile, shape, contracted):
    kernel = np.array(jax.random.normal(jax.random.key(1), shape))
    kernel[..., 0] = 0.0  # a pruned output channel
    q = QuantizationScheme(weights, tile_size=tile).quantize_kernel(kernel, contracted)
    expected_q, expected = numpy_dequantized(kernel, contracted, weights, tile)
    np.testing.assert_array_equal(np.asarray(q.qvalue).astype(np.int64), expected_q)
    np.testing.assert_allclose(qwix.dequantize(q), expected, rtol=1e-6, atol=1e-7)
    assert np.all(np.asarray(qwix.dequantize(q))[..., 0] == 0)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_zero_channel_of_absmax_integers_stays_zero(weights):
    kernel = np.array(jax.random.normal(jax.random.key(2), (16, 4)))
    kernel[:, 1] = 0.0
    q = QuantizationScheme(weights).quantize_kernel(kernel, 1)
    assert np.all(np.asarray(q.qvalue)[:, 1] == 0)
    assert np.all(np.isfinite(np.asarray(qwix.dequantize(q))))
    rows = np.array(jax.random.normal(jax.random.key(3), (3, 8)))
    rows[1] = 0.0  # a token of zeros
    x = QuantizationScheme(weights, "int8").quantize_inputs(rows, (1,))
    assert np.all(np.asarray(x.qvalue)[1] == 0)


@pytest.mark.parametrize("settings, message", [
    ({"weights": "int2"}, "weights='int2' must be one of"),
    ({"weights": "nf4", "activations": "int8"}, "nf4 kernels are dequantized before their product"),
])
def test_bad_schemes_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        QuantizationScheme(**settings)
