"""Sparse attention patterns: which keys a query may attend, as a static rule over their positions.

A pattern is a frozen dataclass (hashable, so it sits on a model config and in static arguments) whose
`allowed(query_positions [q], key_positions [k])` gives a boolean [q, k], on NumPy arrays (the blockwise
kernel's static plan of live tiles, `live_tiles`) or on JAX arrays (the masks models build, decoding's cache
slots included). It is ANDed with a model's own masks (causal, padding, segments): under a causal mask a
`SlidingWindow(size)` keeps the last `size` positions, the query's own included; in an encoder, those less
than `size` away on either side.

- SlidingWindow(size): |q - k| < size (Longformer's local attention, Mistral's sliding window).
- DilatedWindow(size, dilation): q - k a multiple of `dilation`, |q - k| < size * dilation (Longformer's
  dilated window: `size` keys on each side, the query's own included, `dilation` apart).
- GlobalTokens(positions): the chosen positions attend every key and every query attends them
  (Longformer's and BigBird's global tokens); alone, other queries attend nothing: join it to a window.
- RandomBlocks(block_size, num_random, seed, max_length): each query block of `block_size` positions attends
  `num_random` key blocks drawn once from `seed` among the ceil(max_length / block_size) blocks (BigBird's
  random attention): the same blocks whatever the sequence length, so training and decoding agree.
- FixedChunks(size, summary): the keys of the query's own chunk of `size` positions, and the last `summary`
  positions of every chunk (Child et al. 2019's fixed pattern; causal models see only earlier chunks' ones).
- AnyOf(patterns): the union (BigBird: AnyOf([window, global, random])); `a | b` spells AnyOf((a, b)).

A query that may attend no key at all (GlobalTokens or RandomBlocks alone) has no defined output: the einsum
path averages all keys there and the blockwise path its live ones, as for padding rows.
"""

from __future__ import annotations

import abc
import dataclasses
import functools

import gin
import jax
import numpy as np

Array = jax.Array | np.ndarray


class AttentionPattern(abc.ABC):
    """A static rule saying which key positions each query position may attend."""

    @abc.abstractmethod
    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        """int [q], int [k] (NumPy or JAX) -> bool [q, k], True where the query may attend the key."""

    @property
    def window(self) -> int | None:
        """The number of most recent positions (the query's own included) beyond which a causal query attends
        nothing, or None where it may reach any earlier position: a decoding cache of `window` slots suffices."""
        return None

    def __or__(self, other: AttentionPattern) -> AnyOf:
        return AnyOf((self, other))


def _differences(query_positions: Array, key_positions: Array) -> Array:
    """int [q, k]: query position minus key position."""
    return query_positions[:, None] - key_positions[None, :]


def _check_positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be a positive int, got {value!r}")


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class SlidingWindow(AttentionPattern):
    """Keys less than `size` positions from the query, on either side (causal: the last `size`, itself included)."""

    size: int

    def __post_init__(self) -> None:
        _check_positive(self, "size")

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        return abs(_differences(query_positions, key_positions)) < self.size

    @property
    def window(self) -> int:
        return self.size


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class DilatedWindow(AttentionPattern):
    """`size` keys on each side of the query, its own included, `dilation` positions apart."""

    size: int
    dilation: int

    def __post_init__(self) -> None:
        _check_positive(self, "size", "dilation")

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        difference = _differences(query_positions, key_positions)
        return (abs(difference) < self.size * self.dilation) & (difference % self.dilation == 0)

    @property
    def window(self) -> int:
        return (self.size - 1) * self.dilation + 1


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class GlobalTokens(AttentionPattern):
    """The positions in `positions` attend every key, and every query attends them."""

    positions: tuple[int, ...]

    def __post_init__(self) -> None:
        positions = tuple(self.positions)
        if not positions or any(not isinstance(p, int) or p < 0 for p in positions):
            raise ValueError(f"GlobalTokens.positions must be non-negative ints, at least one, got {self.positions!r}")
        object.__setattr__(self, "positions", positions)  # a gin list made hashable

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        chosen = np.asarray(self.positions)
        global_queries = (query_positions[:, None] == chosen).any(-1)
        global_keys = (key_positions[:, None] == chosen).any(-1)
        return global_queries[:, None] | global_keys[None, :]


