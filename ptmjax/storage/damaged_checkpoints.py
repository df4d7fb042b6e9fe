"""Resuming past a damaged newest checkpoint (a truncated array file, a deleted `_METADATA`), or from an older one.

When the newest checkpoint does not restore, its files are read back without
the model: if that fails too, the checkpoint is damaged. It is set aside as
`checkpoints/<step>.damaged` (kept for inspection, never deleted) and the run
resumes from the next newest one, with a message naming the step and what was
wrong. If the files read back, the checkpoint is intact and the error (a model
that differs from the saved one) is raised as it is. A run resumed from an older
step (`--resume_step`) sets the newer checkpoints aside the same way, as
`<step>.abandoned`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import multihost_utils

from ptmjax.storage.checkpoints import Checkpointer, State

DAMAGED_SUFFIX = ".damaged"
ABANDONED_SUFFIX = ".abandoned"


def restore_newest_intact(
    checkpointer: Checkpointer, abstract_state: State, shardings: State, warn: Callable[[str], None] = print
) -> tuple[State, dict[str, Any]]:
    """Restores the newest checkpoint whose files are intact, setting damaged newer ones aside."""
    while True:
        step = checkpointer.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {checkpointer.directory}")
        try:
            return checkpointer.restore(abstract_state, shardings, step=step)
        except Exception as error:
            problem = damage(checkpointer.directory, step)
            if problem is None:
                raise
            moved_to = set_aside(checkpointer, step)
            older = checkpointer.latest_step()
            if older is None:
                raise FileNotFoundError(
                    f"checkpoint step {step}, the last one in {checkpointer.directory}, is damaged ({problem}); "
                    f"it was moved to {moved_to} for inspection; rerun to start the run over"
                ) from error
            warn(
                f"checkpoint step {step} is damaged ({problem}); moved it to {moved_to} for inspection and "
                f"resuming from step {older}"
            )


def set_newer_aside(checkpointer: Checkpointer, step: int, warn: Callable[[str], None] = print) -> None:
    """Sets the checkpoints newer than `step` aside as `<step>.abandoned` (kept, never deleted), so that the
    run resumes from `step`."""
    newer = [s for s in checkpointer.all_steps() if s > step]
    moved = [set_aside(checkpointer, s, ABANDONED_SUFFIX) for s in sorted(newer)]
    if moved:
        warn(f"resuming from step {step}: set the newer checkpoints aside (kept, never deleted): {', '.join(moved)}")


def damage(directory: str, step: int) -> str | None:
    """What is wrong with the files of checkpoint `step` under `directory`, or None if they all read back."""
    try:
        Checkpointer(directory, read_only=True).read_back(step)
    except Exception as error:
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}"
    return None


def set_aside(checkpointer: Checkpointer, step: int, suffix: str = DAMAGED_SUFFIX) -> str:
    """Renames checkpoint `step` to `<step><suffix>` (numbered if that exists); returns the new path."""
    source = os.path.join(checkpointer.directory, str(step))
    target, n = source + suffix, 1
    while os.path.exists(target):
        n += 1
        target = f"{source}{suffix}{n}"
    if jax.process_index() == 0:
        os.rename(source, target)
    if jax.process_count() > 1:  # no process looks for the next checkpoint before the rename is done
        multihost_utils.sync_global_devices(f"ptmjax: set aside damaged checkpoint {step}")
    checkpointer.reload()
    return target
