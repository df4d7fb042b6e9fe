"""Large-batch training of the GPT-2 demo with AdamW, LAMB and LARS: does the trust ratio keep a run stable
where Adam at the same batch and learning rate is not?

Run: python experiments/large_batch_optimizers/run.py [--steps 60] [--batch_size 256] [--rate 0.03]

The setting is fixed before looking at any result: `runs/gpt2_demo.gin` at 8x its batch (256 rows of 64
tokens) and 10x its peak rate (3e-2, about the linear-scaling rule's 2.4e-2), warmup 10 steps then cosine
decay. AdamW and LAMB run at that same rate; LARS, whose step is `trust_coefficient` (1e-3) times the rate
relative to each weight, runs at `--lars_rate` (its own scale, not comparable). Each run is in-process through
`run.train`; its logged training losses and its final validation loss go to results.json and results.md next
to this script. A run whose loss or gradients turn non-finite stops (the trainer's NonFiniteError) and is
reported as diverged.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import tempfile
import time

import gin
import numpy as np

from ptmjax import gin_files
from ptmjax.training import run

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent


def train_once(optimizer: str, rate: float, args: argparse.Namespace) -> dict:
    """One shortened demo run; returns its logged losses, final validation loss and wall time."""
    bindings = [
        f"train.optimizer = @{optimizer}", f"warmup_cosine.peak_learning_rate = {rate}",
        f"train.batch_size = {args.batch_size}", "train.task_feature_lengths = {'targets': 64}",
        f"train.num_steps = {args.steps}", f"warmup_cosine.total_steps = {args.steps}",
        "warmup_cosine.warmup_steps = 10", "train.log_every = 5", f"train.eval_every = {args.steps}",
        "train.eval_batches = 4", f"train.checkpoint_every = {args.steps}", "train.show_progress = False",
    ]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as model_dir:
        gin_files.parse_gin(["runs/gpt2_demo.gin"], bindings)
        try:
            result, error = run.train(model_dir), None
        except ValueError as e:  # NonFiniteError: the run diverged
            result, error = None, str(e)
        finally:
            gin.clear_config()
        with open(pathlib.Path(model_dir) / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    return {"optimizer": optimizer, "rate": rate, "losses": losses, "error": error,
            "eval_loss": None if result is None else float(result.eval_metrics["eval_loss"]),
            "seconds": round(time.perf_counter() - start, 1)}


def table(results: list[dict]) -> str:
    lines = ["| optimizer | peak rate | first logged loss | lowest | last | validation loss | outcome |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        losses = list(r["losses"].values())
        finite = [x for x in losses if np.isfinite(x)]
        outcome = "diverged: " + r["error"] if r["error"] else (
            "trained" if finite and finite[-1] < finite[0] - 0.5 else "did not train")
        cells = [f"{x:.3f}" if x is not None else "-" for x in
                 (losses[0] if losses else None, min(finite, default=None), losses[-1] if losses else None,
                  r["eval_loss"])]
        lines.append(f"| {r['optimizer']} | {r['rate']:g} | " + " | ".join(cells) + f" | {outcome} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--rate", type=float, default=3e-2)
    parser.add_argument("--lars_rate", type=float, default=5.0)
    parser.add_argument("--optimizers", default="adamw,lamb,lars")
    args = parser.parse_args()
    results = [train_once(name, args.lars_rate if name == "lars" else args.rate, args)
               for name in args.optimizers.split(",")]
    setting = (f"GPT-2 demo, batch {args.batch_size} x 64 tokens, {args.steps} steps, warmup 10 then cosine; "
               f"{platform.processor() or platform.machine()}")
    (EXPERIMENT_DIR / "results.json").write_text(json.dumps({"setting": setting, "runs": results}, indent=1))
    (EXPERIMENT_DIR / "results.md").write_text(f"{setting}\n\n{table(results)}\n")
    print(table(results))


if __name__ == "__main__":
    main()
