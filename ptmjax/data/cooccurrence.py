"""GloVe's co-occurrence counts (Pennington et al., 2014), as the reference glove code's cooccur.c builds them.

Within each sentence (its words outside the vocabulary already dropped, as `Vocabulary.ids` drops them), every
pair of words at distance d, 1 <= d <= window, adds 1/d to X[i, j] and to X[j, i] (a word within the window of
itself adds 2/d to X[i, i], as cooccur.c's symmetric mode does). Windows stop at sentence ends. The counts come
back sparse, as COO arrays of the nonzero entries ordered by (i, j), summed in float64: the same sentences give
the same arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cooccurrences(sentences: Sequence[np.ndarray], vocabulary_size: int,
                  window: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nonzero co-occurrence counts of the id arrays `sentences` -> (rows int32, cols int32, counts float64),
    ordered by (row, col)."""
    if window < 1:
        raise ValueError(f"window={window} must be at least 1 (the reference glove code's default is 10)")
    ids = np.concatenate([np.asarray(s, np.int64) for s in sentences]) if sentences else np.zeros(0, np.int64)
    segments = np.repeat(np.arange(len(sentences)), [len(s) for s in sentences])
    keys, weights = [], []
    for distance in range(1, window + 1):
        same = segments[:-distance] == segments[distance:]
        left, right = ids[:-distance][same], ids[distance:][same]
        keys += [left * vocabulary_size + right, right * vocabulary_size + left]
        weights += [np.full(2 * len(left), 1 / distance)]
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate(weights), minlength=len(unique))
    return (unique // vocabulary_size).astype(np.int32), (unique % vocabulary_size).astype(np.int32), counts
