"""The code-tagging task: paragraph splits, a hand-tagged docstring, features through seqio, the chance level."""

import collections

import numpy as np
import seqio

from ptmjax.data import docstring_paragraphs, vocabularies
from ptmjax.tasks import tagging

PYDOC_PARAGRAPH = 'Run "pydoc -k <keyword>" to search for a keyword in the synopsis lines of all available modules.'


def test_paragraph_splits_are_disjoint_and_follow_the_hash():
    train = docstring_paragraphs.docstring_paragraphs("train")
    validation = docstring_paragraphs.docstring_paragraphs("validation")
    assert (len(train), len(validation)) == (3228, 362)  # CPython 3.11, as the module doc says
    assert not {words for _, words in train} & {words for _, words in validation}
    assert all(docstring_paragraphs.split_of(" ".join(words)) == "validation" for _, words in validation)
    assert min(len(words) for _, words in train + validation) == docstring_paragraphs.MIN_WORDS
    docstring_paragraphs._all_paragraphs.cache_clear()
    docstring_paragraphs.docstring_paragraphs.cache_clear()
    assert docstring_paragraphs.docstring_paragraphs("validation") == validation  # rebuilt, the same


def test_a_known_docstring_paragraph_gets_its_hand_checked_tags():
    examples = dict(tagging.word_tags("validation"))
    words = tuple(PYDOC_PARAGRAPH.split())
    tags = [tagging.TAGS[i] for i in examples[words]]
    # The quoted command is a 3-word literal; 'synopsis' is pydoc.synopsis, a function of the module it documents.
    assert tags == ["O", "B-LIT", "I-LIT", "I-LIT", "O", "O", "O", "O", "O", "O", "O", "B-IDENT", "O", "O", "O",
                    "O", "O"]


def test_features_put_each_words_tag_on_its_first_piece():
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    words = tuple(PYDOC_PARAGRAPH.split())
    features = tagging.tagging_features(words, dict(tagging.word_tags("validation"))[words], vocabulary)
    inputs, tags = features["inputs"].tolist(), features["tags"]
    assert inputs[-1] == 1 and tags[-1] == -1 and vocabulary.decode(inputs) == PYDOC_PARAGRAPH
    pieces = [vocabulary.tokenizer.id_to_piece(i) for i in inputs[:-1]]
    assert [piece.startswith("▁") for piece in pieces] == (tags[:-1] >= 0).tolist()
    # '"pydoc' is '▁"', 'py', 'doc'; 'synopsis' is '▁', 's', 'y', 'n', 'op', 's', 'i', 's'.
    tagged = [(piece, tagging.TAGS[tag]) for piece, tag in zip(pieces, tags[:-1], strict=True) if tag > 0]
    assert tagged == [('▁"', "B-LIT"), ("▁-", "I-LIT"), ("▁<", "I-LIT"), ("▁", "B-IDENT")]


def test_a_byte_vocabulary_tags_the_space_before_each_later_word():
    words = ("Use", "dumps", "now")
    features = tagging.tagging_features(words, (0, 1, 0), seqio.ByteVocabulary())
    # U s e ␠ d u m p s ␠ n o w EOS: the words' tags sit on 'U' and on the two spaces.
    assert features["tags"].tolist() == [0, -1, -1, 1, -1, -1, -1, -1, -1, 0, -1, -1, -1, -1]
    assert features["inputs"][[3, 9]].tolist() == [ord(" ") + 3] * 2


def test_seqio_dataset_cuts_inputs_tags_and_words_together():
    task = seqio.get_mixture_or_task(tagging.TAGGING_TASK)
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    examples = tagging.word_tags("validation")
    full = [tagging.tagging_features(words, tags, vocabulary) for words, tags in examples]
    cut = list(task.get_dataset({"inputs": 24}, split="validation", shuffle=False).as_numpy_iterator())
    assert len(cut) == len(full) == 362
    for whole, example in zip(full, cut, strict=True):
        assert set(example) == {"inputs", "tags", "words"}
        assert example["inputs"].dtype == example["tags"].dtype == np.int32
        length = min(len(whole["inputs"]), 24)
        np.testing.assert_array_equal(example["inputs"], [*whole["inputs"][: length - 1], 1])
        np.testing.assert_array_equal(example["tags"], [*whole["tags"][: length - 1], -1])
        assert [w.decode() for w in example["words"]] == list(whole["words"][: (example["tags"] >= 0).sum()])
    assert sum(len(whole["inputs"]) > 24 for whole in full) > 100  # the cut is exercised


def test_tag_counts_and_the_all_outside_chance_level():
    counts = collections.Counter(tag for _, tags in tagging.word_tags("validation") for tag in tags)
    assert sum(counts.values()) == 8553 and counts[0] == 7789
    assert tagging.all_outside_baseline() == {"token_accuracy": 100 * 7789 / 8553, "span_precision": 0.0,
                                                   "span_recall": 0.0, "span_f1": 0.0}
