"""A run file's demo trained a few steps through `ptmjax train` (in this process), and its logged records."""

import json
import pathlib

import gin


def train_from_cli(gin_file: str, model_dir: pathlib.Path, num_steps: int, *bindings: str) -> list[dict]:
    """Rows of 32 tokens, batch 8, logging every 2 steps, evaluating (2 batches) and saving at the end; `bindings`
    add to these. Returns metrics.jsonl's records; fails unless the command exits 0."""
    from ptmjax import cli

    shortened = ["train.task_feature_lengths = {'inputs': 32, 'targets': 32}", "train.batch_size = 8",
                 f"train.num_steps = {num_steps}", "train.log_every = 2", f"train.eval_every = {num_steps}",
                 "train.eval_batches = 2", f"train.checkpoint_every = {num_steps}", "train.show_progress = False",
                 "warmup_cosine.warmup_steps = 2", f"warmup_cosine.total_steps = {num_steps}", *bindings]
    try:
        code = cli.main(["train", f"--gin_file={gin_file}", f"--model_dir={model_dir}",
                         *(f"--gin_bindings={b}" for b in shortened)])
    finally:
        gin.clear_config()
    assert code == 0
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]
