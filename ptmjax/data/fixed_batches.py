"""Fixed-shape batches, so that jit compiles once per call: lengths rounded up to a power of two,
the last batch padded with copies of its first row (a real row, so every row decodes normally)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

MIN_LENGTH = 8


def bucket_length(longest: int, limit: int | None = None) -> int:
    """The next power of two >= `longest` (at least MIN_LENGTH), capped at `limit`; raises if `longest` > `limit`."""
    if limit is not None and longest > limit:
        raise ValueError(f"an input of {longest} tokens is longer than the model's limit of {limit} here; shorten it")
    length = max(MIN_LENGTH, 1 << max(longest - 1, 0).bit_length())
    return length if limit is None else min(length, limit)


def round_up(size: int, multiple: int) -> int:
    """`size` rounded up to a multiple of `multiple`."""
    return -(-size // multiple) * multiple


def padded(rows: Mapping[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """`rows` (at most `batch_size`, at least one) filled up to `batch_size` with copies of the first."""
    return {name: np.concatenate([value, np.repeat(value[:1], batch_size - len(value), axis=0)])
            for name, value in rows.items()}


def fixed_batches(rows: Mapping[str, np.ndarray], batch_size: int) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """(batch of exactly `batch_size` rows, how many of them are real), over consecutive rows."""
    total = len(next(iter(rows.values())))
    for start in range(0, total, batch_size):
        real = min(batch_size, total - start)
        yield padded({name: value[start : start + real] for name, value in rows.items()}, batch_size), real
