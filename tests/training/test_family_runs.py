"""Every model family trains with its native objective from its gin run file, through the core trainer.

Each run is shortened (small batch, short sequences, a few dozen steps on a
repeated stretch of data) and must lower its training loss; the family's own
metrics are logged and evaluated.
"""

import json

import gin
import numpy as np
import pytest

from ptmjax import gin_files
from ptmjax.training import run

# run file -> (task feature lengths, metrics the family must report)
RUNS = {
    "runs/gpt2_demo.gin": ({"targets": 32}, ("accuracy",)),
    "runs/bert_demo.gin": ({"inputs": 32, "targets": 32}, ("sentence_loss", "sentence_accuracy")),
    "runs/xlnet_demo.gin": ({"inputs": 32, "targets": 32}, ()),
    "runs/mpnet_demo.gin": ({"inputs": 32, "targets": 5}, ()),
    "runs/glm_demo.gin": ({"targets": 32}, ()),
    "runs/albert_demo.gin": ({"inputs": 32, "targets": 32}, ("sentence_loss", "sentence_accuracy")),
    "runs/electra_demo.gin": ({"inputs": 32, "targets": 32}, ("discriminator_loss", "discriminator_accuracy")),
    "runs/bart_demo.gin": ({"inputs": 32, "targets": 32}, ()),
    "runs/longt5_demo.gin": ({"inputs": 64, "targets": 16}, ()),
}


@pytest.mark.slow  # six full training runs; the train steps themselves are tested in test_family_sharding.py
@pytest.mark.parametrize("run_file", sorted(RUNS))
def test_family_trains_with_its_native_objective(tmp_path, run_file):
    lengths, family_metrics = RUNS[run_file]
    bindings = [
        f"train.task_feature_lengths = {lengths}", "train.batch_size = 8", "train.num_steps = 40",
        "train.log_every = 10", "train.eval_every = 40", "train.eval_batches = 2", "train.checkpoint_every = 40",
        "train.show_progress = False", "warmup_cosine.warmup_steps = 5", "warmup_cosine.total_steps = 40",
    ]
    gin_files.parse_gin([run_file], bindings)
    try:
        result = run.train(str(tmp_path))
    finally:
        gin.clear_config()
    records = result_records(tmp_path)
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and np.isfinite(losses).all()
    assert losses[-1] < losses[0] - 0.3, losses
    for name in ("loss", "accuracy", *family_metrics):
        assert np.isfinite(result.eval_metrics[f"eval_{name}"]), name
        assert name in records[0], name


def result_records(model_dir) -> list[dict]:
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]
