"""The step loop of a run: a batch, the jitted train step, then every callback (ptmjax/training/callbacks/)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import jax
from tqdm.auto import tqdm

from ptmjax.training.callbacks.callback import Callback, StepEvent
from ptmjax.training.startup import StartupClock
from ptmjax.training.step_clock import StepClock
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer


def run_steps(
    trainer: Trainer, state: TrainState, batches: Iterator[dict[str, Any]], rng: jax.Array, start: int,
    num_steps: int, callbacks: Sequence[Callback], bar: tqdm, clock: StepClock, startup: StartupClock,
    primary: bool = True, compiling: Future[None] | None = None,
) -> tuple[TrainState, bool]:
    """Runs steps `start + 1` through `num_steps` (or until a callback stops the run); returns the last
    state and whether a callback stopped it. `compiling`: the train step's compile in its own thread (waited
    for, and its error raised, before the first step). The first step's time (its compile) is printed with
    the start-up line (by the `primary` process) and left out of the step times."""
    with contextlib.ExitStack() as entered:
        for callback in callbacks:
            entered.enter_context(callback)
        if compiling is not None:
            compiling.result()
            startup.mark("train step compiled")
        for step in range(start, num_steps):
            batch = next(batches)
            if not clock.started:
                startup.mark("first batch")
            state, metrics = trainer.train_step(state, batch, rng)
            bar.update(1)
            if not clock.started:
                jax.block_until_ready(metrics)
                clock.start(step + 1)
                startup.mark("first step")
                if primary:
                    bar.write(startup.line())
            event = StepEvent(step + 1, state, metrics, batch, final=step + 1 == num_steps)
            for callback in callbacks:
                callback.on_step(event)
            state = event.state
            if event.stopping:
                bar.write(event.stop_note)
                return state, True
    return state, False
