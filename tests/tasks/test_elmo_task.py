"""ELMo's rows: the word vocabulary and its character ids, the task's rows of words and characters, and the
feature converter's targets and weights of both directions, against hand-built expectations."""

import numpy as np
import pytest

from ptmjax.data import pipeline, word2vec_examples
from ptmjax.data.bidirectional_lm_converter import BidirectionalLmFeatureConverter
from ptmjax.data.word_vocabulary import (
    BEGIN_WORD,
    CHARACTER_OFFSET,
    END_WORD,
    EOS_ID,
    NUM_CHARACTERS,
    UNK_ID,
    WordVocabulary,
    character_ids,
)
from ptmjax.models.elmo import NUM_CHARACTERS as MODEL_CHARACTERS
from ptmjax.tasks.elmo import ELMO_TASK

LENGTH, BATCH = 12, 6


@pytest.fixture(scope="module")
def vocabulary() -> WordVocabulary:
    return pipeline.task_vocabulary(ELMO_TASK)


def test_character_ids_by_hand():
    expected = [BEGIN_WORD, *(b + CHARACTER_OFFSET for b in "é1".encode()), END_WORD, 0, 0]
    assert character_ids("é1", 7).tolist() == expected
    assert character_ids("abcdefgh", 5).tolist() == [BEGIN_WORD, *(b + CHARACTER_OFFSET for b in b"abc"), END_WORD]
    assert NUM_CHARACTERS == MODEL_CHARACTERS


def test_vocabulary_ids_text_and_tf_encoding(vocabulary):
    assert vocabulary.vocab_size == 4000 and vocabulary.words[0] == "the"
    text = "Return THE value, of zzzqqq."
    ids = vocabulary.encode(text)
    assert ids == [vocabulary.words.index(w) + 3 if w in vocabulary.words else UNK_ID
                   for w in word2vec_examples.words(text)]
    assert ids[-1] == UNK_ID and vocabulary.decode(ids) == "return the value of <unk>"
    np.testing.assert_array_equal(vocabulary.encode_tf(text).numpy(), ids)
    assert vocabulary.decode_tf(np.array(ids + [EOS_ID, 0])).numpy().decode() == "return the value of <unk>"
    ids, chars = vocabulary.encode_with_characters(text)
    np.testing.assert_array_equal(chars[:-1], vocabulary.character_table[ids[:-1]])
    np.testing.assert_array_equal(chars[-1], character_ids("zzzqqq", 16))  # an unknown word keeps its characters


def test_rows_and_both_directions_targets(vocabulary):
    dataset = pipeline.get_dataset(ELMO_TASK, "validation", {"targets": LENGTH}, BATCH, seed=0, shuffle=False,
                                   pack=False, feature_converter=BidirectionalLmFeatureConverter)
    batch = next(dataset.as_numpy_iterator())
    tokens = batch["input_tokens"]
    assert batch["input_chars"].shape == (BATCH, LENGTH, 16)
    known = (tokens != UNK_ID) & (tokens != 0)
    np.testing.assert_array_equal(batch["input_chars"][known], vocabulary.character_table[tokens[known]])
    assert np.all(batch["input_chars"][tokens == 0] == 0)
    for row, words in enumerate(tokens):
        n = int((words != 0).sum())
        assert np.all(words[:n] != 0) and np.all(words[n:] == 0)  # right-padded
        forward = np.zeros(LENGTH, int)
        forward[: n - 1] = 1
        np.testing.assert_array_equal(batch["forward_weights"][row], forward)
        np.testing.assert_array_equal(batch["backward_weights"][row], np.roll(forward, 1))
        np.testing.assert_array_equal(batch["forward_targets"][row][: n - 1], words[1:n])
        np.testing.assert_array_equal(batch["backward_targets"][row][1:n], words[: n - 1])
    # The first document's words, then EOS, cut into rows of LENGTH words.
    text = pipeline.get_task_or_mixture(ELMO_TASK).source.get_dataset("validation", shuffle=False)
    first = next(text.as_numpy_iterator())["text"].decode()
    np.testing.assert_array_equal(np.concatenate([tokens[0], tokens[1]])[: len(vocabulary.encode(first)) + 1][:24],
                                  (vocabulary.encode(first) + [EOS_ID])[:24])


def test_converter_refuses_packing():
    with pytest.raises(ValueError, match="train.pack = False"):
        BidirectionalLmFeatureConverter(pack=True)
