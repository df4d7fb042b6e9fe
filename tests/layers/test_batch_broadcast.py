"""`ptmjax/layers/batch_broadcast.py`: a batch-shared tensor broadcast over the batch, whose gradient on the
CPU sums the batch by halves; values and gradients against float64 numpy, for even and odd batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.batch_broadcast import broadcast_batch, sum_by_halves


@pytest.mark.parametrize("batch", [1, 2, 5, 6, 8])
def test_broadcast_batch_and_its_gradient_equal_float64(batch):
    rng = np.random.default_rng(batch)
    shared = rng.standard_normal((1, 3, 4))
    cotangent = rng.standard_normal((batch, 3, 4))
    broadcast, vjp = jax.vjp(lambda x: broadcast_batch(x, batch), jnp.asarray(shared, jnp.float32))
    np.testing.assert_array_equal(broadcast, np.broadcast_to(shared.astype(np.float32), (batch, 3, 4)))
    (gradient,) = vjp(jnp.asarray(cotangent, jnp.float32))
    assert gradient.shape == shared.shape
    np.testing.assert_allclose(gradient, cotangent.sum(0, keepdims=True), rtol=1e-6, atol=1e-6)


def test_a_tensor_with_its_own_batch_is_left_as_it_is():
    per_example = jnp.ones((4, 3))
    assert broadcast_batch(per_example, 4) is per_example


def test_sum_by_halves_sums_the_first_axis():
    x = np.random.default_rng(0).standard_normal((7, 2, 3))
    np.testing.assert_allclose(sum_by_halves(jnp.asarray(x)), x.sum(0, keepdims=True), rtol=1e-6)
