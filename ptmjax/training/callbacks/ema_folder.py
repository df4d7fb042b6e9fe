"""The callback that keeps a run's EMA of the parameters (ptmjax/training/parameter_ema.py) as MODEL_DIR/ema/."""

from __future__ import annotations

from ptmjax.training.callbacks.callback import Periodic, StepEvent
from ptmjax.training.parameter_ema import averaged_params
from ptmjax.training.params_folder import ParamsFolder
from ptmjax.training.saved_part import SavedPart

EMA_DIR = "ema"


class EmaFolder(Periodic):
    """At every checkpoint (every `every` steps, the last step and a stop), writes the averaged parameters
    (the part the run saves, `part`) to `folder`: MODEL_DIR/ema/, a model folder every tool reads; in the
    background when `folder` is asynchronous, done by the run's end. Runs after the checkpointing callback,
    which has checked the state finite."""

    acts_at_stop = True

    def __init__(self, every: int, folder: ParamsFolder, part: SavedPart):
        super().__init__(every, "checkpoint_every")
        self.folder, self.part = folder, part

    def act(self, event: StepEvent) -> None:
        averaged = event.state.replace(params=averaged_params(event.state.params, event.state.extra))
        self.folder.save(event.step, self.part.of(averaged).params)

    def __exit__(self, *exc_info: object) -> None:
        self.folder.close()
