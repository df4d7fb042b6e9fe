"""The callback that collects every step's finiteness for the non-finite policy (ptmjax/training/nonfinite.py)."""

from __future__ import annotations

from ptmjax.training.callbacks.callback import Callback, StepEvent
from ptmjax.training.nonfinite import NonFiniteMonitor


class NonFiniteWatch(Callback):
    """Takes each step's FINITE flag out of its metrics into `monitor`, unread (no host sync); the callbacks
    that read metrics (logging, checkpointing) apply the policy. Runs before them."""

    def __init__(self, monitor: NonFiniteMonitor):
        self.monitor = monitor

    def on_step(self, event: StepEvent) -> None:
        self.monitor.add(event.step, event.metrics)
