"""`ptmjax train --gin_file=runs/glm_demo.gin` as a user runs it: GLM learns blank infilling from the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest


@pytest.mark.slow  # a CLI training run (about a minute on 2 shared cores)
def test_glm_demo_trains_from_the_cli(tmp_path):
    bindings = [
        "train.task_feature_lengths = {'targets': 64}", "train.batch_size = 8", "train.num_steps = 40",
        "train.log_every = 10", "train.eval_every = 40", "train.eval_batches = 2", "train.checkpoint_every = 40",
        "warmup_cosine.warmup_steps = 5", "warmup_cosine.total_steps = 40",
    ]
    command = [sys.executable, "-m", "ptmjax.cli", "train", "--gin_file=runs/glm_demo.gin",
               f"--model_dir={tmp_path}", *(f"--gin_bindings={b}" for b in bindings)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and np.isfinite(losses).all()
    assert losses[-1] < losses[0] - 0.3, losses
    evals = [r for r in records if "eval_loss" in r]
    assert evals and np.isfinite(evals[-1]["eval_loss"]) and np.isfinite(evals[-1]["eval_accuracy"])
    with open(tmp_path / "config.gin") as f:
        assert "GPT2Config.block_position_embeddings = True" in f.read()
