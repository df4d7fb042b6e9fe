"""The callback that saves the run's checkpoints: periodically, at the last step and before a stop."""

from __future__ import annotations

from collections.abc import Callable

from tqdm.auto import tqdm

from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.training.callbacks.callback import Periodic, StepEvent
from ptmjax.training.nonfinite import NonFiniteMonitor, check_finite_state
from ptmjax.training.saved_part import SavedPart


class Checkpointing(Periodic):
    """Saves the part of the state the run keeps (`part`) with the data position every `every` steps, at the
    last step and at a stop, once its steps and its state are known finite (else NonFiniteError), and never
    while a streak of skipped steps lasts (the next save after a finite step is made). After a skipped step,
    the newest checkpoint before the first one is kept out of rotation. Every step it surfaces the error of a
    failed background save, not minutes later."""

    acts_at_stop = True

    def __init__(self, every: int, checkpointer: Checkpointer, nonfinite: NonFiniteMonitor, part: SavedPart,
                 data_position: Callable[[], dict[str, int]]):
        super().__init__(every, "checkpoint_every")
        self.checkpointer, self.nonfinite, self.part, self.data_position = checkpointer, nonfinite, part, data_position

    def on_step(self, event: StepEvent) -> None:
        self.checkpointer.check_for_errors()
        super().on_step(event)

    def act(self, event: StepEvent) -> None:
        self.nonfinite.check()
        if self.nonfinite.in_streak:
            good = self.nonfinite.last_good_step()
            last = "no checkpoint precedes them" if good is None else f"the last good checkpoint is step {good}"
            tqdm.write(f"step {event.step}: no checkpoint saved: steps {self.nonfinite.streak_start}-{event.step} "
                       f"were skipped (not finite); {last}")
            return
        state = self.part.of(event.state)
        check_finite_state(event.step, state)
        first_skipped = self.nonfinite.first_skipped_step
        good = [s for s in self.checkpointer.all_steps() if first_skipped is not None and s < first_skipped]
        if good and max(good) not in self.checkpointer.kept_steps:
            self.checkpointer.keep(max(good))
        self.checkpointer.save(event.step, state, self.data_position())
