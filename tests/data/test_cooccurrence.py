"""GloVe's co-occurrence counts against a hand-checked example: 1/distance weights, symmetry, the window's edge
and sentence boundaries."""

import numpy as np
import pytest

from ptmjax.data import cooccurrence


def dense(sentences, window):
    rows, cols, counts = cooccurrence.cooccurrences([np.array(s, np.int32) for s in sentences], 3, window)
    table = np.zeros((3, 3))
    table[rows, cols] = counts
    return rows, cols, table


def test_counts_by_hand():
    # Sentence 0 is 0 1 2 0, sentence 1 is 1 2. Window 2: distance 1 gives (0,1), (1,2), (2,0) and (1,2) in
    # sentence 1, 1 each; distance 2 gives (0,2) and (1,0), 1/2 each; the two sentences' ends never pair.
    rows, cols, table = dense([[0, 1, 2, 0], [1, 2]], window=2)
    np.testing.assert_allclose(table, [[0, 1.5, 1.5], [1.5, 0, 2], [1.5, 2, 0]])
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert rows.dtype == cols.dtype == np.int32


def test_window_edge_and_a_word_near_itself():
    # Window 3 reaches from the first 0 to the last (distance 3): 1/3 to X[0,0] from each side, as cooccur.c.
    _, _, table = dense([[0, 1, 2, 0], [1, 2]], window=3)
    np.testing.assert_allclose(table, [[2 / 3, 1.5, 1.5], [1.5, 0, 2], [1.5, 2, 0]])
    _, _, joined = dense([[0, 1, 2, 0, 1, 2]], window=2)  # one sentence: its middle pairs now count
    np.testing.assert_allclose(joined, [[0, 2.5, 2], [2.5, 0, 2.5], [2, 2.5, 0]])


def test_bad_window():
    with pytest.raises(ValueError, match="window=0 must be at least 1"):
        cooccurrence.cooccurrences([np.array([0, 1])], 2, window=0)
