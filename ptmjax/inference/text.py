"""Texts in, token ids out and back: checks, encoding with a model's special tokens, decoding up to EOS."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import seqio

Inputs = Sequence[str] | Sequence[Sequence[int]]


def check_texts(texts: Sequence[str], name: str = "texts") -> list[str]:
    """`texts` as a list; raises for a lone string, an empty list, a non-string or an empty string."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, got the string {texts[:40]!r}; wrap it: [text]")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{name} is empty; pass at least one string")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] is a {type(text).__name__} ({text!r:.40}), not a str; pass strings")
        if not text.strip():
            raise ValueError(f"{name}[{i}] is {text!r}; every text needs at least one non-space character")
    return texts


def encode(vocabulary: seqio.Vocabulary, text: str, bos_id: int | None, add_eos: bool) -> list[int]:
    """The token ids of `text`, after `bos_id` (if any) and before EOS (if `add_eos`)."""
    ids = [int(i) for i in vocabulary.encode(text)]
    return ([] if bos_id is None else [bos_id]) + ids + ([vocabulary.eos_id] if add_eos else [])


def fit_to_limit(ids: list[list[int]], limit: int, why: str, truncate: bool) -> list[list[int]]:
    """`ids` when every input has at most `limit` ids (`why`: where the limit comes from); else a ValueError
    naming the first longer input, or with `truncate` each longer input cut to its first `limit` ids (as
    seqio cuts training examples) and one warning."""
    longer = [i for i, x in enumerate(ids) if len(x) > limit]
    if not longer:
        return ids
    if not truncate:
        first = longer[0]
        raise ValueError(
            f"input {first + 1} of {len(ids)} has {len(ids[first])} tokens, more than the {limit} this model takes "
            f"({why}); shorten it, pass truncate=True (ptmjax infer --truncate_inputs) to keep the first {limit} "
            "tokens of each longer input, or load it with max_input_length=N (--max_input_length N)"
        )
    warnings.warn(
        f"{len(longer)} of {len(ids)} inputs had more than {limit} tokens ({why}; the longest "
        f"{max(len(ids[i]) for i in longer)}) and were cut to their first {limit}", stacklevel=3,
    )
    return [x[:limit] for x in ids]


def until_eos(tokens: np.ndarray, eos_id: int) -> list[int]:
    """The ids of a generated row before its first EOS."""
    tokens = np.asarray(tokens).tolist()
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def decode(vocabulary: seqio.Vocabulary, tokens: np.ndarray, eos_id: int) -> str:
    """A generated row as text: its ids before the first EOS, decoded."""
    return vocabulary.decode(until_eos(tokens, eos_id))
