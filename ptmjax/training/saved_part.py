"""Runs that save only the parameters they train, over a base model folder.

A run with `train.trainable` that starts from `train.init_checkpoint` (LoRA,
adapters, a soft prompt, BitFit, a head on a frozen backbone) keeps in each
checkpoint only the parameters it trains, with their optimizer state and the
data position, and records the init checkpoint folder and step as its base in
MODEL_DIR/base.json. Its checkpoints are the size of what it trains. Whatever
reads the folder's parameters (`ModelDir.read_params`: `ptmjax infer` and
`eval`, `convert --to-hf`, `ptmjax.load`, another run's init_checkpoint)
takes the rest from the base, so the base folder must stay where it was. The
run records itself in the base's dependants.json and keeps the step it reads
out of the base's checkpoint rotation (its checkpoints/kept_steps.json), so
that training the base further never deletes it.

A run saves everything when the base does not hold every frozen parameter in
the model's layout: a base saved with the other `scan_layers` setting, or
frozen parameters that are new (not in the base).
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from ptmjax.storage.checkpoints import keep_step
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import overlay, shapes_by_path, subtree


@dataclasses.dataclass(frozen=True)
class SavedPart:
    """The parameter paths (in the model's layout) a run's checkpoints hold, None for all, and the base
    folder and step the other parameters come from."""

    paths: tuple[str, ...] | None = None
    base: tuple[ModelDir, int] | None = None

    def of(self, state: TrainState) -> TrainState:
        """The part of `state` (arrays, abstract arrays or shardings) that checkpoints hold."""
        return state if self.paths is None else state.replace(params=subtree(state.params, self.paths))

    def complete(self, saved: TrainState, trainer: Trainer) -> TrainState:
        """A restored saved part with the other parameters read from the base, sharded as the trainer's."""
        if self.paths is None:
            return saved
        folder, step = self.base
        abstract, shardings = trainer.abstract_state.params, trainer.state_shardings.params
        rest = sorted(shapes_by_path(abstract).keys() - set(self.paths))
        base_params = folder.read_params(subtree(abstract, rest), subtree(shardings, rest), step, whole=False)
        return saved.replace(params=overlay(base_params, saved.params))


def saved_part(folder: ModelDir, trainer: Trainer, init_checkpoint: str | None, trainable: bool) -> SavedPart:
    """What the run in `folder` saves: as it began when it resumes (its base.json), else only the trained
    parameters when it starts from `init_checkpoint` with frozen parameters that the base holds."""
    if folder.saved_steps():
        base = folder.base()
        return SavedPart(trainer.trained_paths, base) if base is not None else SavedPart()
    if not trainable or init_checkpoint is None:
        return SavedPart()
    init = ModelDir(init_checkpoint)
    step = init.checkpoint_step()
    in_base = shapes_by_path(init.state_metadata(step)["params"])
    model = shapes_by_path(trainer.abstract_state.params)
    frozen = model.keys() - set(trainer.trained_paths)
    if any(in_base.get(path) != model[path] for path in frozen):
        print(f"Saving every parameter: {init.path} does not hold all frozen ones in this model's layout")
        return SavedPart()
    return SavedPart(trainer.trained_paths, (init, step))


def protect_base(run: ModelDir, base: ModelDir, step: int) -> None:
    """Records `run` as a dependant of `base` and keeps `step` out of the base's checkpoint rotation; a base
    that cannot be written (a shared, read-only folder) gets a warning saying what to keep."""
    try:
        keep_step(base.checkpoints_path, step)
        base.add_dependant(run, step)
    except OSError as error:
        warnings.warn(
            f"could not mark step {step} of {base.path} as kept for {run.path} ({error.strerror or error}): training "
            f"{base.path} further may delete it, and {run.path} then no longer loads; keep a copy of "
            f"{os.path.join(base.checkpoints_path, str(step))}", stacklevel=2,
        )
        return
    print(f"Step {step} of {base.path} is kept out of its checkpoint rotation for this run "
          f"({base.dependants_path})")
