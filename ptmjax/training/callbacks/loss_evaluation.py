"""The callback that evaluates the loss on the validation split: `eval_loss`, `eval_accuracy`, ..."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import jax
from tqdm.auto import tqdm

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.training import multihost
from ptmjax.training.callbacks.callback import Periodic, StepEvent
from ptmjax.training.metrics_log import MetricsLog
from ptmjax.training.step_clock import StepClock
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer

PARAMS = {"": lambda state: state.params}  # the parameter sets a run evaluates: the trained parameters


class LossEvaluation(Periodic):
    """Every `every` steps, the eval step's statistics summed over the first `batches` batches of the
    validation split (None: all of it), logged as `eval_<metric>`, with the loss curve redrawn.
    `validation_dataset()` builds the split (a tf.data.Dataset) once, at the first evaluation, unshuffled, so
    every evaluation reads the same batches. Every process runs as many batches (`multihost.batches_in_lockstep`).
    `parameter_sets` maps a prefix to the parameters of a state it evaluates (see `PARAMS`): with an EMA,
    'ema_' logs `eval_ema_<metric>` of the averaged parameters too. `metrics`: those of the last evaluation."""

    def __init__(self, every: int, trainer: Trainer, validation_dataset: Callable[[], Any],
                 batches: int | None, task_name: str, log: MetricsLog, bar: tqdm, clock: StepClock,
                 parameter_sets: Mapping[str, Callable[[TrainState], Any]] = PARAMS):
        super().__init__(every, "eval_every")
        self.parameter_sets = dict(parameter_sets)
        self.trainer, self.batches, self.task_name = trainer, batches, task_name
        self.validation_dataset = functools.cache(validation_dataset)
        self.log, self.bar, self.clock = log, bar, clock
        self.metrics: dict[str, float] = {}

    def act(self, event: StepEvent) -> None:
        with self.clock.paused():
            self.metrics = {f"eval_{prefix}{name}": value for prefix, params_of in self.parameter_sets.items()
                            for name, value in self.evaluate(params_of(event.state), event.state).items()}
            self.log.write(event.step, self.metrics)
            self.log.plot()
            self.bar.write(f"step {event.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()))

    def evaluate(self, params: Any, state: TrainState | None = None) -> dict[str, float]:
        """{'<metric>': value} of `params` on the validation batches (with the layers the layer schedules of
        the run's `state` leave active, if given)."""
        dataset = self.validation_dataset()
        shapes = {name: tuple(spec.shape) for name, spec in dataset.element_spec.items()}
        total = None
        for batch in multihost.batches_in_lockstep(itertools.islice(dataset.as_numpy_iterator(), self.batches),
                                                   shapes):
            stats = self.trainer.eval_stats(params, partitioning.global_batch(batch, self.trainer.mesh), state)
            total = stats if total is None else total + stats
        if total is None:
            raise pipeline.empty_split_error(self.trainer.api.family.feature_converter, "validation", self.task_name)
        return {k: float(v) for k, v in jax.device_get(total.metrics()).items()}
