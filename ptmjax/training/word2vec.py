"""Training word2vec (skip-gram or CBOW with negative sampling) on sentences of words, by default the embedded
stdlib corpus, deterministically from a seed.

Each epoch draws its examples afresh (subsampling, reduced windows and noise words: data/word2vec_examples.py)
in corpus order, cuts them into batches of `batch` examples and runs `CHUNK` batches per jitted `lax.scan` of
`sgd_step` (models/word2vec.py); the last chunk is padded with examples of weight 0. The learning rate falls
linearly from `alpha` to `min_alpha` over the run's batches, as gensim's over its words. The result keeps the
input table as the word vectors, with `nearest` for inspection.

A model's input embedding table takes the vectors of the words its vocabulary has (`params_with_word_vectors`):
row i becomes the vector of id i's word (`sentencepiece_words`: the pieces that start a word), all such rows
scaled together to the root mean square of the rows they replace, so that the table keeps its initial scale;
the dimensions must agree.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from ptmjax import tree_paths
from ptmjax.data import corpus, word2vec_examples
from ptmjax.data.word2vec_examples import Vocabulary
from ptmjax.models.word2vec import init_tables, nearest, sgd_step

ARCHITECTURES = ("skipgram", "cbow")
CHUNK = 32  # batches per jitted scan


@dataclasses.dataclass(frozen=True)
class Word2VecConfig:
    """gensim `Word2Vec`'s settings of the same names (architecture: its `sg`; dim: its `vector_size`;
    negatives: its `negative`); `batch` examples take one SGD step together."""

    architecture: str = "skipgram"
    dim: int = 100
    window: int = 5
    negatives: int = 5
    min_count: int = 5
    sample: float = 1e-3
    epochs: int = 5
    alpha: float = 0.025
    min_alpha: float = 0.0001
    batch: int = 128
    seed: int = 0

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={self.architecture!r} is not one of {ARCHITECTURES}")
        require_at_least_one(self, ("dim", "window", "negatives", "epochs", "batch"))


def require_at_least_one(config: Any, names: Sequence[str]) -> None:
    """Raises ValueError naming the first of `config`'s fields `names` below 1."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)} must be at least 1")


@dataclasses.dataclass(frozen=True)
class WordVectors:
    """Trained word vectors: row i of `vectors` is `vocabulary.words[i]`'s; `losses` is each epoch's mean loss
    per example; `seconds` the training time."""

    vocabulary: Vocabulary
    vectors: np.ndarray
    losses: tuple[float, ...]
    seconds: float

    def nearest(self, word: str, topn: int = 10) -> list[tuple[str, float]]:
        """The `topn` words nearest to `word` by cosine, with their cosines."""
        index = self.vocabulary.index
        if word not in index:
            raise KeyError(f"{word!r} is not in the vocabulary of {len(index)} words; lower min_count or pick another")
        ids, cosines = nearest(jnp.asarray(self.vectors), jnp.array([index[word]]), topn)
        return [(self.vocabulary.words[i], float(c)) for i, c in zip(ids[0].tolist(), cosines[0].tolist(), strict=True)]


def corpus_sentences(split: str = "train") -> list[list[str]]:
    """The embedded corpus's documents as sentences of words (`word2vec_examples.words`)."""
    return [word2vec_examples.words(document) for document in corpus.stdlib_docstrings(split)]


@functools.partial(jax.jit, donate_argnums=0)
def _train_chunk(tables: dict[str, jax.Array], batches: tuple[jax.Array, ...]) -> tuple[dict, jax.Array]:
    """`sgd_step` over each batch of `batches` (stacked [CHUNK, batch, ...], the learning rates last) -> (tables,
    each batch's summed loss)."""
    return jax.lax.scan(lambda state, batch: sgd_step(state, *batch), tables, batches)


