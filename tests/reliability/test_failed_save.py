"""A checkpoint save that fails in Orbax's background thread stops the run at once, with a clear error."""

import threading

import pytest
from orbax.checkpoint._src.checkpointers import async_checkpointer
from reliability_helpers_a import records, run, saved_steps

from ptmjax.storage.checkpoints import CheckpointSaveError


def fail_the_second_save(monkeypatch) -> None:
    """The background half of the second save raises what a read-only checkpoints/ folder raises."""
    commit = async_checkpointer._background_wait_for_commit_futures
    calls = []

    def failing_commit(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(30, "Read-only file system")
        return commit(*args, **kwargs)

    monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", failing_commit)


def test_a_failed_background_save_stops_the_run_naming_the_step(tmp_path, monkeypatch):
    fail_the_second_save(monkeypatch)
    with pytest.raises(CheckpointSaveError) as raised:
        run(tmp_path, num_steps=40)
    assert str(raised.value).startswith(
        f"saving the checkpoint of step 4 to {tmp_path}/checkpoints failed (OSError: [Errno 30] Read-only file "
        "system); make the folder writable (and check free space), then rerun the same command to resume from "
        "the newest checkpoint saved"
    )
    assert saved_steps(tmp_path) == [2]
    assert max(r["step"] for r in records(tmp_path)) < 6  # stopped before the next save, not at the end
    assert not [t for t in threading.enumerate() if t.name == "async_save" and t.is_alive()]
