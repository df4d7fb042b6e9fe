"""Soak: a few hundred tiny steps with a `kill -9` every 38 steps end bitwise equal to an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest
from reliability_helpers_a import assert_trees_equal, saved_checkpoint, saved_steps, train_losses

NUM_STEPS = 200
KILL_AFTER_STEPS = (25, 63, 101, 139, 177)  # between checkpoints (every 10) and near them, never aligned


def start(model_dir) -> subprocess.Popen:
    bindings = [
        f"train.num_steps = {NUM_STEPS}", "train.batch_size = 8", "train.log_every = 1", "train.eval_every = 1000",
        "train.eval_batches = 1", "train.checkpoint_every = 10", "train.show_progress = False",
        "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
    ]
    command = [sys.executable, "-m", "ptmjax.train", "--gin_file=runs/demo.gin", f"--model_dir={model_dir}"]
    command += [f"--gin_bindings={b}" for b in bindings]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def logged_step(model_dir) -> int:
    path = os.path.join(model_dir, "metrics.jsonl")
    return max(train_losses(model_dir), default=0) if os.path.exists(path) else 0


def finish(process: subprocess.Popen) -> None:
    _, errors = process.communicate(timeout=1800)
    assert process.returncode == 0, errors[-3000:]


@pytest.mark.slow
def test_kill_9_every_38_steps_ends_bitwise_equal_to_one_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finish(start(straight))
    for target in KILL_AFTER_STEPS:
        process = start(killed)
        while logged_step(killed) < target:
            assert process.poll() is None, process.communicate()[1][-3000:]
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finish(start(killed))

    assert saved_steps(killed)[-1] == saved_steps(straight)[-1] == NUM_STEPS
    want, got = saved_checkpoint(straight, NUM_STEPS), saved_checkpoint(killed, NUM_STEPS)
    assert got["data"] == want["data"] == {"batches_consumed": NUM_STEPS}
    assert_trees_equal(got["state"], want["state"])
    assert train_losses(killed) == train_losses(straight)
    assert sorted(train_losses(killed)) == list(range(1, NUM_STEPS + 1))
