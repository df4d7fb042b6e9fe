"""Orbax checkpoints of the train state together with the data position.

Saves are asynchronous; the last `max_to_keep` are kept, and any step marked
with `keep` (listed in `kept_steps.json` beside them) as well. A background
save that failed raises `CheckpointSaveError` at the next `check_for_errors`,
`save`, `wait` or `close`. A checkpoint holds
two items: `state` (the sharded train state, written with TensorStore) and
`data` (JSON: how many batches the input pipeline has produced), so that a
resumed run reads exactly the batches it would have read. The state is any
flax struct dataclass (ptmjax/training/train_state.py); it is saved as the
tree of its fields, less those that hold an empty mapping, so a run without
extra state ('extra', ptmjax/training/extra_state.py) saves and reads the
checkpoints it always did. Restoring takes
the target shardings, so a checkpoint saved on one mesh restores onto any
other (Orbax reshards on read).

A restore or save that fails (a damaged file, a model of other shapes, a
full disk) abandons the reads or writes still in flight: TensorStore's threads
later report "Event loop is closed" to Orbax's finished event loop, and
Orbax's coroutines raise when they are collected (at exit too), dozens of
tracebacks after the real error; a failing write reports them before Orbax
raises. From the first save or failed restore on, those reports (and only
they) are dropped from `sys.unraisablehook`. The errors Orbax's
background threads log are kept to their one-line message, without their
tracebacks: the failed save is reported once, as a CheckpointSaveError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp

from ptmjax.storage.written_whole import file_written_whole

KEPT_STEPS_FILE = "kept_steps.json"

State = TypeVar("State")  # a flax struct dataclass: the train state


class CheckpointSaveError(ValueError):
    """A checkpoint could not be written (a ValueError, so `ptmjax train` prints it as one line)."""


class _KeptSteps(ocp.checkpoint_managers.PreservationPolicy):
    """Preserves the steps listed in `directory`'s kept_steps.json, read again at every decision: another run
    that depends on a step (ptmjax/training/saved_part.py) may add it while this one trains."""

    def __init__(self, directory: str):
        self.directory = directory

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        kept = set(read_kept_steps(self.directory))
        return [checkpoint.step in kept for checkpoint in checkpoints]


@gin.configurable
class Checkpointer:
    """Saves and restores (train state, data position) under `directory`.

    Args:
      directory: the checkpoint folder (created if missing).
      max_to_keep: how many recent checkpoints to keep.
      asynchronous: write in a background thread while training goes on.
      read_only: only read: create nothing, not even a missing `directory`.
    """

    def __init__(self, directory: str, max_to_keep: int = 3, asynchronous: bool = True, read_only: bool = False):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(directory)
        self._kept = _KeptSteps(self.directory)
        retention = {} if read_only else {
            "preservation_policy": ocp.checkpoint_managers.AnyPreservationPolicy(
                [ocp.checkpoint_managers.LatestN(max_to_keep), self._kept]
            )
        }
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=asynchronous, create=not read_only, read_only=read_only, **retention
            ),
        )
        self._saving_step: int | None = None  # the step of the newest save started

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    @property
    def kept_steps(self) -> list[int]:
        """The steps marked with `keep`."""
        return read_kept_steps(self.directory)

    def keep(self, step: int) -> None:
        """Keeps `step` out of rotation: `max_to_keep` never deletes it (recorded in kept_steps.json)."""
        if jax.process_index() == 0:
            keep_step(self.directory, step)

    def reload(self) -> None:
        """Rereads which steps are on disk (after a step folder was moved)."""
        self._manager.reload()

    def save(self, step: int, state: State, data_state: dict[str, Any]) -> None:
        """Starts saving (once the previous save is done); returns while the write finishes in the background."""
        self.wait()
        self._saving_step = step
        _drop_abandoned_reports()  # a write that fails reports them at once, before Orbax raises
        with self._surfacing_save_errors():
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(_saved_tree(state)), data=ocp.args.JsonSave(data_state)
                ),
                force=True,
            )
        self._saving_step = step

    def check_for_errors(self) -> None:
        """Raises CheckpointSaveError if a background save has failed; returns at once otherwise."""
        if not self._manager.is_saving_in_progress():
            self.wait()  # nothing to wait for: raises the error a finished save left, if any

    def restore(
        self, abstract_state: State, shardings: State, step: int | None = None
    ) -> tuple[State, dict[str, Any]]:
        """Restores `step` (default: the latest) onto `shardings`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
        )
        with _quiet_after_failure():
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_saved_tree(target)), data=ocp.args.JsonRestore()
                ),
            )
        return type(abstract_state)(**restored["state"]), dict(restored["data"])

    def read_back(self, step: int) -> dict[str, Any]:
        """{'state': numpy tree, 'data': data position} of `step` as saved, read onto the host without a model;
        raises if any of its files is missing or unreadable. Closes this Checkpointer."""
        try:
            metadata = saved_state_metadata(os.path.join(self.directory, str(step), "state"))
            as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
            with _quiet_after_failure():
                return self._manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.PyTreeRestore(restore_args=as_numpy), data=ocp.args.JsonRestore()
                    ),
                )
        finally:
            self.close()

    def save_params(self, step: int, params: Any) -> None:
        """Saves parameters alone (an imported model): a `state` item {'step', 'params'} and data position 0."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"step": step, "params": params}),
                data=ocp.args.JsonSave({"batches_consumed": 0}),
            ),
            force=True,
        )

    def restore_params(self, abstract_params: Any, shardings: Any = None, step: int | None = None) -> Any:
        """Restores only the parameters of `step` (default: the latest), of a run or of an imported model.

        shardings: a matching tree of shardings, or None for numpy arrays on the host.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if shardings is None:
            target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract_params)
        else:
            target = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params, shardings
            )
        item = {"params": target}
        with _quiet_after_failure():
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True
                    )
                ),
            )
        return restored["state"]["params"]

    def wait(self) -> None:
        """Blocks until pending saves are on disk."""
        with self._surfacing_save_errors():
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and shuts Orbax's background threads down, also when a save failed."""
        try:
            self.wait()
        finally:
            self._manager.close()

    @contextlib.contextmanager
    def _surfacing_save_errors(self) -> Iterator[None]:
        """Turns the error of a failed background save into a CheckpointSaveError naming the step."""
        try:
            yield
        except CheckpointSaveError:
            raise
        except Exception as error:
            if self._saving_step is None:
                raise
            step, self._saving_step = self._saving_step, None
            detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise CheckpointSaveError(
                f"saving the checkpoint of step {step} to {self.directory} failed ({type(error).__name__}: "
                f"{detail}); make the folder writable (and check free space), then rerun the same command to "
                "resume from the newest checkpoint saved"
            ) from error


