"""Training GloVe on sentences of words, by default the embedded stdlib corpus, deterministically from a seed.

The vocabulary is word2vec's (`word2vec_examples.build_vocabulary`, `min_count`); the co-occurrence counts are
data/cooccurrence.py's. Each epoch shuffles the nonzero entries, cuts them into batches of `batch` and runs
`word2vec.CHUNK` batches per jitted `lax.scan` of `adagrad_step` (models/glove.py); the last chunk is padded with
entries of weight 0. The result is word2vec's `WordVectors` (the vectors w + w~), so `nearest`, the evaluation
(evaluation/word_vectors.py) and `params_with_word_vectors` take it as they take word2vec's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.data import cooccurrence, word2vec_examples
from ptmjax.models.glove import adagrad_step, init_accumulators, init_params, weighting, word_vectors
from ptmjax.training.word2vec import WordVectors, corpus_sentences, padded_chunks, require_at_least_one


@dataclasses.dataclass(frozen=True)
class GloVeConfig:
    """The reference glove code's settings (window 10, x_max 100, alpha 3/4, AdaGrad at 0.05); `batch` entries
    take one step together."""

    dim: int = 100
    window: int = 10
    min_count: int = 5
    x_max: float = 100.0
    alpha: float = 0.75
    learning_rate: float = 0.05
    epochs: int = 25
    batch: int = 512
    seed: int = 0

    def __post_init__(self):
        require_at_least_one(self, ("dim", "window", "epochs", "batch"))
        for name in ("x_max", "alpha", "learning_rate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive (the reference code's: x_max 100, "
                                 "alpha 0.75, learning_rate 0.05)")


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _train_chunk(params: dict, accumulators: dict, batches: tuple[jax.Array, ...],
                 learning_rate: jax.Array) -> tuple[dict, dict, jax.Array]:
    """`adagrad_step` over each batch of `batches` (stacked [CHUNK, batch]) -> (params, accumulators, each
    batch's J)."""
    def step(state, batch):
        params, accumulators, value = adagrad_step(*state, *batch, learning_rate)
        return (params, accumulators), value

    (params, accumulators), values = jax.lax.scan(step, (params, accumulators), batches)
    return params, accumulators, values


def train_glove(config: GloVeConfig, sentences: Sequence[Sequence[str]] | None = None) -> WordVectors:
    """GloVe vectors trained on `sentences` (default: `word2vec.corpus_sentences('train')`) under `config`;
    `losses` are each epoch's mean J per nonzero entry."""
    sentences = corpus_sentences() if sentences is None else sentences
    vocabulary = word2vec_examples.build_vocabulary(sentences, config.min_count)
    start = time.perf_counter()
    rows, cols, counts = cooccurrence.cooccurrences([vocabulary.ids(s) for s in sentences], len(vocabulary.words),
                                                    config.window)
    if not len(counts):
        raise ValueError(f"no two words of the {len(vocabulary.words)}-word vocabulary share a window; give "
                         f"longer sentences or lower min_count (now {config.min_count})")
    weights = np.asarray(weighting(jnp.asarray(counts, jnp.float32), config.x_max, config.alpha))
    log_counts = np.log(counts).astype(np.float32)
    rng = np.random.default_rng(config.seed)
    params = init_params(jax.random.key(config.seed), len(vocabulary.words), config.dim)
    accumulators = init_accumulators(params)
    learning_rate, losses = jnp.float32(config.learning_rate), []
    for _ in range(config.epochs):
        order = rng.permutation(len(counts))
        epoch_loss = []
        for chunk in padded_chunks((rows[order], cols[order], weights[order], log_counts[order]), config.batch):
            params, accumulators, values = _train_chunk(params, accumulators, chunk, learning_rate)
            epoch_loss.append(values.sum())
        losses.append(jnp.stack(epoch_loss).sum())
    vectors = np.asarray(word_vectors(params))
    mean_losses = tuple(float(total) / len(counts) for total in losses)
    return WordVectors(vocabulary, vectors, mean_losses, time.perf_counter() - start)
