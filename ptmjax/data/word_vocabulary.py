"""A word-level seqio vocabulary of the embedded corpus, with each word's character ids (ELMo's inputs).

Words are those of word2vec (`word2vec_examples.words`: lower-cased whitespace tokens, ASCII punctuation
stripped from both ends). Ids: pad 0, EOS 1, unknown word 2, then the `size - 3` most frequent words of the
train split (ties in order of first appearance). `vocab_size == size` whatever the corpus.

Character ids of a word ([max_characters], as ELMo's `UnicodeCharsVocabulary`): beginning-of-word, the UTF-8
bytes of the word (byte b -> b + CHARACTER_OFFSET, cut to max_characters - 2), end-of-word, then padding 0.
EOS and the unknown word have one special character between the markers; padding tokens are all 0. Text keeps
the characters of a word outside the vocabulary (`encode_with_characters`); ids alone give those of '<unk>'.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import seqio
import tensorflow as tf

from ptmjax.data import corpus, word2vec_examples

EOS_ID, UNK_ID, NUM_SPECIAL_IDS = 1, 2, 3
PAD_CHARACTER, BEGIN_WORD, END_WORD, EOS_CHARACTER, UNK_CHARACTER = 0, 1, 2, 3, 4
CHARACTER_OFFSET = 6  # bytes start after the special characters (5 reserved)
NUM_CHARACTERS = 256 + CHARACTER_OFFSET
UNK_WORD = "<unk>"


def character_ids(word: str, max_characters: int) -> np.ndarray:
    """int32 [max_characters]: BOW, the word's UTF-8 bytes (cut to max_characters - 2), EOW, padding."""
    data = np.frombuffer(word.encode("utf-8"), np.uint8)[: max_characters - 2].astype(np.int32) + CHARACTER_OFFSET
    return _marked(data, max_characters)


def numpy_text(value: bytes | np.ndarray) -> str:
    """The text of a string tensor as `tf.numpy_function` passes it (bytes, or a 0-d array of them)."""
    return np.asarray(value).item().decode("utf-8")


def _marked(inner: np.ndarray, max_characters: int) -> np.ndarray:
    out = np.full(max_characters, PAD_CHARACTER, np.int32)
    out[: len(inner) + 2] = [BEGIN_WORD, *inner, END_WORD]
    return out


class WordVocabulary(seqio.Vocabulary):
    """The corpus's `size` most frequent words and the special ids (module docstring)."""

    def __init__(self, size: int = 4000, max_characters: int = 16):
        if size <= NUM_SPECIAL_IDS:
            raise ValueError(f"WordVocabulary size={size} must exceed the {NUM_SPECIAL_IDS} special ids; e.g. 4000")
        if max_characters < 3:
            raise ValueError(f"max_characters={max_characters} must hold BOW, a character and EOW; e.g. 16")
        super().__init__(extra_ids=0)
        self.size, self.max_characters = size, max_characters

    @functools.cached_property
    def words(self) -> tuple[str, ...]:
        """The vocabulary's words, id NUM_SPECIAL_IDS onwards."""
        sentences = [word2vec_examples.words(document) for document in corpus.stdlib_docstrings("train")]
        kept = word2vec_examples.build_vocabulary(sentences, min_count=1).words[: self.size - NUM_SPECIAL_IDS]
        if len(kept) < self.size - NUM_SPECIAL_IDS:
            raise ValueError(f"the corpus has {len(kept)} distinct words, fewer than size={self.size} - "
                             f"{NUM_SPECIAL_IDS}; use WordVocabulary(size={len(kept) + NUM_SPECIAL_IDS}) or less")
        return kept

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {word: i + NUM_SPECIAL_IDS for i, word in enumerate(self.words)}

    @functools.cached_property
    def character_table(self) -> np.ndarray:
        """int32 [size, max_characters]: every id's character ids."""
        c = self.max_characters
        specials = [np.zeros(c, np.int32), _marked(np.array([EOS_CHARACTER]), c), _marked(np.array([UNK_CHARACTER]), c)]
        return np.stack(specials + [character_ids(word, c) for word in self.words])

    def encode_with_characters(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32 [n], character ids int32 [n, max_characters]) of the words of `text`; an unknown word keeps
        its own characters."""
        found = word2vec_examples.words(text)
        ids = np.array([self._index.get(word, UNK_ID) for word in found], np.int32)
        chars = np.stack([character_ids(w, self.max_characters) for w in found]) if found else \
            np.zeros((0, self.max_characters), np.int32)
        return ids, chars

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def _base_vocab_size(self) -> int:
        return self.size

    def _encode(self, s: str) -> list[int]:
        return [self._index.get(word, UNK_ID) for word in word2vec_examples.words(s)]

    def _decode(self, ids: Sequence[int]) -> str:
        tokens = ("", "", UNK_WORD, *self.words)
        return " ".join(tokens[i] for i in ids if i > EOS_ID)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        encode = lambda text: np.asarray(self._encode(numpy_text(text)), np.int32)  # noqa: E731
        ids = tf.numpy_function(encode, [tf.convert_to_tensor(s, tf.string)], tf.int32)
        return tf.ensure_shape(ids, [None])

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        tokens = tf.gather(tf.constant(["", "", UNK_WORD, *self.words]), ids)
        return tf.strings.reduce_join(tf.ragged.boolean_mask(tokens, tokens != ""), separator=" ", axis=-1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordVocabulary) and (other.size, other.max_characters) == (
            self.size, self.max_characters)

    def __hash__(self) -> int:
        return hash((WordVocabulary, self.size, self.max_characters))

    def __repr__(self) -> str:
        return f"WordVocabulary(size={self.size}, max_characters={self.max_characters})"