def read_kept_steps(directory: str) -> list[int]:
    """The steps `directory`'s kept_steps.json keeps out of rotation (none without the file)."""
    path = os.path.join(directory, KEPT_STEPS_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return sorted(int(step) for step in json.load(f))


def keep_step(directory: str, step: int) -> None:
    """Adds `step` to `directory`'s kept_steps.json, written whole (the file is read while a run trains there)."""
    kept = sorted({*read_kept_steps(directory), step})
    with file_written_whole(os.path.join(directory, KEPT_STEPS_FILE)) as f:
        json.dump(kept, f)


def _saved_tree(state: Any) -> dict[str, Any]:
    """The tree a checkpoint's `state` item holds: the state's fields, less those holding an empty mapping."""
    fields = {field.name: getattr(state, field.name) for field in dataclasses.fields(state)}
    return {name: value for name, value in fields.items() if not (isinstance(value, dict) and not value)}


CLOSED_LOOP_REPORTS = ("Event loop is closed", "cannot schedule new futures after shutdown")


@contextlib.contextmanager
def _quiet_after_failure() -> Iterator[None]:
    """Drops the reports of the reads a failed restore abandoned, from the first failed restore on (see the
    module docstring); other unraisable exceptions still reach the hook that was there."""
    try:
        yield
    except Exception:
        _drop_abandoned_reports()
        raise


def _drop_abandoned_reports() -> None:
    """From now on, the unraisable reports of Orbax's abandoned reads and writes are dropped."""
    if not isinstance(sys.unraisablehook, _DroppingAbandonedOperations):
        sys.unraisablehook = _DroppingAbandonedOperations(sys.unraisablehook)


class _DroppingAbandonedOperations:
    """An unraisable hook that drops reports of abandoned Orbax reads and writes (a closed event loop, an Orbax
    coroutine collected unfinished) and passes the rest to `previous`."""

    def __init__(self, previous: Callable[[Any], object]):
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
        closed_loop = isinstance(error, RuntimeError) and str(error) in CLOSED_LOOP_REPORTS
        collected_orbax_coroutine = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
        if not (closed_loop or collected_orbax_coroutine):
            self.previous(unraisable)


class _WithoutTraceback(logging.Filter):
    """Keeps the errors Orbax logs to their message: their tracebacks are those of one failure, reported
    once by the Checkpointer."""

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" in record.pathname:
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("absl").addFilter(_WithoutTraceback())


def saved_state_metadata(state_dir: str) -> dict[str, Any]:
    """The saved tree of ArrayMetadata (shape, dtype) of a checkpoint's `state` item, read from disk."""
    from etils import epath

    return dict(ocp.StandardCheckpointHandler().metadata(epath.Path(state_dir)))
