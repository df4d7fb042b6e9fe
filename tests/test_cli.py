"""`ptmjax train` as a user runs it: SIGTERM saves a checkpoint, a rerun resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ptmjax import gin_files


def start_training(model_dir, *bindings):
    command = [
        sys.executable, "-m", "ptmjax.train", "--gin_file=runs/demo.gin", f"--model_dir={model_dir}",
        "--gin_bindings=train.log_every = 2", "--gin_bindings=train.checkpoint_every = 1000",
        "--gin_bindings=train.eval_batches = 1",
        *(f"--gin_bindings={b}" for b in bindings),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def logged_steps(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.strip()]


def test_sigterm_saves_and_a_rerun_resumes(tmp_path):
    model_dir = str(tmp_path / "run")
    process = start_training(model_dir, "train.num_steps = 100000")
    deadline = time.time() + 240
    while not logged_steps(model_dir):
        assert process.poll() is None, process.communicate()[0]
        assert time.time() < deadline, "no metrics after 240 s"
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "SIGTERM: saved step" in output
    saved = [int(d) for d in os.listdir(os.path.join(model_dir, "checkpoints")) if d.isdigit()]
    assert len(saved) == 1 and 2 <= saved[0] < 100000
    with open(os.path.join(model_dir, "config.gin")) as f:
        config = f.read()
    assert "T5Config.d_model = 64" in config and "train.num_steps = 100000" in config
    assert os.path.exists(os.path.join(model_dir, "loss_curve.png"))

    process = start_training(model_dir, f"train.num_steps = {saved[0] + 2}")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert f"Resumed from step {saved[0]}" in output
    assert f"Training finished at step {saved[0] + 2}" in output
    assert "eval_loss" in output


def test_unknown_gin_file_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match=r"runs/demo.gin"):
        gin_files.resolve_gin_file("runs/dmeo.gin")


def test_includes_resolve_beside_folders_named_like_gin_subfolders(tmp_path, monkeypatch):
    """A `runs/` output folder on sys.path must not break `include 'runs/...'`."""
    import gin

    for name in ("runs", "models", "mesh"):
        (tmp_path / name).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        gin_files.parse_gin(["runs/demo.gin"])
        assert gin.query_parameter("T5Config.d_model") == 64
    finally:
        gin.clear_config()


@pytest.mark.parametrize("binding,name", [("train.num_stepz = 3", "num_stepz"), ("T5Config.d_modle = 3", "d_modle")])
def test_misspelt_binding_fails_before_any_work_naming_it(binding, name):
    import gin

    try:
        with pytest.raises(ValueError, match=f"doesn't have a parameter named '{name}'"):
            gin_files.parse_gin(["runs/demo.gin"], [binding])
    finally:
        gin.clear_config()
