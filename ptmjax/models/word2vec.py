"""word2vec's maths (Mikolov et al., 2013): negative sampling, its SGD step, cosine neighbours and analogies.

Two tables of [vocabulary, dim]: 'input' (the word vectors, word2vec.c's syn0, started uniform in
+-0.5/dim) and 'output' (syn1neg, started at zero). An example is a set of input words (one centre word
for skip-gram; the context words, averaged, for CBOW) and 1 + K output words: the word to predict, then K
noise words, each with a weight (0 drops a noise word equal to the predicted one, as word2vec.c does, and
pads). Its loss is -log sigmoid(u_o . h) - sum_k log sigmoid(-u_k . h), with h the mean of the input rows.

`sgd_step` is word2vec.c's update for a batch of examples at once, summed where rows repeat: each output
row moves by -alpha times its gradient, and each input row by -alpha times h's gradient, undivided for CBOW
(word2vec.c's `cbow_mean` convention, which gensim keeps). Neighbours and analogies are by cosine;
`analogy_predictions` is 3CosAdd over the first `restrict` rows as gensim's `most_similar` computes it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ptmjax.layers import precision

Array = jax.Array


def init_tables(key: Array, vocabulary_size: int, dim: int) -> dict[str, Array]:
    """{'input': uniform in +-0.5/dim, 'output': zeros}, both [vocabulary_size, dim] float32."""
    bound = 0.5 / dim
    return {"input": jax.random.uniform(key, (vocabulary_size, dim), jnp.float32, -bound, bound),
            "output": jnp.zeros((vocabulary_size, dim), jnp.float32)}


def hidden(input_rows: Array, input_mask: Array) -> Array:
    """The mean of each example's input rows: [B, C, D] rows, [B, C] mask -> [B, D]."""
    count = jnp.maximum(input_mask.sum(-1, keepdims=True), 1)
    return (input_rows * input_mask[..., None]).sum(1) / count


def negative_sampling_loss(h: Array, output_rows: Array, weights: Array) -> Array:
    """Summed -log sigmoid(u_0 . h) - sum_k log sigmoid(-u_k . h): h [B, D], output rows [B, 1+K, D] (the
    predicted word first), weights [B, 1+K]."""
    logits = precision.einsum("bd,bkd->bk", h, output_rows)
    signs = jnp.concatenate([jnp.ones_like(logits[:, :1]), -jnp.ones_like(logits[:, 1:])], axis=1)
    return -(weights * jax.nn.log_sigmoid(signs * logits)).sum()


@jax.jit
def sgd_step(tables: dict[str, Array], inputs: Array, input_mask: Array, outputs: Array, weights: Array,
             alpha: Array) -> tuple[dict[str, Array], Array]:
    """One SGD step over a batch -> (new tables, the batch's summed loss before the step).

    inputs [B, C] int32 (C = 1 for skip-gram) with input_mask [B, C]; outputs [B, 1+K] int32 with weights.
    """
    h = hidden(tables["input"][inputs], input_mask)
    loss, (grad_h, grad_out) = jax.value_and_grad(negative_sampling_loss, argnums=(0, 1))(
        h, tables["output"][outputs], weights)
    input_updates = -alpha * grad_h[:, None, :] * input_mask[..., None]
    return {"input": tables["input"].at[inputs].add(input_updates),
            "output": tables["output"].at[outputs].add(-alpha * grad_out)}, loss


def unit_rows(vectors: Array) -> Array:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    norms = jnp.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / jnp.where(norms > 0, norms, 1)


def nearest(vectors: Array, queries: Array, topn: int) -> tuple[Array, Array]:
    """The `topn` rows nearest by cosine to each query row, the query itself left out -> (ids, cosines),
    both [Q, topn]. `queries` are row ids [Q]."""
    unit = unit_rows(vectors)
    cosines = precision.einsum("qd,vd->qv", unit[queries], unit)
    cosines = cosines.at[jnp.arange(queries.shape[0]), queries].set(-jnp.inf)
    best, ids = jax.lax.top_k(cosines, topn)
    return ids, best


@functools.partial(jax.jit, static_argnames="restrict")
def analogy_predictions(vectors: Array, a: Array, b: Array, c: Array, restrict: int) -> Array:
    """3CosAdd for 'a is to b as c is to ?': the row among the first `restrict` whose cosine to
    unit(unit(b) + unit(c) - unit(a)) is largest, a, b and c left out. a, b, c: row ids [Q] -> ids [Q]."""
    unit = unit_rows(vectors)
    target = unit_rows(unit[b] + unit[c] - unit[a])
    scores = precision.einsum("qd,vd->qv", target, unit[:restrict])
    rows = jnp.arange(a.shape[0])
    for question_words in (a, b, c):
        scores = scores.at[rows, question_words].set(-jnp.inf, mode="drop")
    return scores.argmax(-1)
