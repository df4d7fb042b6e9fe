"""word2vec's maths against a float64 NumPy form of word2vec.c's update: the negative-sampling loss, its
gradient and the SGD step (skip-gram and CBOW, rows repeated in a batch); cosine neighbours and 3CosAdd."""

import jax.numpy as jnp
import numpy as np

from ptmjax.models import word2vec


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference_step(tables, inputs, mask, outputs, weights, alpha):
    """word2vec.c's negative-sampling update, float64, example by example on the old tables (updates summed):
    -> (new input table, new output table, summed loss)."""
    syn0, syn1 = (np.asarray(tables[k], np.float64) for k in ("input", "output"))
    new0, new1, loss = syn0.copy(), syn1.copy(), 0.0
    for row_inputs, row_mask, row_outputs, row_weights in zip(inputs, mask, outputs, weights, strict=True):
        h = syn0[row_inputs[row_mask]].mean(0)
        neu1e = np.zeros_like(h)
        for k, (word, weight) in enumerate(zip(row_outputs, row_weights, strict=True)):
            label, f = float(k == 0), syn1[word] @ h
            loss -= weight * np.log(sigmoid(f if k == 0 else -f))
            g = alpha * weight * (label - sigmoid(f))
            neu1e += g * syn1[word]
            new1[word] += g * h
        for word in row_inputs[row_mask]:
            new0[word] += neu1e  # undivided for CBOW, as word2vec.c's cbow_mean
    return new0, new1, loss


def random_tables(rng, vocabulary=7, dim=5):
    return {"input": jnp.asarray(rng.normal(size=(vocabulary, dim)), jnp.float32),
            "output": jnp.asarray(rng.normal(size=(vocabulary, dim)) * 0.5, jnp.float32)}


def check_step(inputs, mask, outputs, weights):
    tables = random_tables(np.random.default_rng(0))
    new, loss = word2vec.sgd_step(tables, jnp.asarray(inputs), jnp.asarray(mask), jnp.asarray(outputs),
                                  jnp.asarray(weights, jnp.float32), jnp.float32(0.3))
    new0, new1, expected_loss = reference_step(tables, np.asarray(inputs), np.asarray(mask), np.asarray(outputs),
                                               np.asarray(weights), 0.3)
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new["input"]), new0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new["output"]), new1, rtol=1e-5, atol=1e-6)


def test_skipgram_step_matches_word2vec_c_with_repeated_rows_and_dropped_noise_words():
    inputs = [[1], [1], [4], [0]]  # word 1 is an input twice, word 2 an output thrice
    outputs = [[2, 3, 2], [5, 2, 6], [0, 1, 1], [3, 3, 4]]
    weights = [[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 1]]  # 0: a noise word equal to its target, dropped
    check_step(inputs, np.ones((4, 1), bool), outputs, weights)


def test_cbow_step_matches_word2vec_c_with_context_masks():
    inputs = [[1, 2, 3, 0], [4, 4, 5, 6], [2, 0, 0, 0]]
    mask = [[True, True, True, False], [True, True, True, True], [True, False, False, False]]
    outputs = [[5, 0, 6], [3, 1, 2], [1, 2, 6]]
    check_step(inputs, mask, outputs, np.ones((3, 3)))


def test_padding_examples_change_nothing():
    tables = random_tables(np.random.default_rng(1))
    new, loss = word2vec.sgd_step(tables, jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3), bool),
                                  jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 4)), jnp.float32(0.1))
    assert float(loss) == 0
    for name in tables:
        np.testing.assert_array_equal(new[name], tables[name])


def test_nearest_and_analogy_against_numpy():
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(30, 6)).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    ids, cosines = word2vec.nearest(jnp.asarray(vectors), jnp.array([4, 9]), 3)
    for row, query in enumerate([4, 9]):
        scores = unit @ unit[query]
        scores[query] = -np.inf
        np.testing.assert_array_equal(ids[row], np.argsort(-scores)[:3])
        np.testing.assert_allclose(cosines[row], np.sort(scores)[::-1][:3], rtol=1e-5)
    a, b, c = rng.integers(0, 20, (3, 40))
    predicted = word2vec.analogy_predictions(jnp.asarray(vectors), jnp.asarray(a), jnp.asarray(b), jnp.asarray(c), 20)
    for question in range(40):
        target = unit[b[question]] + unit[c[question]] - unit[a[question]]
        scores = unit[:20] @ target
        scores[[a[question], b[question], c[question]]] = -np.inf
        assert predicted[question] == scores.argmax()
