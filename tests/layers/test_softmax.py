"""`ptmjax/layers/softmax.py`'s softmax: values, gradient and second derivative against float64 numpy, and
the masked rows attention gives it (a large negative bias)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.softmax import softmax


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_and_its_gradient_equal_float64(axis):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7)) * 4
    x[0, 1, :3] = -1e9  # masked keys, as attention's bias gives them
    cotangent = rng.standard_normal(x.shape)
    y, vjp = jax.vjp(lambda v: softmax(v, axis), jnp.asarray(x, jnp.float32))
    want = _softmax64(x, axis)
    np.testing.assert_allclose(y, want, atol=1e-6)
    # d/dx of sum(c * y) = y * (c - sum(c * y)), the softmax Jacobian's transpose applied to c.
    want_grad = want * (cotangent - (cotangent * want).sum(axis, keepdims=True))
    np.testing.assert_allclose(vjp(jnp.asarray(cotangent, jnp.float32))[0], want_grad, atol=1e-5)


def test_softmax_second_derivative_equals_jax_nn_softmax_in_float64():
    with jax.enable_x64():
        x = jnp.asarray(np.random.default_rng(1).standard_normal(5))
        hessian = jax.hessian(lambda v: softmax(v)[0])(x)
        reference = jax.hessian(lambda v: jax.nn.softmax(v)[0])(x)
    np.testing.assert_allclose(hessian, reference, atol=1e-12)
