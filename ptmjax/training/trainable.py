"""Which parameters a run trains; the rest are frozen.

`Trainable(patterns)` picks parameters by regular expressions, each matched in
full against the '/'-joined parameter paths of the unscanned layout (the one
`ptmjax inspect` and Hugging Face show: 'encoder/layers_0/attention/query/kernel').
Frozen parameters are not differentiated, hold no optimizer state (they take
`optax.set_to_zero`, which keeps none, under `optax.multi_transform`), and keep
their values bit for bit. With scanned layers a stacked array is
differentiated when any of its layers trains; its frozen layers get a zero update.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax

from ptmjax.layers import layer_stack
from ptmjax.tree_paths import leaves_by_path

TRAINABLE, FROZEN = "trainable", "frozen"


@dataclasses.dataclass(frozen=True)
class LeafSelection:
    """Which leaves of a parameter tree are differentiated, in `jax.tree.leaves` order."""

    flags: tuple[bool, ...]

    @classmethod
    def every(cls, tree: Any) -> LeafSelection:
        """All leaves of `tree`."""
        return cls((True,) * len(jax.tree.leaves(tree)))

    def take(self, tree: Any) -> list[Any]:
        """The selected leaves of `tree`."""
        return [leaf for flag, leaf in zip(self.flags, jax.tree.leaves(tree), strict=True) if flag]

    def put(self, tree: Any, selected: Sequence[Any], rest: Callable[[Any], Any] = lambda leaf: leaf) -> Any:
        """`tree` with its selected leaves replaced by `selected`, and `rest` applied to the others."""
        leaves, treedef = jax.tree.flatten(tree)
        chosen = iter(selected)
        return treedef.unflatten(
            [next(chosen) if flag else rest(leaf) for flag, leaf in zip(self.flags, leaves, strict=True)]
        )


@dataclasses.dataclass(frozen=True)
class Trainable:
    """The parameters whose unscanned paths match one of `patterns` train; None trains all."""

    patterns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.patterns is None:
            return
        if isinstance(self.patterns, str) or not self.patterns:
            raise ValueError(
                f"train.trainable={self.patterns!r} must be a non-empty list of regular expressions over "
                "parameter paths, e.g. ['.*/bias'], or None to train every parameter"
            )
        object.__setattr__(self, "patterns", tuple(self.patterns))
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"train.trainable pattern {pattern!r} is not a regular expression: {e}") from None

    def labels(self, plain_params: Any) -> Any:
        """TRAINABLE or FROZEN for each leaf of the unscanned parameters; every pattern must match a path."""
        paths = [path for path, _ in leaves_by_path(plain_params)]
        patterns = self.patterns or (".*",)
        unmatched = [p for p in patterns if not any(re.fullmatch(p, path) for path in paths)]
        if unmatched:
            raise ValueError(
                f"train.trainable patterns {unmatched} match no parameter path (full match); paths look like "
                f"{paths[:3]} (`ptmjax inspect` lists them all)"
            )
        names = [TRAINABLE if any(re.fullmatch(p, path) for p in patterns) else FROZEN for path in paths]
        return jax.tree.unflatten(jax.tree.structure(plain_params), names)

    def optimizer(self, tx: optax.GradientTransformation, plain_params: Any) -> optax.GradientTransformation:
        """`tx` on the trainable parameters, nothing on the frozen ones; `tx` itself when all train."""
        if self.patterns is None:
            return tx
        return optax.multi_transform({TRAINABLE: tx, FROZEN: optax.set_to_zero()}, self.labels(plain_params))

    def masked(self, tree: Any, plain_params: Any) -> Any:
        """`tree` (shaped like the unscanned parameters) with its frozen leaves as `optax.MaskedNode`: the
        parameter structure the optimizer state of `optimizer` mirrors."""
        if self.patterns is None:
            return tree
        labels = jax.tree.leaves(self.labels(plain_params))
        leaves, treedef = jax.tree.flatten(tree)
        return treedef.unflatten(
            [leaf if label == TRAINABLE else optax.MaskedNode() for leaf, label in zip(leaves, labels, strict=True)]
        )

    def selection(self, plain_params: Any, scanning: layer_stack.LayerStacks | None) -> LeafSelection:
        """The leaves to differentiate, in the model's own layout (scanned when `scanning`)."""
        trains = jax.tree.map(lambda label: np.asarray(label == TRAINABLE), self.labels(plain_params))
        if scanning:
            trains = layer_stack.scan(trains, scanning)
        return LeafSelection(tuple(bool(np.any(flag)) for flag in jax.tree.leaves(trains)))

    def counts(self, plain_params: Any) -> tuple[int, int]:
        """(trainable, total) numbers of parameter values."""
        labels = jax.tree.leaves(self.labels(plain_params))
        sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(plain_params)]
        return sum(s for s, label in zip(sizes, labels, strict=True) if label == TRAINABLE), sum(sizes)
