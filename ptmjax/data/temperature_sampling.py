"""Temperature sampling over sources of unequal size, as XLM and mT5 sample languages.

With n_i examples in source i and N = sum(n_i), source i is sampled with probability p_i proportional to
(n_i / N) ** (1 / T):

* T = 1: proportional to size;
* T -> infinity (`math.inf`): uniform over the non-empty sources;
* mT5 uses T = 1 / 0.3 = 3.33; XLM samples languages with T = 2 (alpha = 0.5).

Mixtures of tasks use it (`ptmjax.tasks.mixtures`), and so does the multilingual vocabulary's choice of
training sentences (`ptmjax.data.multilingual_vocabulary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def temperature_sampling_rates(sizes: Mapping[str, int], temperature: float) -> dict[str, float]:
    """{name: p_i}, p_i proportional to (n_i / N) ** (1 / temperature), summing to 1; empty sources get 0."""
    if not sizes:
        raise ValueError("temperature sampling needs at least one task size")
    if not temperature > 0:
        raise ValueError(
            f"temperature={temperature} must be positive (1: proportional to size, math.inf: uniform, mT5: 3.33)"
        )
    negative = {name: n for name, n in sizes.items() if n < 0}
    total = sum(sizes.values())
    if negative or total <= 0:
        raise ValueError(f"task sizes {dict(sizes)} must be non-negative and not all zero")
    exponent = 0.0 if math.isinf(temperature) else 1.0 / temperature
    weights = {name: (n / total) ** exponent if n > 0 else 0.0 for name, n in sizes.items()}
    norm = sum(weights.values())
    return {name: weight / norm for name, weight in weights.items()}
