"""The callback that evaluates tasks by decoding or scoring (seqio metrics), and keeps the best checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from ptmjax.evaluation import results
from ptmjax.training.best_checkpoint import BestCheckpoint
from ptmjax.training.callbacks.callback import Periodic, StepEvent
from ptmjax.training.callbacks.loss_evaluation import PARAMS
from ptmjax.training.metrics_log import MetricsLog
from ptmjax.training.saved_part import SavedPart
from ptmjax.training.step_clock import StepClock
from ptmjax.training.train_state import TrainState


class InferenceEvaluation(Periodic):
    """Every `every` steps, each evaluator's metrics (`InferenceEvaluator` or a head evaluator), logged as
    `eval_<task>/<metric>`; with `best`, the parameters (the part the run saves) of the step with the best
    value of its metric are kept in MODEL_DIR/best/. `parameter_sets` as in `LossEvaluation`: with an EMA,
    `eval_ema_<task>/<metric>` too (best/ follows the trained parameters). `metrics`:
    {'<prefix><task>/<metric>': value} of the last evaluation."""

    def __init__(self, every: int, evaluators: Sequence[Any], best: BestCheckpoint | None, part: SavedPart,
                 log: MetricsLog, bar: tqdm, clock: StepClock,
                 parameter_sets: Mapping[str, Callable[[TrainState], Any]] = PARAMS):
        super().__init__(every, "inference_eval_every")
        self.parameter_sets = dict(parameter_sets)
        self.evaluators, self.best, self.part = list(evaluators), best, part
        self.log, self.bar, self.clock = log, bar, clock
        self.metrics: dict[str, float] = {}

    def act(self, event: StepEvent) -> None:
        with self.clock.paused():
            self.metrics = {
                f"{prefix}{name}": value
                for prefix, params_of in self.parameter_sets.items() for evaluator in self.evaluators
                for name, value in results.flat(evaluator.evaluate(params_of(event.state), event.step)).items()
            }
            self.log.write(event.step, {f"eval_{k}": v for k, v in self.metrics.items()})
            note = ""
            if self.best is not None and self.best.update(event.step, self.metrics, self.part.of(event.state).params):
                note = f" (best {self.best.metric}: saved to {self.best.folder.path})"
            self.bar.write(f"step {event.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()) + note)

    def __exit__(self, *exc_info: object) -> None:
        if self.best is not None:
            self.best.close()
