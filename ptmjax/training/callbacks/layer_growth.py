"""The run's callback that grows the layer stacks of progressive stacking (ptmjax/training/progressive_stacking.py).

Right after each growth step, one jitted program (one per growth: the depths are static) copies the lower half
of every stack onto the upper half in the state's own sharded layout, and hands that state to the later
callbacks (the checkpoint saves it) and the next step. A line reports the new depth.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from tqdm.auto import tqdm

from ptmjax.layers.layer_stack import LayerStackConfig
from ptmjax.training.callbacks.callback import Callback, StepEvent


class LayerGrowth(Callback):
    """Grows the stacks of `stacking` (a ProgressiveStacking, an extra state of `trainer`'s run) on its steps."""

    def __init__(self, stacking: Any, trainer: Any, bar: tqdm | None = None):
        self.stacking, self.trainer, self.bar = stacking, trainer, bar
        self.config = getattr(trainer.model, "config", None)
        if not isinstance(self.config, LayerStackConfig):
            raise ValueError(f"ProgressiveStacking grows layer stacks, but {type(trainer.model).__name__} has no "
                             "LayerStackConfig; stack the layers of a single family's model.")
        for depth in self.config.layer_stacks().values():
            stacking.initial_depth(depth)  # refuses a depth that does not halve as often as it grows

    def on_step(self, event: StepEvent) -> None:
        steps = self.stacking.growth_steps
        if event.step not in steps:
            return
        done, name = steps.index(event.step), self.stacking.name
        held = int(jax.device_get(event.state.extra[name]["growths"]))
        if held != done:
            raise ValueError(f"step {event.step} is growth {done + 1} of ProgressiveStacking.growth_steps="
                             f"{list(steps)}, but the state has grown {held} times; resume with the growth_steps "
                             "it was trained with.")
        grow = jax.jit(functools.partial(self.stacking.grown, config=self.config, done=done),
                       out_shardings=self.trainer.state_shardings, donate_argnums=(0,))
        with jax.set_mesh(self.trainer.mesh):
            event.replace_state(grow(event.state))
        if self.bar is not None:
            depths = [self.stacking.initial_depth(d) * 2 ** (done + 1) for d in self.config.layer_stacks().values()]
            self.bar.write(f"step {event.step}: progressive stacking grew the layer stacks to {depths} layers")