@functools.lru_cache(maxsize=64)
def _random_block_table(seed: int, num_random: int, num_blocks: int) -> np.ndarray:
    """bool [num_blocks, num_blocks]: each row's `num_random` (at most num_blocks) distinct key blocks."""
    table = np.zeros((num_blocks, num_blocks), bool)
    for row in range(num_blocks):
        chosen = np.random.default_rng([seed, row]).choice(num_blocks, min(num_random, num_blocks), replace=False)
        table[row, chosen] = True
    return table


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class RandomBlocks(AttentionPattern):
    """Each query block attends `num_random` key blocks of `block_size` positions, drawn from `seed` among the
    blocks of positions 0 .. max_length - 1 (positions past max_length attend and are attended by none)."""

    block_size: int
    num_random: int
    max_length: int
    seed: int = 0

    def __post_init__(self) -> None:
        _check_positive(self, "block_size", "num_random", "max_length")

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        num_blocks = -(-self.max_length // self.block_size)
        table = _random_block_table(self.seed, self.num_random, num_blocks)
        xp = np if isinstance(query_positions, np.ndarray) and isinstance(key_positions, np.ndarray) else jax.numpy
        blocks = [xp.clip(positions // self.block_size, 0, num_blocks - 1) for positions in (query_positions,
                                                                                           key_positions)]
        inside = [(positions >= 0) & (positions < self.max_length) for positions in (query_positions, key_positions)]
        return xp.asarray(table)[blocks[0][:, None], blocks[1][None, :]] & inside[0][:, None] & inside[1][None, :]


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class FixedChunks(AttentionPattern):
    """The keys of the query's own chunk of `size` positions, and the last `summary` positions of every chunk."""

    size: int
    summary: int = 1

    def __post_init__(self) -> None:
        _check_positive(self, "size", "summary")
        if self.summary > self.size:
            raise ValueError(f"FixedChunks.summary={self.summary} exceeds size={self.size}; use at most size")

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        same_chunk = query_positions[:, None] // self.size == key_positions[None, :] // self.size
        return same_chunk | (key_positions % self.size >= self.size - self.summary)[None, :]


@gin.configurable(module="ptmjax.layers")
@dataclasses.dataclass(frozen=True)
class AnyOf(AttentionPattern):
    """A key is allowed where any of `patterns` allows it."""

    patterns: tuple[AttentionPattern, ...]

    def __post_init__(self) -> None:
        patterns = tuple(self.patterns)
        if not patterns or not all(isinstance(p, AttentionPattern) for p in patterns):
            raise ValueError(f"AnyOf.patterns must be attention patterns, at least one, got {self.patterns!r}")
        object.__setattr__(self, "patterns", patterns)

    def allowed(self, query_positions: Array, key_positions: Array) -> Array:
        allowed = self.patterns[0].allowed(query_positions, key_positions)
        for pattern in self.patterns[1:]:
            allowed = allowed | pattern.allowed(query_positions, key_positions)
        return allowed

    @property
    def window(self) -> int | None:
        windows = [pattern.window for pattern in self.patterns]
        return None if None in windows else max(windows)


@functools.lru_cache(maxsize=256)
def live_tiles(
    pattern: AttentionPattern, num_queries: int, num_keys: int, tile: int, causal: bool
) -> tuple[tuple[int, ...], ...]:
    """For each query tile [i * tile, (i + 1) * tile), the key tiles in which `pattern` (and, if `causal`,
    causality) allows some (query, key) pair: the tiles the blockwise kernel visits; the others are entirely
    masked."""
    keys = np.arange(num_keys)
    live = []
    for start in range(0, num_queries, tile):
        queries = np.arange(start, min(start + tile, num_queries))
        allowed = np.asarray(pattern.allowed(queries, keys))
        if causal:
            allowed = allowed & (keys[None, :] <= queries[:, None])
        columns = allowed.any(0)
        live.append(tuple(k for k in range(-(-num_keys // tile)) if columns[k * tile:(k + 1) * tile].any()))
    return tuple(live)
