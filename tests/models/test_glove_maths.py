"""GloVe's maths: the weighting function, the loss and its gradient against a float64 NumPy form (rows repeated
in a batch, padding of weight 0), and glove.c's AdaGrad step against one computed by hand."""

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.models import glove


def test_weighting_below_and_from_x_max():
    np.testing.assert_allclose(glove.weighting(jnp.array([1.0, 50.0, 100.0, 400.0])),
                               [0.01 ** 0.75, 0.5 ** 0.75, 1, 1], rtol=1e-6)


def reference_loss_and_grads(params, rows, cols, weights, log_counts):
    """J and its gradient, float64, entry by entry."""
    p = {name: np.asarray(table, np.float64) for name, table in params.items()}
    grads, total = {name: np.zeros_like(table) for name, table in p.items()}, 0.0
    for i, j, f, log_x in zip(rows, cols, weights, log_counts, strict=True):
        diff = p["word"][i] @ p["context"][j] + p["word_bias"][i] + p["context_bias"][j] - log_x
        total += f * diff ** 2
        grads["word"][i] += 2 * f * diff * p["context"][j]
        grads["context"][j] += 2 * f * diff * p["word"][i]
        grads["word_bias"][i] += 2 * f * diff
        grads["context_bias"][j] += 2 * f * diff
    return total, grads


def test_loss_and_gradient_against_numpy():
    rng = np.random.default_rng(0)
    params = {name: jnp.asarray(rng.normal(size=table.shape), jnp.float32)
              for name, table in glove.init_params(jax.random.key(0), 6, 4).items()}
    rows, cols = np.array([0, 0, 3, 5, 2]), np.array([1, 4, 1, 5, 0])  # word 0 and context 1 twice; a diagonal
    weights, log_counts = np.array([1.0, 0.3, 0.7, 0.1, 0.0]), np.log([120.0, 4.0, 9.0, 2.0, 1.0])  # the last pads
    value, grads = jax.value_and_grad(glove.loss)(params, jnp.asarray(rows), jnp.asarray(cols),
                                                  jnp.asarray(weights, jnp.float32),
                                                  jnp.asarray(log_counts, jnp.float32))
    expected, expected_grads = reference_loss_and_grads(params, rows, cols, weights, log_counts)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    for name in glove.TABLES:
        np.testing.assert_allclose(np.asarray(grads[name]), expected_grads[name], rtol=1e-5, atol=1e-5)


def test_adagrad_step_by_hand():
    # One entry (0, 1), f = 1, log X = 0: diff = w_0 . w~_1 + b_0 + b~_1 = (3 - 2) + 0.5 - 0.5 = 1, so J = 1 and
    # the gradients of J / 2 are w~_1 = [3, -1] for w_0, w_0 = [1, 2] for w~_1, and 1 for each bias.
    params = {"word": jnp.array([[1.0, 2.0], [9.0, 9.0]]), "context": jnp.array([[9.0, 9.0], [3.0, -1.0]]),
              "word_bias": jnp.array([0.5, 9.0]), "context_bias": jnp.array([9.0, -0.5])}
    accumulators = glove.init_accumulators(params)
    accumulators["word"] = accumulators["word"].at[0].set(jnp.array([4.0, 1.0]))
    new, new_accumulators, value = glove.adagrad_step(params, accumulators, jnp.array([0]), jnp.array([1]),
                                                      jnp.array([1.0]), jnp.array([0.0]), jnp.float32(0.5))
    assert float(value) == 1
    # w_0 -= 0.5 * [3, -1] / sqrt([4, 1]), then its accumulator += (0.5 * [3, -1]) ** 2; the others from 1.
    np.testing.assert_allclose(new["word"], [[0.25, 2.5], [9, 9]])
    np.testing.assert_allclose(new_accumulators["word"], [[6.25, 1.25], [1, 1]])
    np.testing.assert_allclose(new["context"], [[9, 9], [2.5, -2]])
    np.testing.assert_allclose(new_accumulators["context"], [[1, 1], [1.25, 2]])
    np.testing.assert_allclose(new["word_bias"], [0, 9])
    np.testing.assert_allclose(new["context_bias"], [9, -1])
    np.testing.assert_allclose(new_accumulators["word_bias"], [1.25, 1])
    np.testing.assert_allclose(new_accumulators["context_bias"], [1, 1.25])
    np.testing.assert_allclose(glove.word_vectors(new), [[9.25, 11.5], [11.5, 7]])  # w + w~, row by row


def test_init_is_uniform_in_half_over_dim():
    params = glove.init_params(jax.random.key(0), 50, 8)
    assert {name: table.shape for name, table in params.items()} == {
        "word": (50, 8), "context": (50, 8), "word_bias": (50,), "context_bias": (50,)}
    assert all(float(jnp.abs(table).max()) <= 0.5 / 8 for table in params.values())
