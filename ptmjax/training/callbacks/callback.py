"""What a run's step loop calls after every step: callbacks.

The step loop (ptmjax/training/step_loop.py) runs the jitted train step and
hands every callback, in order, a `StepEvent`. A `Periodic` callback acts
every `every` steps and at the run's last step. A new behaviour of a run
between steps (a distillation schedule, gradual pruning, a probe of the
parameters) is one more callback, not a branch in the loop: `train.callbacks`
takes a gin-configured list of them, run after the built-in ones. A callback is
a context manager: the loop enters it before the first step and leaves it when
the run ends, also on an error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ptmjax.training.train_state import TrainState


@dataclasses.dataclass
class StepEvent:
    """One finished step as the callbacks see it.

    `metrics` are still on the devices: reading one waits for the step, so a
    callback reads them only when it acts. `stop(note)` ends the run after this
    step (the checkpointing callback then saves it); `note` is printed.
    `replace_state(state)` hands the later callbacks and the next step another
    state (a pruning schedule's new masks), laid out as the trainer's.
    """

    step: int  # the steps done, this one included
    state: TrainState
    metrics: dict[str, jax.Array]
    batch: dict[str, Any]
    final: bool  # the run's last step
    stop_note: str | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_note is not None

    def stop(self, note: str) -> None:
        self.stop_note = note

    def replace_state(self, state: TrainState) -> None:
        self.state = state


class Callback:
    """Called after every step; does nothing by default."""

    def on_step(self, event: StepEvent) -> None:
        """Acts on a finished step."""

    def __enter__(self) -> Callback:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """The run has ended (returned, stopped or raised)."""


class Periodic(Callback):
    """A callback that acts every `every` steps and at the run's last step (and, with `acts_at_stop`, at a
    step that stops the run): `act` is what it does."""

    acts_at_stop = False

    def __init__(self, every: int, name: str):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"train.{name}={every!r} must be a positive integer")
        self.every = every

    def due(self, event: StepEvent) -> bool:
        return event.step % self.every == 0 or event.final or (self.acts_at_stop and event.stopping)

    def on_step(self, event: StepEvent) -> None:
        if self.due(event):
            self.act(event)

    def act(self, event: StepEvent) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define act(event)")
