"""word2vec trained on the embedded corpus: deterministic from its seed, its loss falls, and (skip-gram) words
that often occur together end nearer than random pairs of frequent words; nearest neighbours by cosine; a model's
input table initialised from the vectors."""

import collections
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.models import GPT2, GPT2Config
from ptmjax.training import word2vec


@functools.cache
def trained(architecture: str) -> word2vec.WordVectors:
    return word2vec.train_word2vec(word2vec.Word2VecConfig(architecture=architecture, dim=32, epochs=5))


def frequent_pairs(sentences, frequent: set[str], most: int) -> list[tuple[str, str]]:
    """The `most` commonest pairs of distinct frequent words at distance 1 or 2."""
    counts = collections.Counter()
    for sentence in sentences:
        for i, word in enumerate(sentence):
            for other in sentence[i + 1:i + 3]:
                if word != other and word in frequent and other in frequent:
                    counts[tuple(sorted((word, other)))] += 1
    return [pair for pair, _ in counts.most_common(most)]


@pytest.mark.parametrize("architecture", ["skipgram", "cbow"])
def test_training_lowers_the_loss(architecture):
    losses = trained(architecture).losses
    assert losses[-1] < losses[0] - 0.2


def test_skipgram_brings_co_occurring_words_nearer_than_random_pairs():
    """Cosines of the vectors less their mean: on a corpus this small every vector shares one large direction
    (gensim's too), which raw cosines mostly measure."""
    result = trained("skipgram")
    words, index = result.vocabulary.words[:300], result.vocabulary.index
    centred = result.vectors - result.vectors.mean(0)
    unit = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    together = frequent_pairs(word2vec.corpus_sentences(), set(words), 100)
    rng = np.random.default_rng(0)
    random_pairs = [tuple(rng.choice(words, 2, replace=False)) for _ in range(1000)]
    cosine = lambda pairs: np.mean([unit[index[a]] @ unit[index[b]] for a, b in pairs])  # noqa: E731
    assert cosine(together) > cosine(random_pairs) + 0.15


def test_same_seed_same_vectors_and_nearest_by_cosine():
    sentences = [["a", "b", "c", "d", "a", "b"], ["c", "d", "a", "e"]] * 20
    config = word2vec.Word2VecConfig(dim=8, window=2, min_count=1, sample=0, epochs=2, batch=16)
    first, second = word2vec.train_word2vec(config, sentences), word2vec.train_word2vec(config, sentences)
    np.testing.assert_array_equal(first.vectors, second.vectors)
    other = word2vec.train_word2vec(dataclasses.replace(config, seed=1), sentences)
    assert not np.array_equal(first.vectors, other.vectors)
    neighbours = first.nearest("a", topn=4)
    unit = first.vectors / np.linalg.norm(first.vectors, axis=1, keepdims=True)
    query = unit[first.vocabulary.index["a"]]
    cosines = {word: float(query @ unit[i]) for i, word in enumerate(first.vocabulary.words)}
    assert [word for word, _ in neighbours] == sorted(set(cosines) - {"a"}, key=lambda w: -cosines[w])
    np.testing.assert_allclose([c for _, c in neighbours], [cosines[w] for w, _ in neighbours], rtol=1e-5)
    with pytest.raises(KeyError, match="'zebra' is not in the vocabulary"):
        first.nearest("zebra")


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="epoch 0 drew no examples from 2 words; lower sample"):
        word2vec.train_word2vec(word2vec.Word2VecConfig(min_count=1, sample=1e-3), [["a", "b"]])
    with pytest.raises(ValueError, match="architecture='glove'"):
        word2vec.Word2VecConfig(architecture="glove")
    with pytest.raises(ValueError, match="window=0"):
        word2vec.Word2VecConfig(window=0)


class Pieces:
    """A stand-in for a seqio SentencePiece vocabulary: `.tokenizer.id_to_piece` and `.get_piece_size`."""

    def __init__(self, pieces):
        self.tokenizer, self.pieces = self, pieces

    def id_to_piece(self, i):
        return self.pieces[i]

    def get_piece_size(self):
        return len(self.pieces)


def test_sentencepiece_words_are_the_pieces_that_start_a_word():
    words = word2vec.sentencepiece_words(Pieces(["<pad>", "</s>", "▁File", "ile", "▁(", "▁a,b", "▁the."]))
    assert words == [None, None, "file", None, None, "a,b", "the"]  # as word2vec reads text
    with pytest.raises(ValueError, match="needs a SentencePiece vocabulary"):
        word2vec.sentencepiece_words(object())


def test_a_models_input_table_takes_the_word_vectors_at_its_scale():
    sentences = [["a", "b", "c", "d", "a", "b"], ["c", "d", "a", "e"]] * 20
    vectors = word2vec.train_word2vec(word2vec.Word2VecConfig(dim=8, window=2, min_count=1, sample=0, epochs=1),
                                      sentences)
    model = GPT2(GPT2Config(vocab_size=8, d_model=8, num_heads=2, num_layers=1, d_ff=16, max_length=8))
    tokens = jnp.array([[1, 2, 3]])
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens))["params"]
    words = [None, "a", "zebra", "c", None, "e"]  # rows 6 and 7 have no word
    new, ids = word2vec.params_with_word_vectors(params, "token_embedder/embedding", words, vectors)
    old_table = np.asarray(params["token_embedder"]["embedding"])
    new_table = np.asarray(new["token_embedder"]["embedding"])
    assert ids.tolist() == [1, 3, 5]
    np.testing.assert_array_equal(np.delete(new_table, ids, 0), np.delete(old_table, ids, 0))
    rows = vectors.vectors[[vectors.vocabulary.index[w] for w in ("a", "c", "e")]]
    scale = new_table[1, 0] / rows[0, 0]
    np.testing.assert_allclose(new_table[ids], rows * scale, rtol=1e-5)
    np.testing.assert_allclose(np.mean(new_table[ids] ** 2), np.mean(old_table[ids] ** 2), rtol=1e-5)
    assert np.isfinite(np.asarray(model.apply({"params": new}, tokens))).all()
    with pytest.raises(KeyError, match="the embedding tables here are"):
        word2vec.params_with_word_vectors(params, "embedding", words, vectors)
    with pytest.raises(ValueError, match="train word2vec with dim=4"):
        word2vec.embedding_with_word_vectors(np.zeros((6, 4)), words, vectors)

