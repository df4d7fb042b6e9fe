"""GloVe's maths (Pennington et al., 2014): the weighted least-squares loss over co-occurrence counts and the
reference glove code's AdaGrad step.

Four tables: 'word' and 'context' [vocabulary, dim], 'word_bias' and 'context_bias' [vocabulary], all started
uniform in +-0.5/dim as glove.c starts them. An entry (i, j, X_ij) costs f(X_ij) (w_i . w~_j + b_i + b~_j -
log X_ij)^2, with f(x) = (x / x_max)^alpha below x_max and 1 from it; the loss J is their sum. The vectors are
w + w~ (`word_vectors`), the paper's choice.

`adagrad_step` is glove.c's update for a batch of entries at once, summed where rows repeat: with g the
gradient of J / 2 (glove.c's cost), each parameter moves by -learning_rate * g / sqrt(G), G its accumulator
before the step (started at 1), and then G grows by (learning_rate * g)^2, glove.c's order and scaling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.layers import precision

Array = jax.Array
TABLES = ("word", "context", "word_bias", "context_bias")


def init_params(key: Array, vocabulary_size: int, dim: int) -> dict[str, Array]:
    """The four tables, uniform in +-0.5/dim (float32)."""
    keys = jax.random.split(key, len(TABLES))
    shapes = {"word": (vocabulary_size, dim), "context": (vocabulary_size, dim), "word_bias": (vocabulary_size,),
              "context_bias": (vocabulary_size,)}
    return {name: jax.random.uniform(k, shapes[name], jnp.float32, -0.5 / dim, 0.5 / dim)
            for name, k in zip(TABLES, keys, strict=True)}


def init_accumulators(params: dict[str, Array]) -> dict[str, Array]:
    """AdaGrad's squared-gradient sums, started at 1 as glove.c starts them."""
    return {name: jnp.ones_like(table) for name, table in params.items()}


def weighting(counts: Array, x_max: float = 100.0, alpha: float = 0.75) -> Array:
    """f(x) = (x / x_max)^alpha for x < x_max, else 1."""
    return jnp.where(counts < x_max, (counts / x_max) ** alpha, 1.0)


def loss(params: dict[str, Array], rows: Array, cols: Array, weights: Array, log_counts: Array) -> Array:
    """J over a batch: sum of weights * (w_row . w~_col + b_row + b~_col - log X)^2; entries of weight 0 (padding)
    add nothing."""
    dots = precision.einsum("bd,bd->b", params["word"][rows], params["context"][cols])
    diff = dots + params["word_bias"][rows] + params["context_bias"][cols] - log_counts
    return (weights * diff ** 2).sum()


@jax.jit
def adagrad_step(params: dict[str, Array], accumulators: dict[str, Array], rows: Array, cols: Array,
                 weights: Array, log_counts: Array, learning_rate: Array) -> tuple[dict, dict, Array]:
    """glove.c's AdaGrad step over a batch of entries -> (params, accumulators, the batch's J before the step)."""
    value, grads = jax.value_and_grad(loss)(params, rows, cols, weights, log_counts)
    grads = jax.tree.map(lambda g: g / 2, grads)
    new_params = jax.tree.map(lambda p, g, a: p - learning_rate * g / jnp.sqrt(a), params, grads, accumulators)
    new_accumulators = jax.tree.map(lambda a, g: a + (learning_rate * g) ** 2, accumulators, grads)
    return new_params, new_accumulators, value


def word_vectors(params: dict[str, Array]) -> Array:
    """The word vectors: w + w~."""
    return params["word"] + params["context"]
