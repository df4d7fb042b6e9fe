"""Paragraphs of the stdlib docstrings as word lists, split by their own hash: the texts of the tagging and QA tasks.

Every corpus document (both corpus splits) is cut at blank lines; a paragraph is its whitespace-
separated words, kept when it has at least `MIN_WORDS` of them, once (exact duplicates keep the first,
in corpus order, with that document's module). A paragraph is 'validation' when the first 8 bytes of
the SHA-256 of its words joined by single spaces, as an integer, modulo 100 are below
`VALIDATION_PERCENT`, else 'train': 3,228 and 362 paragraphs on CPython 3.11. Pre-training reads the
corpus' train split, so it has seen the text (not the labels) of most validation paragraphs, as for
the module-classification task.
"""

from __future__ import annotations

import functools
import hashlib
import re

from ptmjax.data import corpus

MIN_WORDS = 5
VALIDATION_PERCENT = 10
_BLANK_LINE = re.compile(r"\n\s*\n")


def split_of(text: str) -> str:
    """'validation' or 'train' for a paragraph's text (its words joined by single spaces)."""
    bucket = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % 100
    return "validation" if bucket < VALIDATION_PERCENT else "train"


@functools.cache
def _all_paragraphs() -> tuple[tuple[str, tuple[str, ...]], ...]:
    seen, paragraphs = set(), []
    for split in corpus.SPLITS:
        for module, document in corpus.stdlib_documents_with_modules(split):
            for paragraph in _BLANK_LINE.split(document):
                words = tuple(paragraph.split())
                if len(words) >= MIN_WORDS and words not in seen:
                    seen.add(words)
                    paragraphs.append((module, words))
    return tuple(paragraphs)


@functools.cache
def docstring_paragraphs(split: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(module, words) of each paragraph of one split ('train' or 'validation'), in corpus order."""
    if split not in corpus.SPLITS:
        raise ValueError(f"unknown split {split!r} of the docstring paragraphs; known: {', '.join(corpus.SPLITS)}")
    return tuple((module, words) for module, words in _all_paragraphs() if split_of(" ".join(words)) == split)
