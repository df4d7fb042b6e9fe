"""GloVe trained on the embedded corpus: its loss falls, the pairs that co-occur most end nearer than random pairs
of frequent words, the same seed gives the same vectors, and the vectors go where word2vec's go (nearest
neighbours, the standard sets' scores, a model's input table)."""

import dataclasses
import functools

import numpy as np
import pytest

from ptmjax.data import cooccurrence
from ptmjax.evaluation import word_vectors
from ptmjax.training import glove, word2vec


@functools.cache
def trained() -> word2vec.WordVectors:
    return glove.train_glove(glove.GloVeConfig(dim=32, epochs=10))


def test_training_lowers_the_loss():
    losses = trained().losses
    assert losses[-1] < 0.7 * losses[0]


def test_high_co_occurrence_pairs_end_nearer_than_random_pairs():
    """Cosines of the 300 commonest words' vectors less their mean, as word2vec's test centres: here they share
    one large direction (raw cosines of random pairs about 0.8), which the rare words' near-initial vectors
    leave out of the whole vocabulary's mean."""
    result = trained()
    sentences = [result.vocabulary.ids(s) for s in word2vec.corpus_sentences()]
    rows, cols, counts = cooccurrence.cooccurrences(sentences, len(result.vocabulary.words))
    frequent = (rows < 300) & (cols < 300) & (rows < cols)
    top = np.argsort(-counts[frequent], kind="stable")[:100]
    together = list(zip(rows[frequent][top], cols[frequent][top], strict=True))
    rng = np.random.default_rng(0)
    random_pairs = [tuple(rng.choice(300, 2, replace=False)) for _ in range(1000)]
    centred = result.vectors[:300] - result.vectors[:300].mean(0)
    unit = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    cosine = lambda pairs: np.mean([unit[a] @ unit[b] for a, b in pairs])  # noqa: E731
    assert cosine(together) > cosine(random_pairs) + 0.5


def test_same_seed_same_vectors_and_nearest_by_cosine():
    sentences = [["a", "b", "c", "d", "a", "b"], ["c", "d", "a", "e"]] * 20
    config = glove.GloVeConfig(dim=8, window=3, min_count=1, epochs=3, batch=4)
    first, second = glove.train_glove(config, sentences), glove.train_glove(config, sentences)
    np.testing.assert_array_equal(first.vectors, second.vectors)
    assert not np.array_equal(first.vectors, glove.train_glove(dataclasses.replace(config, seed=1), sentences).vectors)
    assert len(first.losses) == 3 and first.vectors.shape == (5, 8)
    assert {word for word, _ in first.nearest("a", topn=4)} == {"b", "c", "d", "e"}


def test_config_and_sentences_refuse_bad_values():
    with pytest.raises(ValueError, match="x_max=0 must be positive"):
        glove.GloVeConfig(x_max=0)
    with pytest.raises(ValueError, match="window=0 must be at least 1"):
        glove.GloVeConfig(window=0)
    with pytest.raises(ValueError, match="no two words of the 1-word vocabulary share a window"):
        glove.train_glove(glove.GloVeConfig(min_count=1), [["a"], ["a"]])


def test_the_vectors_score_on_the_standard_sets_and_fill_an_input_table():
    pytest.importorskip("gensim")
    result = trained()
    scores = word_vectors.standard_scores(result.vocabulary.words, result.vectors)
    assert scores["analogies"]["answered"] > 50 and 0 <= scores["analogies"]["accuracy"] <= 1
    assert scores["SimLex-999"]["pairs"] > 20 and -1 <= scores["SimLex-999"]["spearman"] <= 1
    table, ids = word2vec.embedding_with_word_vectors(np.ones((6, 32)), [None, "file", "zebra", "the"], result)
    assert ids.tolist() == [1, 3]
    np.testing.assert_allclose(np.mean(table[ids] ** 2), 1, rtol=1e-5)
