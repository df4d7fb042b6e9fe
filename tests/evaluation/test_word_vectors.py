"""Analogy and similarity scores on gensim's shipped sets equal gensim's own `evaluate_word_analogies` and
`evaluate_word_pairs` on the same vectors, restriction and coverage included."""

import numpy as np
import pytest

from ptmjax.evaluation import word_vectors

keyedvectors = pytest.importorskip("gensim.models.keyedvectors")


def gensim_vectors(words, vectors):
    kv = keyedvectors.KeyedVectors(vectors.shape[1])
    kv.add_vectors(list(words), vectors)
    return kv


def analogy_vectors():
    """The words of the first section (capitals and their countries), then half of the analogy file's other
    words in a shuffled order, with random vectors, each country placed at its capital plus one shared offset, so
    that many answers are right."""
    path = word_vectors.gensim_test_file(word_vectors.ANALOGIES)
    questions = word_vectors.analogy_questions(path)
    rng = np.random.default_rng(0)
    capitals = sorted({word for question in questions[:506] for word in question})  # capital-common-countries
    others = sorted({word for question in questions for word in question} - set(capitals))
    words = capitals + [others[i] for i in rng.permutation(len(others))[:len(others) // 2]]
    vectors = rng.normal(size=(len(words), 24)).astype(np.float32)
    index, offset = {word: i for i, word in enumerate(words)}, rng.normal(size=24) * 2
    for capital, country, *_ in questions[:506]:
        vectors[index[country]] = vectors[index[capital]] + offset + rng.normal(size=24) * 0.3
    return path, words, vectors


@pytest.mark.parametrize("restrict_vocab", [300_000, 150])
def test_analogy_accuracy_equals_gensims(restrict_vocab):
    path, words, vectors = analogy_vectors()
    ours = word_vectors.analogy_accuracy(words, vectors, path, restrict_vocab=restrict_vocab)
    score, sections = gensim_vectors(words, vectors).evaluate_word_analogies(path, restrict_vocab=restrict_vocab)
    total = sections[-1]
    assert ours["correct"] == len(total["correct"]) > 20
    assert ours["answered"] == len(total["correct"]) + len(total["incorrect"])
    assert ours["accuracy"] == pytest.approx(score, abs=1e-12)
    assert ours["questions"] == 19_544
    assert ours["coverage"] == ours["answered"] / 19_544


@pytest.mark.parametrize("name", sorted(word_vectors.SIMILARITY_SETS))
def test_similarity_correlation_equals_gensims(name):
    path = word_vectors.gensim_test_file(word_vectors.SIMILARITY_SETS[name])
    pairs = word_vectors.word_pairs(path)
    rng = np.random.default_rng(1)
    words = sorted({word for a, b, _ in pairs for word in (a, b)})
    words = [words[i] for i in rng.permutation(len(words))[:len(words) * 3 // 4]]
    vectors = rng.normal(size=(len(words), 16)).astype(np.float32)
    for a, b, score in pairs:  # the pairs scored higher by people drawn nearer, so the correlation is not zero
        if a in words and b in words:
            vectors[words.index(b)] += vectors[words.index(a)] * score / 10
    ours = word_vectors.similarity_correlation(words, vectors, path)
    _, spearman, oov_percent = gensim_vectors(words, vectors).evaluate_word_pairs(path)
    assert ours["spearman"] == pytest.approx(spearman.statistic, abs=1e-12)
    assert ours["spearman"] > 0.1
    assert ours["coverage"] == pytest.approx(1 - oov_percent / 100, abs=1e-12)


def test_missing_file_names_the_fix():
    with pytest.raises(FileNotFoundError, match="no test_data/nothing.txt"):
        word_vectors.gensim_test_file("nothing.txt")