def padded_chunks(arrays: tuple[np.ndarray, ...], batch: int) -> list[tuple[np.ndarray, ...]]:
    """`arrays` (one row per example) padded with zero rows to whole chunks, cut into [CHUNK, batch, ...]."""
    rows = batch * CHUNK
    padded = -(-len(arrays[0]) // rows) * rows
    arrays = tuple(np.concatenate([a, np.zeros((padded - len(a), *a.shape[1:]), a.dtype)]) for a in arrays)
    return [tuple(a[i:i + rows].reshape(CHUNK, batch, *a.shape[1:]) for a in arrays) for i in range(0, padded, rows)]


def train_word2vec(config: Word2VecConfig, sentences: Sequence[Sequence[str]] | None = None) -> WordVectors:
    """Word vectors trained on `sentences` (default: `corpus_sentences('train')`) under `config`."""
    sentences = corpus_sentences() if sentences is None else sentences
    vocabulary = word2vec_examples.build_vocabulary(sentences, config.min_count)
    ids = [s for s in map(vocabulary.ids, sentences) if len(s)]
    keep = word2vec_examples.keep_probabilities(vocabulary.counts, config.sample)
    noise = word2vec_examples.noise_distribution(vocabulary.counts)
    rng = np.random.default_rng(config.seed)
    tables = init_tables(jax.random.key(config.seed), len(vocabulary.words), config.dim)
    start, losses = time.perf_counter(), []
    for epoch in range(config.epochs):
        inputs, mask, targets = word2vec_examples.epoch_examples(ids, keep, config.window,
                                                                 config.architecture == "cbow", rng)
        if not len(targets):
            raise ValueError(f"epoch {epoch} drew no examples from {sum(map(len, ids))} words; lower sample "
                             f"(now {config.sample}; 0 keeps every word) or give more sentences")
        outputs, weights = word2vec_examples.with_noise(targets, noise, config.negatives, rng)
        batches = -(-len(targets) // config.batch)
        progress = (epoch + np.arange(batches) / batches) / config.epochs
        alphas = np.repeat(config.alpha - (config.alpha - config.min_alpha) * progress, config.batch)[:len(targets)]
        chunk_losses = []  # left on the device, unread, so that the next epoch's examples are drawn meanwhile
        for chunk in padded_chunks((inputs, mask, outputs, weights, alphas.astype(np.float32)), config.batch):
            tables, chunk_loss = _train_chunk(tables, tuple(chunk[:4]) + (chunk[4][:, 0],))
            chunk_losses.append(chunk_loss.sum())
        losses.append((jnp.stack(chunk_losses).sum(), len(targets)))
    vectors = np.asarray(tables["input"])
    mean_losses = tuple(float(total) / count for total, count in losses)
    return WordVectors(vocabulary, vectors, mean_losses, time.perf_counter() - start)


def sentencepiece_words(vocabulary: Any) -> list[str | None]:
    """Each id's word for `embedding_with_word_vectors`: a SentencePiece piece that starts a word ('▁File') read
    as `word2vec_examples.words` reads text ('file'), None for the rest (pieces inside words, control pieces)."""
    tokenizer = getattr(vocabulary, "tokenizer", None)
    if not hasattr(tokenizer, "id_to_piece"):
        raise ValueError(f"sentencepiece_words needs a SentencePiece vocabulary (with .tokenizer.id_to_piece); got "
                         f"{vocabulary!r}; pass one word (or None) per id to embedding_with_word_vectors instead")
    words = []
    for i in range(tokenizer.get_piece_size()):
        piece = tokenizer.id_to_piece(i)
        found = word2vec_examples.words(piece[1:]) if piece.startswith("▁") else []
        words.append(found[0] if len(found) == 1 else None)
    return words


def embedding_with_word_vectors(table: np.ndarray, words: Sequence[str | None],
                                vectors: WordVectors) -> tuple[np.ndarray, np.ndarray]:
    """`table` [rows, dim] with row i set to the vector of `words[i]` wherever word2vec has one, those rows scaled
    together to the root mean square of the rows they replace -> (the new table, the ids set)."""
    table = np.array(table, np.float32)
    if table.shape[1] != vectors.vectors.shape[1]:
        raise ValueError(f"the word vectors have {vectors.vectors.shape[1]} dimensions and the table "
                         f"{table.shape[1]}; train word2vec with dim={table.shape[1]}")
    if len(words) > len(table):
        raise ValueError(f"{len(words)} words for a table of {len(table)} rows; give one word (or None) per row")
    index = vectors.vocabulary.index
    ids = np.array([i for i, word in enumerate(words) if word in index], np.int64)
    if len(ids):
        rows = vectors.vectors[[index[words[i]] for i in ids]]
        table[ids] = rows * np.sqrt(np.mean(table[ids] ** 2) / np.mean(rows ** 2))
    return table, ids


def params_with_word_vectors(params: dict, path: str, words: Sequence[str | None],
                             vectors: WordVectors) -> tuple[dict, np.ndarray]:
    """The (unboxed) parameters `params` with their embedding table at `path` (e.g. 'token_embedder/embedding')
    given the word vectors (`embedding_with_word_vectors`), in its dtype -> (the parameters, the ids set)."""
    leaves = dict(tree_paths.leaves_by_path(params))
    if path not in leaves:
        tables = [p for p, leaf in leaves.items() if "embed" in p and np.ndim(leaf) == 2]
        raise KeyError(f"no parameter {path!r}; the embedding tables here are {tables}")
    table, ids = embedding_with_word_vectors(np.asarray(leaves[path]), words, vectors)
    replaced = traverse_util.unflatten_dict({path: jnp.asarray(table, leaves[path].dtype)}, sep="/")
    return tree_paths.overlay(params, replaced), ids
