"""Large-batch training of the GPT-2 demo with AdamW, LAMB and LARS: does the trust ratio keep a run stable
where Adam at the same batch and learning rate is not?

Run: python experiments/large_batch_optimizers/run.py [--seeds 3] [--rate_factors 1,10]

The setting was fixed before looking at any result: `runs/gpt2_demo.gin` at 8x its batch (256 rows of 64
tokens) and 10x its peak rate (3e-2, about the linear-scaling rule's 2.4e-2), warmup 10 steps then cosine
decay over 60. AdamW and LAMB run at that rate; LARS, whose step is `trust_coefficient` (1e-3) times the rate
relative to each weight, at `--lars_rate` (its own scale, not comparable). `--rate_factors` multiplies every
optimizer's rate, to find where each stops training. Each run is in-process through `run.train`, seeded by
`train.seed` (parameters and data order); a run whose loss or gradients turn non-finite stops (the trainer's
NonFiniteError) and is reported as diverged. Finished runs are cached in runs/large_batch_optimizers/, so an
interrupted comparison resumes; results.json, results.md and large_batch_optimizers.png go next to this file.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import statistics
import time

import gin
import numpy as np

from ptmjax import gin_files
from ptmjax.training import run
from ptmjax.training.nonfinite import NonFiniteError

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
RUNS_DIR = pathlib.Path("runs/large_batch_optimizers")


def train_once(optimizer: str, rate: float, seed: int, args: argparse.Namespace) -> dict:
    """One shortened demo run (cached by its settings); its logged losses, final validation loss and wall time."""
    model_dir = RUNS_DIR / f"{optimizer}_rate{rate:g}_seed{seed}_b{args.batch_size}_s{args.steps}"
    cached = model_dir / "result.json"
    if cached.exists():
        return json.loads(cached.read_text())
    shutil.rmtree(model_dir, ignore_errors=True)
    bindings = [
        f"train.optimizer = @{optimizer}", f"warmup_cosine.peak_learning_rate = {rate}", f"train.seed = {seed}",
        f"train.batch_size = {args.batch_size}", "train.task_feature_lengths = {'targets': 64}",
        f"train.num_steps = {args.steps}", f"warmup_cosine.total_steps = {args.steps}",
        "warmup_cosine.warmup_steps = 10", "train.log_every = 5", f"train.eval_every = {args.steps}",
        "train.eval_batches = 4", f"train.checkpoint_every = {args.steps}", "train.show_progress = False",
    ]
    start = time.perf_counter()
    gin_files.parse_gin(["runs/gpt2_demo.gin"], bindings)
    try:
        outcome, error = run.train(str(model_dir)), None
    except NonFiniteError as e:  # the run diverged
        outcome, error = None, str(e).splitlines()[0]
    finally:
        gin.clear_config()
    with open(model_dir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    result = {"optimizer": optimizer, "rate": rate, "seed": seed, "error": error,
              "losses": {str(r["step"]): r["loss"] for r in records if "loss" in r},
              "eval_loss": None if outcome is None else float(outcome.eval_metrics["eval_loss"]),
              "seconds": round(time.perf_counter() - start, 1)}
    cached.write_text(json.dumps(result))
    return result


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of `values` (one per seed)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def groups(results: list[dict]) -> dict[tuple[str, float], list[dict]]:
    """The runs of each (optimizer, rate), in the order they ran."""
    grouped: dict[tuple[str, float], list[dict]] = {}
    for r in results:
        grouped.setdefault((r["optimizer"], r["rate"]), []).append(r)
    return grouped


def table(results: list[dict]) -> str:
    lines = ["| optimizer | peak rate | seeds | diverged | training loss at step 10 | last training loss | "
             "validation loss (mean, 95% t-interval) |", "|---|---|---|---|---|---|---|"]
    for (optimizer, rate), runs in groups(results).items():
        finished = [r for r in runs if r["error"] is None]

        def cell(values: list[float]) -> str:
            return "-" if not values else "{:.3f} [{:.3f}, {:.3f}]".format(*t_interval(values))

        at_10 = [r["losses"]["10"] for r in finished if "10" in r["losses"]]
        last = [list(r["losses"].values())[-1] for r in finished]
        lines.append(f"| {optimizer} | {rate:g} | {len(runs)} | {len(runs) - len(finished)} | {cell(at_10)} | "
                     f"{cell(last)} | {cell([r['eval_loss'] for r in finished])} |")
    return "\n".join(lines)


def plot(results: list[dict], path: pathlib.Path) -> None:
    """Training loss against step, one panel per rate factor, mean over seeds with its 95% t-band."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    factors = sorted({r["factor"] for r in results})
    fig, axes = plt.subplots(1, len(factors), figsize=(5 * len(factors), 4), squeeze=False, sharey=True)
    for ax, factor in zip(axes[0], factors, strict=True):
        for (optimizer, rate), runs in groups([r for r in results if r["factor"] == factor]).items():
            finished = [r for r in runs if r["error"] is None]
            if not finished:
                ax.plot([], [], label=f"{optimizer} {rate:g}: all {len(runs)} diverged")
                continue
            steps = [int(s) for s in finished[0]["losses"]]
            curves = np.array([[r["losses"][str(s)] for s in steps] for r in finished])
            band = np.array([t_interval(list(column)) for column in curves.T])
            line, = ax.plot(steps, band[:, 0], label=f"{optimizer} {rate:g} ({len(finished)}/{len(runs)} seeds)")
            ax.fill_between(steps, band[:, 1], band[:, 2], color=line.get_color(), alpha=0.25)
        ax.set_title(f"peak rates x{factor:g}")
        ax.set_xlabel("step")
        ax.legend()
    axes[0][0].set_ylabel("training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--rate", type=float, default=3e-2)
    parser.add_argument("--lars_rate", type=float, default=5.0)
    parser.add_argument("--rate_factors", default="1,10", help="multipliers of every optimizer's rate")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--optimizers", default="adamw,lamb,lars")
    args = parser.parse_args()
    results = []
    for factor in [float(f) for f in args.rate_factors.split(",")]:
        for seed in range(args.seeds):
            for name in args.optimizers.split(","):
                rate = factor * (args.lars_rate if name == "lars" else args.rate)
                results.append({**train_once(name, rate, seed, args), "factor": factor})
                print(f"{name} rate {rate:g} seed {seed}: {results[-1]['eval_loss']} "
                      f"({results[-1]['error'] or 'finished'}, {results[-1]['seconds']} s)", flush=True)
    setting = (f"GPT-2 demo, batch {args.batch_size} x 64 tokens, {args.steps} steps, warmup 10 then cosine, "
               f"{args.seeds} seeds; {platform.processor() or platform.machine()}")
    (EXPERIMENT_DIR / "results.json").write_text(json.dumps({"setting": setting, "runs": results}, indent=1))
    (EXPERIMENT_DIR / "results.md").write_text(f"{setting}\n\n{table(results)}\n")
    plot(results, EXPERIMENT_DIR / "large_batch_optimizers.png")
    print(table(results))


if __name__ == "__main__":
    main()
