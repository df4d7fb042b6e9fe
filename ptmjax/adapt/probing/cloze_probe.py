"""LAMA-style cloze probing (Petroni et al., 2019): rank the vocabulary at a blank, precision at k.

A masked LM (the BERT family) reads the cloze with its mask id at the blank and ranks its MLM logits
there; T5 reads it with `<extra_id_0>` at the blank and ranks the decoder's logits for the token
after `<extra_id_0>` (ptmjax/families/cloze_logits.py). Only single-token answers count: an answer must
be one id in the model's vocabulary, encoded as it stands in the text (after a space unless the blank
opens the cloze). The default set is the embedded cloze QA task's questions ('ptmjax_stdlib_code_qa', a
code identifier or literal blanked out of a stdlib docstring); `cloze_set` keeps those whose answer is a single token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.adapt.probing.text_rows import TextRows, batches
from ptmjax.families.registry import family_of
from ptmjax.tasks import question_answering


class Cloze(NamedTuple):
    """The words before and after the blank, and the answer."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    answer: str


def qa_clozes(split: str = "validation") -> list[Cloze]:
    """The questions of the embedded cloze QA task's split as clozes."""
    clozes = []
    for question in question_answering.cloze_questions(split):
        blank = question.question.index(question_answering.BLANK)
        clozes.append(Cloze(question.question[:blank], question.question[blank + 1 :], question.answer))
    return clozes


@dataclasses.dataclass(frozen=True)
class ClozeSet:
    """Model rows of the clozes kept (a single-token answer, a row within the length): ids, the blank's index
    in each, the answer ids."""

    clozes: tuple[Cloze, ...]
    rows: tuple[tuple[int, ...], ...]
    blanks: tuple[int, ...]
    answers: tuple[int, ...]
    total: int  # clozes offered, single-token answer or not


def cloze_set(clozes: Sequence[Cloze], text_rows: TextRows, max_length: int | None = None) -> ClozeSet:
    """The clozes whose answer is one id (and whose row has at most `max_length` ids), as rows with
    `text_rows.mask_id` at the blank."""
    vocabulary, mask = text_rows.vocabulary, text_rows.mask_id
    kept, rows, blanks, answers = [], [], [], []
    for cloze in clozes:
        answer = vocabulary.encode(f" {cloze.answer}" if cloze.before else cloze.answer)
        if len(answer) != 1:
            continue
        before = [i for n, word in enumerate(cloze.before) for i in vocabulary.encode(f" {word}" if n else word)]
        after = [i for word in cloze.after for i in vocabulary.encode(f" {word}")]
        row = (*text_rows.prefix, *before, mask, *after, *text_rows.suffix)
        if max_length is not None and len(row) > max_length:
            continue
        rows.append(row)
        blanks.append(len(text_rows.prefix) + len(before))
        kept.append(cloze)
        answers.append(answer[0])
    return ClozeSet(tuple(kept), tuple(rows), tuple(blanks), tuple(answers), len(clozes))


def supports_cloze(module: nn.Module) -> bool:
    """Whether `module` ranks a blank: a masked LM of the BERT family, or T5 (its family's `cloze_logits`)."""
    return family_of(module).cloze_logits is not None


def precision_at_k(logits: np.ndarray, answers: Sequence[int], k: int = 1) -> float:
    """logits [n, vocab]: the share (0-1) of rows whose answer is among the k highest logits (ties: lower id first)."""
    ranked = np.argsort(-np.asarray(logits), axis=-1, kind="stable")[:, :k]
    return float(np.mean(np.any(ranked == np.asarray(answers)[:, None], axis=-1)))


class ClozeRanker:
    """A frozen model's logits over the vocabulary at each cloze's blank."""

    def __init__(self, module: nn.Module, params: Any, mask_id: int, pad_id: int):
        if not supports_cloze(module):
            raise ValueError(f"cloze probing ranks a masked LM (BERT family) or T5, not {type(module).__name__}")
        self.params, self.pad_id = jax.device_put(params), pad_id
        blank_logits = family_of(module).cloze_logits
        self._logits = jax.jit(lambda p, tokens, blanks: blank_logits(module, p, tokens, blanks, mask_id))

    def logits(self, clozes: ClozeSet, batch_size: int) -> np.ndarray:
        """float32 [n, vocab] at the blanks of `clozes`."""
        if not clozes.rows:
            raise ValueError(f"none of the {clozes.total} clozes has a single-token answer in this model's vocabulary "
                             "within its length; probe with other clozes")
        length, out = max(len(row) for row in clozes.rows), []
        starts = range(0, len(clozes.rows), batch_size)
        for start, batch in zip(starts, batches(clozes.rows, length, self.pad_id, batch_size), strict=True):
            blanks = np.zeros(batch_size, np.int32)
            blanks[: batch.size] = clozes.blanks[start : start + batch.size]
            logits = self._logits(self.params, jnp.asarray(batch.tokens), jnp.asarray(blanks))
            out.append(np.asarray(logits)[: batch.size])
        return np.concatenate(out)
