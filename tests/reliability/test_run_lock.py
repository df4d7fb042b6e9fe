"""Two runs on one model folder: the second fails at once naming the owner; a stale lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from reliability_helpers_b import run

from ptmjax.training.run_lock import RunDirInUse, holding_run_lock

HOLD_LOCK = (
    "import sys, time; from ptmjax.training.run_lock import holding_run_lock; "
    "lock = holding_run_lock(sys.argv[1]); lock.__enter__(); print('locked', flush=True); time.sleep(600)"
)


def write_lock(model_dir, host, pid):
    model_dir.mkdir(exist_ok=True)
    (model_dir / "run.lock").write_text(json.dumps({"host": host, "pid": pid}))


def test_a_second_run_fails_at_once_naming_the_owners_host_and_pid(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "locked"
        start = time.perf_counter()
        with pytest.raises(RunDirInUse) as error:
            run(tmp_path, num_steps=2)
        waited = time.perf_counter() - start
    finally:
        owner.kill()
        owner.wait()
    assert str(error.value).splitlines()[0] == (
        f"{tmp_path} is in use by another run: pid {owner.pid} on host {socket.gethostname()} holds "
        f"{tmp_path / 'run.lock'}; wait for it, use another --model_dir, or delete that file if the run is gone"
    )
    assert waited < 5  # before building the model or reading any data
    assert sorted(os.listdir(tmp_path)) == ["run.lock"]  # the owner's lock, and nothing the second run wrote


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(tmp_path, socket.gethostname(), dead.pid)
    with pytest.warns(UserWarning, match=f"took over the stale lock .*run.lock of pid {dead.pid} on host "):
        with holding_run_lock(str(tmp_path)):
            held = json.loads((tmp_path / "run.lock").read_text())
    assert held == {"host": socket.gethostname(), "pid": os.getpid()}
    assert not (tmp_path / "run.lock").exists()  # released on exit


def test_this_pid_in_a_lock_this_process_does_not_hold_is_stale(tmp_path):
    """A restarted container often gets the same pid as the run it replaces."""
    write_lock(tmp_path, socket.gethostname(), os.getpid())
    with pytest.warns(UserWarning, match="took over the stale lock"):
        with holding_run_lock(str(tmp_path)):
            with pytest.raises(RunDirInUse, match=f"pid {os.getpid()} on host"):
                with holding_run_lock(str(tmp_path)):
                    pass


def test_a_lock_from_another_host_is_kept(tmp_path):
    write_lock(tmp_path, "another-host", 1)
    with pytest.raises(RunDirInUse, match="pid 1 on host another-host holds"):
        with holding_run_lock(str(tmp_path)):
            pass
    assert json.loads((tmp_path / "run.lock").read_text()) == {"host": "another-host", "pid": 1}


def test_a_lock_in_a_new_folder_leaves_nothing_when_the_run_writes_nothing(tmp_path):
    with holding_run_lock(str(tmp_path / "new")):
        assert os.listdir(tmp_path / "new") == ["run.lock"]
    assert not (tmp_path / "new").exists()
