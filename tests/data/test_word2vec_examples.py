"""word2vec's examples: words, vocabulary, keep probabilities and noise words against their formulas (counts
checked by hand), the reduced window against a hand-checked example, and skip-gram and CBOW examples."""

import numpy as np
import pytest

from ptmjax.data import word2vec_examples as examples


def test_words_lower_case_and_strip_punctuation():
    assert examples.words("Return the (file) Name, or 'None'.\n  ... x") == ["return", "the", "file", "name", "or",
                                                                           "none", "x"]


def test_vocabulary_keeps_min_count_most_frequent_first():
    vocabulary = examples.build_vocabulary([["b", "a", "c", "a"], ["c", "a", "d"]], min_count=2)
    assert vocabulary.words == ("a", "c")
    assert vocabulary.counts.tolist() == [3, 2]
    assert vocabulary.ids(["d", "c", "a", "b"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="min_count=9"):
        examples.build_vocabulary([["a"]], min_count=9)


def test_keep_probabilities_follow_the_formula():
    # total 111, sample 0.01: t = 1.11; (sqrt(100 / 1.11) + 1) * 1.11 / 100 = 0.116457, (sqrt(10 / 1.11) + 1)
    # * 1.11 / 10 = 0.444167, and the rare word's 2.163 is capped at 1.
    np.testing.assert_allclose(examples.keep_probabilities(np.array([100, 10, 1]), 0.01), [0.116457, 0.444167, 1],
                               rtol=1e-5)
    assert examples.keep_probabilities(np.array([100, 10, 1]), 0).tolist() == [1, 1, 1]


def test_keep_probabilities_match_gensim():
    gensim_word2vec = pytest.importorskip("gensim.models.word2vec")
    sentences = [["a"] * 50 + ["b"] * 20 + ["c"] * 5 + ["d"] * 2] * 3
    model = gensim_word2vec.Word2Vec(vector_size=4, min_count=1, sample=0.01)
    model.build_vocab(sentences)
    gensim_keep = [model.wv.get_vecattr(word, "sample_int") / 2**32 for word in "abcd"]
    np.testing.assert_allclose(examples.keep_probabilities(np.array([150, 60, 15, 6]), 0.01), gensim_keep, rtol=1e-6)


def test_noise_distribution_is_counts_to_the_three_quarters():
    noise = examples.noise_distribution(np.array([16, 1, 81]))  # 16 ** 0.75 = 8, 81 ** 0.75 = 27
    np.testing.assert_allclose(noise, np.array([8, 1, 27]) / 36)
    outputs, weights = examples.with_noise(np.array([0] * 20_000, np.int32), noise, 3, np.random.default_rng(0))
    drawn = np.bincount(outputs[:, 1:].ravel(), minlength=3) / outputs[:, 1:].size
    np.testing.assert_allclose(drawn, noise, atol=0.01)
    np.testing.assert_array_equal(weights[:, 1:], outputs[:, 1:] != 0)
    assert (outputs[:, 0] == 0).all() and (weights[:, 0] == 1).all()


def test_reduced_window_contexts_by_hand():
    # Sentence 0 is positions 0-4, sentence 1 positions 5-6; window 2, and a reduction of 1 leaves a window of 1.
    positions, valid = examples.window_contexts(np.array([0, 0, 0, 0, 0, 1, 1]), np.array([0, 1, 0, 1, 0, 0, 1]), 2)
    pairs = {(int(i), int(positions[i, slot])) for i, slot in zip(*np.nonzero(valid), strict=True)}
    assert pairs == {(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (2, 3), (2, 4), (3, 2), (3, 4), (4, 2),
                     (4, 3), (5, 6), (6, 5)}


def test_skipgram_and_cbow_examples_of_window_one():
    sentences = [np.array([7, 8, 9], np.int32), np.array([5], np.int32)]  # window 1: no reduction is drawn
    keep = np.ones(10)
    inputs, mask, targets = examples.epoch_examples(sentences, keep, 1, False, np.random.default_rng(0))
    assert list(zip(inputs[:, 0].tolist(), targets.tolist(), strict=True)) == [(8, 7), (7, 8), (9, 8), (8, 9)]
    assert mask.all()
    inputs, mask, targets = examples.epoch_examples(sentences, keep, 1, True, np.random.default_rng(0))
    assert targets.tolist() == [7, 8, 9]  # the lone word has no context
    assert np.where(mask, inputs, -1).tolist() == [[-1, 8], [7, 9], [8, -1]]


def test_subsampling_drops_words_at_the_keep_rate():
    sentences = [np.zeros(20_000, np.int32)]
    _, _, targets = examples.epoch_examples(sentences, np.array([0.25]), 1, True, np.random.default_rng(0))
    assert abs(len(targets) / 20_000 - 0.25) < 0.01
