"""Text -> token rows for a frozen model, with the special tokens its family reads, and batches of rows.

An encoder (BERT family) or encoder-decoder reads `[CLS]` (or BOS `<s>`) first where its tokenizer
has one, then the text, then EOS (`[SEP]` for a BERT tokenizer, `</s>` for T5); GPT-2 reads the text
as it is (as transformers does). Masked positions use the tokenizer's `[MASK]` / `<mask>`, else
`<extra_id_0>` (the last id: what ptmjax's masked LM objectives and T5's span corruption use).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import flax.linen as nn
import numpy as np
import seqio

from ptmjax.adapt.probing.layer_features import padded_batch
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary
from ptmjax.families.registry import family_of

FIRST_TOKENS = ("[CLS]", "<s>")
MASK_TOKENS = ("[MASK]", "<mask>")


def _token_id(vocabulary: seqio.Vocabulary, names: Sequence[str]) -> int | None:
    if not isinstance(vocabulary, HfTokenizerVocabulary):
        return None
    ids = (vocabulary.tokenizer.token_to_id(name) for name in names)
    return next((i for i in ids if i is not None), None)


@dataclasses.dataclass(frozen=True)
class TextRows:
    """How a model's rows are built from text: its vocabulary and the ids around every row."""

    vocabulary: seqio.Vocabulary
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @classmethod
    def of(cls, module: nn.Module, vocabulary: seqio.Vocabulary) -> TextRows:
        if family_of(module).decoder_only:
            return cls(vocabulary, (), ())
        first = _token_id(vocabulary, FIRST_TOKENS)
        eos = vocabulary.eos_id
        return cls(vocabulary, () if first is None else (first,), () if eos is None else (eos,))

    def encode(self, text: str) -> list[int]:
        """The row of `text`: prefix, its ids, suffix."""
        return [*self.prefix, *self.vocabulary.encode(text), *self.suffix]

    @property
    def mask_id(self) -> int:
        """The id a cloze puts at its blank (see the module doc)."""
        mask = _token_id(self.vocabulary, MASK_TOKENS)
        if mask is not None:
            return mask
        if getattr(self.vocabulary, "extra_ids", 0) > 0:
            return self.vocabulary.vocab_size - 1
        raise ValueError(f"{self.vocabulary} has neither a [MASK] / <mask> token nor sentinels (<extra_id_0>); "
                         "cloze probing needs a model folder whose tokenizer has one")


@dataclasses.dataclass(frozen=True)
class Batch:
    """tokens int32 [batch_size, length], valid bool [batch_size, length]; only the first `size` rows are real."""

    tokens: np.ndarray
    valid: np.ndarray
    size: int


def batches(rows: Sequence[Sequence[int]], length: int, pad_id: int, batch_size: int) -> Iterator[Batch]:
    """The rows in batches of one shape (cut to `length`; the last batch filled up with padding rows)."""
    for start in range(0, len(rows), batch_size):
        chunk = [list(row) for row in rows[start : start + batch_size]]
        tokens, valid = padded_batch(chunk + [[]] * (batch_size - len(chunk)), length, pad_id)
        yield Batch(tokens, valid, len(chunk))
