"""Words to token ids with each word's first id known: what word-level labels (tags, answer spans) need.

The first word is encoded on its own, every later word as ' ' + word, and the ids are concatenated.
For a SentencePiece vocabulary a word's first id is the piece that starts with '▁' (the leading
space is dropped and pieces never cross whitespace); the ids are those of the whole text except where
the text's segmentation breaks a tie differently (8 of the 3,590 docstring paragraphs with the
stdlib vocabulary, in runs of brackets such as '[HH[:MM[:SS[.mmm[uuu]]]]]'). For WordPiece
(BERT) the space is dropped too and the first id is the one without '##'. For vocabularies that
encode the space itself the first id holds it: byte-level BPE (GPT-2, RoBERTa) merges it into the
word's first token ('Ġword'); `seqio.ByteVocabulary` gives the space its own id (32 + 3), so a
word's label sits on the space byte before it. Decoding the ids gives the words joined by single spaces.
"""

from __future__ import annotations

from collections.abc import Sequence

import seqio


def encode_words(vocabulary: seqio.Vocabulary, words: Sequence[str]) -> tuple[list[int], list[int]]:
    """(ids of the words, the index into ids of each word's first id); an id-less word raises."""
    ids, starts = [], []
    for index, word in enumerate(words):
        word_ids = vocabulary.encode(word if index == 0 else f" {word}")
        if not word_ids:
            raise ValueError(f"word {word!r} encodes to no ids with {vocabulary}; word labels need a vocabulary "
                             "that gives every word an id")
        starts.append(len(ids))
        ids.extend(word_ids)
    return ids, starts


def first_character(vocabulary: seqio.Vocabulary, ids: Sequence[int], start: int) -> int:
    """The index of a word's first id that holds one of its characters: `start`, or the next one when the id at
    `start` is a bare space (byte-level BPE's 'Ġ', SentencePiece's '▁', a space byte before a character that
    does not merge with it). Transformers' question-answering examples start an answer there."""
    return start + 1 if not vocabulary.decode([ids[start]]).strip() else start


def require_eos(vocabulary: seqio.Vocabulary, task: str) -> int:
    """The vocabulary's EOS id, which ends (and in QA separates) the inputs of `task`."""
    if vocabulary.eos_id is None:
        raise ValueError(f"{task} ends its inputs with EOS, but {vocabulary} has no eos_id; give the vocabulary one")
    return vocabulary.eos_id
