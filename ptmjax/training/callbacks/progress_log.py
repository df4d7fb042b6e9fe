"""The callback that logs the train metrics: metrics.jsonl, TensorBoard and the progress bar's loss and tokens/s."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from tqdm.auto import tqdm

from ptmjax.training.callbacks.callback import Periodic, StepEvent
from ptmjax.training.metrics_log import MetricsLog
from ptmjax.training.nonfinite import NonFiniteMonitor
from ptmjax.training.step_clock import StepClock


class ProgressLog(Periodic):
    """Every `every` steps, applies the non-finite policy to the steps since the last time, then writes the
    step's metrics with `step_time_s` and `tokens_per_s` (`token_fields`: the model's input fields, whose
    size per global batch is its tokens per step). `train_loss`: the loss last logged."""

    def __init__(self, every: int, log: MetricsLog, bar: tqdm, clock: StepClock, nonfinite: NonFiniteMonitor,
                 token_fields: Sequence[str]):
        super().__init__(every, "log_every")
        self.log, self.bar, self.clock, self.nonfinite = log, bar, clock, nonfinite
        self.token_fields = tuple(token_fields)
        self.tokens_per_step: int | None = None
        self.train_loss: float | None = None

    def act(self, event: StepEvent) -> None:
        if self.tokens_per_step is None:  # global arrays: their size counts every host's rows
            self.tokens_per_step = sum(event.batch[name].size for name in self.token_fields)
        self.nonfinite.check()
        metrics = {k: float(v) for k, v in jax.device_get(event.metrics).items()}
        metrics.update(self.nonfinite.skipped_since_last_call())
        step_time = self.clock.lap(event.step)
        if step_time is not None:
            metrics["step_time_s"] = step_time
            metrics["tokens_per_s"] = self.tokens_per_step / step_time
        self.log.write(event.step, metrics)
        self.train_loss = metrics["loss"]
        speed = {"tok_s": f"{metrics['tokens_per_s']:.0f}"} if "tokens_per_s" in metrics else {}
        self.bar.set_postfix(loss=f"{self.train_loss:.3f}", **speed)
