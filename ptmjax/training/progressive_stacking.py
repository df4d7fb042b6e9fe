"""Progressive stacking (Gong et al., 2019): train a shallow model, then double its depth by stacking a copy of
its trained layers on top, and go on training.

`train.extra_state = [@ProgressiveStacking()]` with `ProgressiveStacking.growth_steps = [N1, N2, ...]`: the
model is configured at its final depth L, and each of its stacks starts L / 2^G layers deep (G growths). Right
after step N_k (the run's callback, ptmjax/training/callbacks/layer_growth.py), every stack d layers deep
becomes 2d deep: layer i + d gets a copy of layer i, for i < d, as Gong et al. do. The copy takes everything
the state holds of layer i: its parameters, its optimizer state (Adam's moments, Adafactor's factored
statistics), and what other extra state holds of it (an EMA of the parameters, pruning masks), so the new
layers continue exactly as the layers they copy; the step count and the learning-rate schedule go on. Moments
reset to zero beside a step count that goes on would make the new layers' first updates far too large (Adam's
bias correction is near 1 by then: the update is about g / sqrt((1 - b2) g^2), ~30 times the usual size).

The state has the final depth from the first step: the layers not yet grown are the identity
(ptmjax/training/layer_schedule.py), get zero gradients, and are overwritten by the growth, so the
shallow phase trains exactly the shallow model. So one compiled step, one checkpoint layout and one sharding
serve the whole run; the state's 'progressive_stacking' entry counts the growths done, checkpointed with it,
so a run resumed before a growth grows at its step and one resumed after it goes on at the grown depth. The
price: the final depth's memory from the start. Skipped layers are still computed (their output discarded,
as LayerDrop's), so the shallow phase is not faster than the deep one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import gin
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ptmjax.layers.layer_stack import SCANNED, LayerStackConfig
from ptmjax.training.callbacks.layer_growth import LayerGrowth
from ptmjax.training.extra_state import ParamsView
from ptmjax.tree_paths import leaves_by_path, path_name

PROGRESSIVE_STACKING = "progressive_stacking"
LAYER = re.compile(r"layers_(\d+)")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ProgressiveStacking:
    """The LayerSchedule of progressive stacking: after each of `growth_steps` (increasing, >= 1) every layer
    stack doubles its depth (see the module docstring)."""

    growth_steps: Sequence[int] = (100,)
    name: ClassVar[str] = PROGRESSIVE_STACKING

    def __post_init__(self) -> None:
        steps = tuple(self.growth_steps)
        object.__setattr__(self, "growth_steps", steps)
        if (not steps or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps)
                or any(a >= b for a, b in zip(steps, steps[1:], strict=False))):
            raise ValueError(f"ProgressiveStacking.growth_steps={list(steps)!r} must be increasing step counts "
                             ">= 1, e.g. [100] (one doubling after step 100)")

    def initial_depth(self, depth: int) -> int:
        """The depth a stack `depth` layers deep starts at: depth / 2^(number of growths)."""
        doublings = 2 ** len(self.growth_steps)
        if depth % doublings:
            raise ValueError(
                f"ProgressiveStacking: {len(self.growth_steps)} growths double a stack {len(self.growth_steps)} "
                f"times, so its depth must be a multiple of {doublings}, but a stack of the model has {depth} "
                f"layers; configure the model at its final depth (e.g. {doublings * max(1, depth // doublings)})."
            )
        return depth // doublings

    def layers(self, step: jax.Array, value: Any, depth: int) -> tuple[jax.Array, jax.Array]:
        """The first initial_depth * 2^growths layers active, every active one kept."""
        active_depth = self.initial_depth(depth) * jnp.left_shift(1, value["growths"])
        return jnp.arange(depth) < active_depth, jnp.ones((depth,), jnp.float32)

    def grown(self, state: Any, config: LayerStackConfig, done: int) -> Any:
        """`state` (a TrainState, traced) after growth `done` + 1: every stack's layers [d, 2d) copied from
        [0, d), d = initial depth * 2^done, in whatever the state holds of them, and the growth counted."""
        depths = {path: self.initial_depth(depth) * 2**done for path, depth in config.layer_stacks().items()}
        flat = dict(leaves_by_path(state))

        def copied(key_path: tuple, leaf: Any) -> Any:
            keys = path_name(key_path).split("/")
            for stack, depth in depths.items():
                for at in range(len(stack), len(keys)):
                    if tuple(keys[at - len(stack):at]) != stack:
                        continue
                    if keys[at] == SCANNED:  # the model's layout of a scanned stack: a leading 'layers' axis
                        return leaf.at[depth:2 * depth].set(leaf[:depth])
                    if (match := LAYER.fullmatch(keys[at])) and depth <= int(match[1]) < 2 * depth:
                        return flat["/".join([*keys[:at], f"layers_{int(match[1]) - depth}", *keys[at + 1:]])]
            return leaf

        state = jax.tree_util.tree_map_with_path(copied, state)
        value = state.extra[self.name]
        return state.replace(extra={**state.extra, self.name: {**value, "growths": value["growths"] + 1}})

    # The ExtraState: how many growths are done.

    def abstract(self, view: ParamsView) -> Mapping[str, jax.ShapeDtypeStruct]:
        return {"growths": jax.ShapeDtypeStruct((), jnp.int32)}

    def shardings(self, view: ParamsView) -> Mapping[str, NamedSharding]:
        return {"growths": NamedSharding(view.mesh, PartitionSpec())}

    def init(self, params: Any, view: ParamsView) -> Mapping[str, jax.Array]:
        return {"growths": jnp.zeros((), jnp.int32)}

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        return value

    def callback(self, trainer: Any, bar: Any = None) -> LayerGrowth:
        return LayerGrowth(self, trainer, bar)
