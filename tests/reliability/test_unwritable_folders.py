"""A read-only or full model folder stops a run before its first step, with one line, and loses nothing."""

import os
import subprocess
import sys

import pytest
from reliability_helpers_a import records, run, saved_steps

from ptmjax.storage.writable import FolderNotWritable


@pytest.mark.slow
def test_a_read_only_checkpoints_folder_stops_the_run_before_its_first_step(tmp_path, mount):
    run(tmp_path, num_steps=2)
    config, logged = (tmp_path / "config.gin").read_text(), records(tmp_path)
    mount(tmp_path / "checkpoints", "bind")
    with pytest.raises(FolderNotWritable) as raised:
        run(tmp_path, num_steps=4)
    assert str(raised.value).splitlines()[0] == (
        f"cannot write to {tmp_path / 'checkpoints'} (Read-only file system); make it writable, or choose "
        "another --model_dir"
    )
    assert saved_steps(tmp_path) == [2]
    assert (tmp_path / "config.gin").read_text() == config and records(tmp_path) == logged
    assert not (tmp_path / "run.lock").exists()


def test_a_disk_without_room_for_one_checkpoint_stops_the_run_before_anything_is_written(tmp_path, mount):
    model_dir = tmp_path / "small"
    model_dir.mkdir()
    mount(model_dir, "size=256k")
    with pytest.raises(FolderNotWritable, match=(
        rf"^{model_dir} has 0\.2 MiB free, less than the \d+\.\d MiB one checkpoint of this run "
        r"takes; free space there, or choose another --model_dir"
    )):
        run(model_dir, num_steps=4)
    assert os.listdir(model_dir) == []


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_temporary_file(tmp_path, mount):
    model_dir = tmp_path / "full"
    model_dir.mkdir()
    mount(model_dir, "size=64k")
    with pytest.raises(OSError), open(model_dir / "filler", "wb") as filler:
        filler.write(b"\0" * 2**20)
    with pytest.raises(FolderNotWritable) as raised:
        run(model_dir, num_steps=2)
    assert str(raised.value).splitlines()[0] == (
        f"cannot write the run lock {model_dir / 'run.lock'} (No space left on device); make {model_dir} "
        "writable and free space there, or choose another --model_dir"
    )
    assert os.listdir(model_dir) == ["filler"]


FILL_THE_DISK = """
import sys
sys.path.insert(0, {helpers!r})
from reliability_helpers_b import run
from ptmjax.cli import one_line
from ptmjax.storage.checkpoints import CheckpointSaveError
try:
    run({model_dir!r}, num_steps=40, show_progress=False)
except CheckpointSaveError as error:
    print("error:", one_line(error), file=sys.stderr)
"""


@pytest.mark.slow
def test_a_disk_that_fills_up_at_a_save_ends_with_that_error_not_buried_in_tracebacks(tmp_path, mount):
    """Room for the first checkpoint, not the second. (Was: 1,216 lines, 220 of them 'Event loop is closed'.)"""
    model_dir = tmp_path / "filling"
    model_dir.mkdir()
    mount(model_dir, "size=2200k")
    code = FILL_THE_DISK.format(helpers=os.path.dirname(__file__), model_dir=str(model_dir / "run"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    errors = done.stderr.strip().splitlines()
    assert errors[-1].startswith(f"error: saving the checkpoint of step 4 to {model_dir}/run/checkpoints failed (")
    assert "No space left on device" in errors[-1]
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr
    assert len(errors) < 20, done.stderr[-3000:]  # Orbax's own one-line error logs, and the error
    assert saved_steps(model_dir / "run") == [2]
