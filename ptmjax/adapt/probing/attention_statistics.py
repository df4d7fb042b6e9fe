"""Statistics of attention maps per layer and head, averaged over the non-padding queries of a set of rows.

- 'entropy': -sum_k p_k log p_k of a query's attention (nats; 0 = all on one key, log n = uniform);
- 'max_weight': the largest weight of a query's attention;
- 'to_first_token': the weight on the row's first token ([CLS], or the first word);
- 'to_special_tokens': the summed weight on the special tokens the caller marks (EOS / [SEP]).
"""

from __future__ import annotations

import numpy as np

STATISTICS = ("entropy", "max_weight", "to_first_token", "to_special_tokens")


def per_query_statistics(attention: np.ndarray, special: np.ndarray) -> dict[str, np.ndarray]:
    """attention [layers, b, heads, q, k], special bool [b, k] -> each statistic per query [layers, b, heads, q]."""
    p = np.asarray(attention, np.float64)
    log_p = np.log(np.where(p > 0, p, 1.0))
    return {
        "entropy": -np.sum(p * log_p, axis=-1),
        "max_weight": p.max(axis=-1),
        "to_first_token": p[..., 0],
        "to_special_tokens": np.sum(p * special[None, :, None, None, :], axis=-1),
    }


class AttentionStatistics:
    """Means of the statistics over the valid queries of every batch `add`ed: [layers, heads] each."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.queries = 0

    def add(self, attention: np.ndarray, valid: np.ndarray, special: np.ndarray) -> None:
        """attention [layers, b, heads, q, k]; valid bool [b, s] (the non-padding tokens); special bool [b, s]."""
        weights = np.asarray(valid, np.float64)[None, :, None, :]  # queries [1, b, 1, q]
        for name, values in per_query_statistics(attention, np.asarray(special, bool) & valid).items():
            self.sums[name] = self.sums.get(name, 0.0) + np.sum(values * weights, axis=(1, 3))
        self.queries += int(np.sum(valid))

    def means(self) -> dict[str, np.ndarray]:
        """{statistic: float64 [layers, heads]}; raises before any query was added."""
        if not self.queries:
            raise ValueError("no attention rows with a non-padding query were added; add rows with tokens")
        return {name: self.sums[name] / self.queries for name in STATISTICS}
