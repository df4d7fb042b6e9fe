"""The run's callback that updates magnitude-pruning masks on their schedule (ptmjax/compress/magnitude_pruning.py).

After each step at which the schedule updates the masks, one jitted program (compiled once: the counts are
its arguments) recomputes them from the new parameters, zeroes the newly pruned weights (and with `rewind`
resets the survivors to their initial values), in the state's own sharded layout, and hands that state to the
later callbacks (the checkpoint saves it) and the next step. A line reports the masks' sparsity.
"""

from __future__ import annotations

from typing import Any

import jax
from tqdm.auto import tqdm

from ptmjax.compress.magnitude_masks import sparsity_of
from ptmjax.training.callbacks.callback import Callback, StepEvent
from ptmjax.training.train_state import TrainState
from ptmjax.tree_paths import overlay, subtree


class PruningSchedule(Callback):
    """Updates the masks of `pruning` (a MagnitudePruning, an extra state of `trainer`'s run) on its schedule."""

    def __init__(self, pruning: Any, trainer: Any, bar: tqdm | None = None):
        self.pruning, self.trainer, self.bar = pruning, trainer, bar
        self._pruned = jax.jit(self.pruned, out_shardings=trainer.state_shardings, donate_argnums=(0,))

    def pruned(self, state: TrainState, counts: jax.Array) -> TrainState:
        """`state` with masks that prune `counts` weights (traced)."""
        pruning, view = self.pruning, self.trainer.params_view
        value = state.extra[pruning.name]
        paths = pruning.target_paths(view)
        masks = pruning.masks(subtree(state.params, paths), value["masks"], counts, view)
        params = overlay(state.params, value["rewind"]) if pruning.rewind else state.params
        value = {**value, "masks": masks}
        return state.replace(params=pruning.constrain(params, value, view), extra={**state.extra, pruning.name: value})

    def on_step(self, event: StepEvent) -> None:
        if not self.pruning.updates_at(event.step):
            return
        target = self.pruning.sparsity_at(event.step)
        counts = self.pruning.pruned_counts(target, self.trainer.params_view)
        with jax.set_mesh(self.trainer.mesh):
            state = self._pruned(event.state, counts)
        event.replace_state(state)
        if self.bar is not None:
            reached = sparsity_of(state.extra[self.pruning.name]["masks"])
            self.bar.write(f"step {event.step}: pruned to sparsity {reached:.4f} (target {target:.4f})")
