"""word2vec's examples from text: its words, vocabulary, frequent-word subsampling, noise words and windows.

* Words: `words(text)` lower-cases, splits on whitespace and strips ASCII punctuation from both ends of each
  token ('Return', 'return,' and '(return' are one word), dropping what is left empty.
* Vocabulary: the words occurring at least `min_count` times, most frequent first (ties in order of first
  appearance); other words are dropped from the sentences before anything else, as gensim does.
* Subsampling (gensim's form of Mikolov's formula): with t = sample * (the vocabulary's total count), a word
  of count c is kept with probability min(1, (sqrt(c / t) + 1) * t / c), drawn afresh every epoch.
* Windows (word2vec.c's reduced window): each kept word i draws b_i uniform in [0, window) and its context is
  the words j of its sentence with 1 <= |i - j| <= window - b_i, counted after subsampling.
* Examples: skip-gram predicts the centre word from each context word alone (word2vec.c's and gensim's
  order); CBOW predicts it from the mean of its whole context. Noise words come from counts ** 0.75,
  normalised; one equal to the predicted word gets weight 0, as word2vec.c skips it.
"""

from __future__ import annotations

import collections
import dataclasses
import string
from collections.abc import Iterable, Sequence

import numpy as np


def words(text: str) -> list[str]:
    """The lower-cased whitespace tokens of `text`, ASCII punctuation stripped from both ends, empty ones
    dropped."""
    return [word for token in text.lower().split() if (word := token.strip(string.punctuation))]


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The kept words, most frequent first, and their counts in the corpus."""

    words: tuple[str, ...]
    counts: np.ndarray

    @property
    def index(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.words)}

    def ids(self, sentence: Sequence[str]) -> np.ndarray:
        """A sentence's words as int32 ids, words outside the vocabulary dropped."""
        index = self.index
        return np.array([index[word] for word in sentence if word in index], np.int32)


def build_vocabulary(sentences: Iterable[Sequence[str]], min_count: int) -> Vocabulary:
    """The words of `sentences` occurring at least `min_count` times, most frequent first."""
    counts = collections.Counter(word for sentence in sentences for word in sentence)
    kept = sorted((word for word, count in counts.items() if count >= min_count), key=lambda word: -counts[word])
    if not kept:
        raise ValueError(f"no word occurs min_count={min_count} times in the sentences; lower min_count")
    return Vocabulary(tuple(kept), np.array([counts[word] for word in kept], np.int64))


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Each word's probability of being kept: min(1, (sqrt(c / t) + 1) * t / c), t = sample * total count;
    all 1 when sample is 0."""
    if sample < 0:
        raise ValueError(f"sample={sample} is negative; use 0 (no subsampling) or a small rate such as 1e-3")
    counts = np.asarray(counts, np.float64)
    if sample == 0:
        return np.ones_like(counts)
    threshold = sample * counts.sum()
    return np.minimum(1.0, (np.sqrt(counts / threshold) + 1) * threshold / counts)


def noise_distribution(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """The noise words' distribution: counts ** power, normalised (float64)."""
    weights = np.asarray(counts, np.float64) ** power
    return weights / weights.sum()


def window_contexts(segments: np.ndarray, reductions: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Each word's context positions under the reduced window -> (positions [N, 2 * window], valid [N, 2 *
    window]), left context first, nearest last, then the right context nearest first. `segments` [N] is each
    word's sentence; `reductions` [N] each word's b in [0, window)."""
    offsets = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])
    positions = np.arange(len(segments))[:, None] + offsets
    inside = (positions >= 0) & (positions < len(segments))
    positions = np.where(inside, positions, 0)
    valid = inside & (segments[positions] == segments[:, None]) & (np.abs(offsets) <= window - reductions[:, None])
    return positions, valid


def epoch_examples(sentences: Sequence[np.ndarray], keep: np.ndarray, window: int, cbow: bool,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One epoch's examples, in corpus order -> (inputs [N, C], input_mask [N, C], targets [N]); C is 1 for
    skip-gram and 2 * window for CBOW. `sentences` are id arrays, `keep` the keep probabilities."""
    ids = np.concatenate(sentences)
    segments = np.repeat(np.arange(len(sentences)), [len(s) for s in sentences])
    kept = rng.random(len(ids)) < keep[ids]
    ids, segments = ids[kept], segments[kept]
    positions, valid = window_contexts(segments, rng.integers(0, window, len(ids)), window)
    if cbow:
        has_context = valid.any(-1)
        return ids[positions[has_context]], valid[has_context], ids[has_context]
    centres, slots = np.nonzero(valid)
    return ids[positions[centres, slots]][:, None], np.ones((len(centres), 1), bool), ids[centres]


def with_noise(targets: np.ndarray, noise: np.ndarray, negatives: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The output words of each example -> (outputs [N, 1 + negatives]: the target then noise words drawn from
    `noise`, weights [N, 1 + negatives]: 0 for a noise word equal to its target)."""
    cumulative = np.cumsum(noise)
    drawn = np.searchsorted(cumulative, rng.random((len(targets), negatives)) * cumulative[-1], side="right")
    drawn = np.minimum(drawn, len(noise) - 1).astype(np.int32)
    outputs = np.concatenate([targets[:, None].astype(np.int32), drawn], axis=1)
    weights = np.concatenate([np.ones((len(targets), 1), np.float32), (drawn != targets[:, None]).astype(np.float32)],
                             axis=1)
    return outputs, weights
