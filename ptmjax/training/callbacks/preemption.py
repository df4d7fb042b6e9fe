"""The callback that stops a run at SIGTERM (a preempted TPU VM or a cancelled job), every process at one step."""

from __future__ import annotations

import contextlib

from ptmjax.training import multihost
from ptmjax.training.callbacks.callback import Callback, StepEvent


class Preemption(Callback):
    """After SIGTERM, stops the run at the step every process agrees on (`multihost.stop_on_sigterm`); the
    checkpointing callback saves that step. Runs first, so that the callbacks after it see the stop."""

    def __enter__(self) -> Preemption:
        self._handler = contextlib.ExitStack()
        self._stop_after = self._handler.enter_context(multihost.stop_on_sigterm())
        return self

    def on_step(self, event: StepEvent) -> None:
        if self._stop_after(event.step):
            event.stop(f"SIGTERM: saved step {event.step}; rerun the same command to resume")

    def __exit__(self, *exc_info: object) -> None:
        self._handler.close()
