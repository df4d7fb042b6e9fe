"""Magnitude weight pruning: masks in the train state's extra entry 'pruning' zero the smallest weights.

`train.extra_state = [@MagnitudePruning()]` keeps a boolean mask (True: kept) over each trained parameter that
`targets` matches (by default the kernels inside the layer stacks, not embeddings or output heads); the
trainer zeroes the pruned weights in the initial parameters and after every step
(ptmjax/training/extra_state.py `ParamsConstraint`), so they stay exactly zero through training and resume.
One-shot (`end_step` None) prunes to `sparsity` at `begin_step`; gradual pruning follows Zhu and Gupta's
cubic schedule

    s_t = s_f + (s_i - s_f) (1 - (t - t_0) / (t_end - t_0))^3

updating the masks every `frequency` steps from `begin_step` to `end_step` (ptmjax/compress/pruning_schedule.py
is the run's callback that does). Each update prunes the smallest magnitudes among the weights still kept, over
all targeted tensors at once (`scope='global'`) or per tensor of the unscanned model (`scope='tensor'`: a
scanned stack's layers each count alone), exactly round(s n) of n (ties: the earlier in path and row-major
order). Masks only ever lose weights. With `rewind`, each update also resets the surviving weights to their
values at the run's start (its init checkpoint's, for a fine-tuned model): lottery-ticket rewinding as Chen
et al. do for BERT; the optimizer state and the learning-rate schedule go on.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import traverse_util
from tqdm.auto import tqdm

from ptmjax.compress.magnitude_masks import kept_masks
from ptmjax.compress.pruning_schedule import PruningSchedule
from ptmjax.layers.layer_stack import SCANNED
from ptmjax.training.extra_state import ParamsView
from ptmjax.tree_paths import leaves_by_path, overlay, subtree

PRUNING = "pruning"
LAYER_KERNELS = (r"(.*/)?layers(_\d+)?/.*kernel",)
SCOPES = ("global", "tensor")


@dataclasses.dataclass(frozen=True)
class MagnitudePruning:
    """The ExtraState (and ParamsConstraint) of magnitude pruning to `sparsity`, the fraction of targeted
    weights that are zero at the end of the schedule."""

    sparsity: float
    begin_step: int = 0
    end_step: int | None = None
    frequency: int = 100
    initial_sparsity: float = 0.0
    scope: str = "global"
    targets: tuple[str, ...] = LAYER_KERNELS
    rewind: bool = False
    name: ClassVar[str] = PRUNING

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        for field, value in (("sparsity", self.sparsity), ("initial_sparsity", self.initial_sparsity)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError(f"MagnitudePruning.{field}={value!r} must be a fraction in [0, 1), e.g. 0.5")
        if self.initial_sparsity > self.sparsity:
            raise ValueError(f"MagnitudePruning.initial_sparsity={self.initial_sparsity} exceeds sparsity="
                             f"{self.sparsity}: masks only ever lose weights")
        for field, value, least in (("begin_step", self.begin_step, 0), ("frequency", self.frequency, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"MagnitudePruning.{field}={value!r} must be an integer >= {least}")
        if self.end_step is not None and (not isinstance(self.end_step, int) or self.end_step <= self.begin_step):
            raise ValueError(f"MagnitudePruning.end_step={self.end_step!r} must be an integer after begin_step="
                             f"{self.begin_step} (None: prune once, at begin_step)")
        if self.scope not in SCOPES:
            raise ValueError(f"MagnitudePruning.scope={self.scope!r} must be one of {SCOPES}")
        for pattern in self.targets:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"MagnitudePruning.targets: {pattern!r} is not a regular expression "
                                 f"({error})") from None

    # The schedule.

    def updates_at(self, step: int) -> bool:
        """Whether the masks are recomputed after `step` steps."""
        if self.end_step is None:
            return step == self.begin_step
        return self.begin_step <= step <= self.end_step and (
            (step - self.begin_step) % self.frequency == 0 or step == self.end_step
        )

    def sparsity_at(self, step: int) -> float:
        """The target sparsity of the masks after `step` steps (held between updates)."""
        if step < self.begin_step:
            return 0.0
        if self.end_step is None or step >= self.end_step:
            return self.sparsity
        last = self.begin_step + (step - self.begin_step) // self.frequency * self.frequency
        remaining = 1 - (last - self.begin_step) / (self.end_step - self.begin_step)
        return self.sparsity + (self.initial_sparsity - self.sparsity) * remaining**3

    # The ExtraState.

    def target_paths(self, view: ParamsView) -> tuple[str, ...]:
        paths = tuple(p for p in view.trained_paths if any(re.fullmatch(t, p) for t in self.targets))
        if not paths:
            raise ValueError(
                f"MagnitudePruning.targets={list(self.targets)} match none of the trained parameters (e.g. "
                f"{', '.join(view.trained_paths[:3])}); give regular expressions over those paths"
            )
        return paths

    def abstract(self, view: ParamsView) -> Any:
        weights = subtree(view.abstract_params, self.target_paths(view))
        masks = jax.tree.map(lambda w: jax.ShapeDtypeStruct(w.shape, jnp.bool_), weights)
        return {"masks": masks, **({"rewind": weights} if self.rewind else {})}

    def shardings(self, view: ParamsView) -> Any:
        weights = subtree(view.param_shardings, self.target_paths(view))
        return {"masks": weights, **({"rewind": weights} if self.rewind else {})}

    def init(self, params: Any, view: ParamsView) -> Any:
        weights = subtree(params, self.target_paths(view))
        kept = jax.tree.map(lambda w: jnp.ones(w.shape, jnp.bool_), weights)
        masks = self.masks(weights, kept, self.pruned_counts(self.sparsity_at(0), view), view)
        # A copy: an output that is the jitted function's input would share its buffer, donated by every step.
        return {"masks": masks, **({"rewind": jax.tree.map(jnp.copy, weights)} if self.rewind else {})}

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        return value

    def callback(self, trainer: Any, bar: tqdm | None = None) -> PruningSchedule:
        return PruningSchedule(self, trainer, bar)

    def constrain(self, params: Any, value: Any, view: ParamsView) -> Any:
        weights = subtree(params, self.target_paths(view))
        return overlay(params, jax.tree.map(lambda w, kept: jnp.where(kept, w, 0).astype(w.dtype),
                                            weights, value["masks"]))

    # The masks.

    def pruned_counts(self, sparsity: float, view: ParamsView) -> Any:
        """How many weights the masks at `sparsity` prune: one count over all targets ('global'), or a tree
        of counts per tensor, a [layers] array of them for a scanned stack's ('tensor')."""
        paths = self.target_paths(view)
        shapes = dict(leaves_by_path(subtree(view.abstract_params, paths)))
        if self.scope == "global":
            total = sum(math.prod(shapes[p].shape) for p in paths)
            if total >= 2**31:
                raise ValueError(f"MagnitudePruning: {total} targeted weights is more than a global count of "
                                 "int32 holds; use scope='tensor'")
            return jnp.asarray(_rounded(sparsity * total), jnp.int32)
        axes = _flat(view.logical_axes)

        def count(path: str) -> jax.Array:
            shape = shapes[path].shape
            if _scanned(axes[path]):
                return jnp.full(shape[:1], _rounded(sparsity * math.prod(shape[1:])), jnp.int32)
            return jnp.asarray(_rounded(sparsity * math.prod(shape)), jnp.int32)

        return traverse_util.unflatten_dict({path: count(path) for path in paths}, sep="/")

    def masks(self, weights: Any, kept: Any, counts: Any, view: ParamsView) -> Any:
        """New masks over the targeted `weights`: `counts` of them pruned, the smallest magnitudes among those
        `kept` (the current masks) first."""
        if self.scope == "global":
            leaves, structure = jax.tree.flatten(weights)
            return jax.tree.unflatten(structure, kept_masks(leaves, jax.tree.leaves(kept), counts))
        axes, kept, counts = _flat(view.logical_axes), _flat(kept), _flat(counts)

        def one(w: jax.Array, k: jax.Array, count: jax.Array) -> jax.Array:
            return kept_masks([w], [k], count)[0]

        return traverse_util.unflatten_dict({
            path: (jax.vmap(one) if _scanned(axes[path]) else one)(w, kept[path], counts[path])
            for path, w in _flat(weights).items()
        }, sep="/")


def _rounded(x: float) -> int:
    return int(math.floor(x + 0.5))


def _scanned(axes: Any) -> bool:
    return len(axes) > 0 and axes[0] == SCANNED


def _flat(tree: Any) -> dict[str, Any]:
    return traverse_util.flatten_dict(tree, sep="/")
