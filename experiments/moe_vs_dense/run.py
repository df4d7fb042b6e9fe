"""MoE against dense at equal FLOPs: span-corruption pre-training of a Switch-style T5 and its dense twin (the same
d_model, d_ff and layers; the Switch model's top-1 expert layer in every other FFN), several seeds, validation loss
against steps and against wall time.

Run: python experiments/moe_vs_dense/run.py [--setting reduced|full|smoke]

Every run goes through ptmjax's own trainer (`parse_gin` + `run.train`) with the model's gin file, then
`pretrain.gin` next to this script, then the setting's bindings. The seeds of all models are interleaved (seed 0 of
every model, then seed 1, ...), so every model sees the same share of a shared machine's load. Runs go under
runs/moe_vs_dense/<setting>/<model>/seed<seed>/ (git-ignored); a run whose result.json exists is reused, so an
interrupted comparison continues where it stopped (delete the folder to start over). Outputs next to this script:
results_<setting>.md, results_<setting>.json and moe_vs_dense_<setting>.png; the reduced setting also rewrites the
README's table (`tables`, marked as ptmjax/tools/results_files.py says).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from ptmjax.gin_files import parse_gin
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.models import flops as model_flops
from ptmjax.objectives.span_corruption import SpanCorruptionOptions, span_corruption_lengths
from ptmjax.tools import results_files
from ptmjax.training.run import train

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
SCRIPT = "experiments/moe_vs_dense/run.py"  # how the README's table marker names this script
REPO_DIR = EXPERIMENT_DIR.parents[1]
RUNS_DIR = REPO_DIR / "runs" / "moe_vs_dense"
DENSE, SWITCH, WIDE = "dense T5 (d_ff 128)", "Switch T5 (8 experts, every other FFN)", "dense T5, wide FFN"


@dataclasses.dataclass(frozen=True)
class Model:
    gin_file: str
    bindings: tuple[str, ...] = ()


def wide_dense_d_ff(dense: T5Config, switch: T5Config) -> int:
    """The d_ff (a multiple of 64) that gives the dense model the Switch model's parameter count most nearly."""
    extra = parameter_count(switch) - parameter_count(dense)
    per_unit = (len(dense.ffn_activations) + 1) * dense.d_model * (dense.num_encoder_layers + dense.num_decoder_layers)
    return int(64 * round((dense.d_ff + extra / per_unit) / 64))


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    steps: int
    seeds: tuple[int, ...]
    inputs_length: int  # the targets length follows from span corruption (`span_corruption_lengths`)
    eval_every: int
    wide: bool  # add the dense model with Switch's parameter count (the paper's "same parameters" row)
    eval_batches: int | None = None  # None: the whole validation split


SETTINGS = {
    "reduced": Setting("reduced", steps=1500, seeds=(0, 1, 2), inputs_length=64, eval_every=100, wide=True),
    "full": Setting("full", steps=3000, seeds=(0, 1, 2, 3, 4), inputs_length=128, eval_every=200, wide=True),
    "smoke": Setting("smoke", steps=6, seeds=(0, 1), inputs_length=32, eval_every=3, wide=True, eval_batches=1),
}


def model_config(model: Model) -> T5Config:
    """The T5Config that a model's gin file and bindings build."""
    gin.clear_config()
    parse_gin([model.gin_file], list(model.bindings))
    config = T5Config()
    gin.clear_config()
    return config


def parameter_count(config: T5Config) -> int:
    """Parameter values of the encoder-decoder, from shapes only (not the scalars an MoE layer sows)."""
    tokens = jnp.ones((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes["params"]))


def models(setting: Setting) -> dict[str, Model]:
    """The compared models: the dense twin, the Switch model and (if the setting has it) the wide dense one."""
    compared = {DENSE: Model("models/t5_1_1_tiny.gin"), SWITCH: Model("models/switch_tiny_8.gin")}
    if setting.wide:
        d_ff = wide_dense_d_ff(*map(model_config, compared.values()))
        compared[WIDE] = Model("models/t5_1_1_tiny.gin", (f"T5Config.d_ff = {d_ff}",))
    return compared


def lengths(setting: Setting) -> dict[str, int]:
    """Inputs of the setting's length and the targets span corruption makes of them (EOS included)."""
    _, targets = span_corruption_lengths(setting.inputs_length, SpanCorruptionOptions())
    return {"inputs": setting.inputs_length, "targets": targets}


def cost(config: T5Config, feature_lengths: dict[str, int]) -> dict[str, float]:
    """Parameters, and training FLOPs (ptmjax/models/flops.py: forward and backward, router included) per step of
    one row and per token (encoder plus decoder positions), and the feed-forward blocks' forward FLOPs per token."""
    inputs, targets = feature_lengths["inputs"], feature_lengths["targets"]
    per_row = model_flops.t5_training_flops(config, 1, inputs, targets)
    layers = range(max(config.num_encoder_layers, config.num_decoder_layers))
    return {"parameters": parameter_count(config), "training_flops_per_row": per_row,
            "training_flops_per_token": per_row / (inputs + targets),
            "ffn_forward_flops_per_token_by_layer": [model_flops.feed_forward_flops(config, i) for i in layers]}


def records(model_dir: pathlib.Path) -> list[dict[str, float]]:
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def train_one(setting: Setting, model: Model, model_dir: pathlib.Path, seed: int) -> dict[str, Any]:
    """One pre-training run (or its result.json): the validation loss at each evaluation, the training wall time
    at each (the sum of logged step times: compilation and evaluations left out), and the machine's load."""
    path = model_dir / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    bindings = [*model.bindings, f"train.seed = {seed}", f"train.num_steps = {setting.steps}",
                f"train.task_feature_lengths = {lengths(setting)!r}", f"train.eval_every = {setting.eval_every}",
                f"train.checkpoint_every = {setting.steps}", f"train.eval_batches = {setting.eval_batches}",
                f"train.log_every = {min(10, setting.eval_every)}"]
    print(f"\n=== {model.gin_file} {' '.join(model.bindings)} seed {seed} -> {model_dir}", flush=True)
    gin.clear_config()
    parse_gin([model.gin_file, str(EXPERIMENT_DIR / "pretrain.gin")], bindings)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    train(str(model_dir))
    wall = time.perf_counter() - start
    gin.clear_config()
    logs = records(model_dir)
    elapsed, previous, clock = 0.0, 0, {}
    for record in logs:
        if "step_time_s" in record:
            elapsed += record["step_time_s"] * (record["step"] - previous)
        if "loss" in record:
            previous = record["step"]
            clock[record["step"]] = elapsed
    evals = [r for r in logs if "eval_loss" in r]
    result = {
        "seed": seed, "wall_s": wall, "load_1min": [load_before, os.getloadavg()[0]],
        "step_time_s": statistics.median(r["step_time_s"] for r in logs if "step_time_s" in r),
        "eval_steps": [r["step"] for r in evals], "eval_loss": [r["eval_loss"] for r in evals],
        "eval_train_seconds": [clock.get(r["step"], 0.0) for r in evals],
        "train_loss": [(r["step"], r["loss"]) for r in logs if "loss" in r],
        # The MoE layers' load-balancing and router z-losses, weighted, as the last train log gives them.
        "moe_aux_loss": next((r["moe_aux_loss"] for r in reversed(logs) if "moe_aux_loss" in r), None),
    }
    path.write_text(json.dumps(result, indent=1))
    return result


def interval(values: Sequence[float]) -> list[float]:
    """The 95% Student-t interval of the mean of `values` (over seeds)."""
    values = np.asarray(values, np.float64)
    half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return [float(values.mean() - half), float(values.mean() + half)]


def reach(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The first step (or time) at which the curve reaches `target`, interpolated linearly; None if it never does."""
    for i, (x, y) in enumerate(zip(steps, losses, strict=True)):
        if y <= target:
            if i == 0:
                return float(x)
            x0, y0 = steps[i - 1], losses[i - 1]
            return float(x0 + (x - x0) * (y0 - target) / (y0 - y))
    return None


def summarise_model(runs: list[dict[str, Any]], dense: list[dict[str, Any]], model_cost: dict[str, Any],
                    dense_cost: dict[str, Any]) -> dict[str, Any]:
    """One model's row: its cost, its final validation loss over seeds and against the dense model's (paired by
    seed), its mean curves with 95% bands, the steps and training time its mean curve takes to reach the dense
    model's final mean loss, and its step time against the dense model's (paired by seed: run one after another)."""
    losses = np.array([r["eval_loss"] for r in runs])
    seconds = np.array([r["eval_train_seconds"] for r in runs])
    steps = runs[0]["eval_steps"]
    final = losses[:, -1].tolist()
    dense_final = [r["eval_loss"][-1] for r in dense]
    dense_curve = np.mean([r["eval_loss"] for r in dense], axis=0)
    dense_seconds = np.mean([r["eval_train_seconds"] for r in dense], axis=0)
    target = float(dense_curve[-1])
    at_step, at_time = reach(steps, losses.mean(0), target), reach(seconds.mean(0).tolist(), losses.mean(0), target)
    step_ratios = [r["step_time_s"] / d["step_time_s"] for r, d in zip(runs, dense, strict=True)]
    differences = losses - np.array([r["eval_loss"] for r in dense])
    return {
        **model_cost,
        "flops_ratio_to_dense": model_cost["training_flops_per_token"] / dense_cost["training_flops_per_token"],
        "final_eval_loss_by_seed": final, "final_eval_loss_mean": statistics.fmean(final),
        "final_eval_loss_ci95": interval(final),
        "vs_dense": statistics.fmean(np.subtract(final, dense_final)),
        "vs_dense_ci95": interval(np.subtract(final, dense_final)) if runs is not dense else [0.0, 0.0],
        "curve": {"steps": steps, "loss_mean": losses.mean(0).tolist(),
                  "loss_ci95": [interval(column) for column in losses.T],
                  "train_seconds_mean": seconds.mean(0).tolist(),
                  "vs_dense_mean": differences.mean(0).tolist(),
                  "vs_dense_ci95": [interval(column) for column in differences.T]},
        "steps_to_dense_final": at_step, "speedup_steps": steps[-1] / at_step if at_step else None,
        "seconds_to_dense_final": at_time,
        "speedup_time": float(dense_seconds[-1]) / at_time if at_time else None,
        "step_time_s_by_seed": [r["step_time_s"] for r in runs],
        "step_time_ratio_to_dense": statistics.fmean(step_ratios),
        "step_time_ratio_ci95": interval(step_ratios) if runs is not dense else [1.0, 1.0],
        "runs": runs,
    }


def compare(setting: Setting, runs_dir: pathlib.Path) -> dict[str, Any]:
    """Every model at every seed (seeds outermost, so the models alternate), summarised."""
    compared = models(setting)
    feature_lengths = lengths(setting)
    costs = {name: cost(model_config(model), feature_lengths) for name, model in compared.items()}
    ratio = costs[SWITCH]["training_flops_per_token"] / costs[DENSE]["training_flops_per_token"]
    if not 0.97 < ratio < 1.03:
        raise ValueError(f"the Switch model's FLOPs per token are {ratio:.3f} times the dense twin's; they must match")
    runs = {name: [] for name in compared}
    for seed in setting.seeds:
        for name, model in compared.items():
            slug = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
            runs[name].append(train_one(setting, model, runs_dir / slug / f"seed{seed}", seed))
    every_run = [r for model_runs in runs.values() for r in model_runs]
    loads = [x for r in every_run for x in r["load_1min"]]
    return {
        "setting": dataclasses.asdict(setting), "feature_lengths": feature_lengths,
        "models": {name: dataclasses.asdict(model) for name, model in compared.items()},
        "machine": {"cpus": os.cpu_count(), "jax": jax.__version__,
                    "load_1min_min_median_max": [min(loads), statistics.median(loads), max(loads)],
                    "total_train_wall_s": sum(r["wall_s"] for r in every_run)},
        "rows": {name: summarise_model(runs[name], runs[DENSE], costs[name], costs[DENSE]) for name in compared},
    }


def speedup(value: float | None, at: float | None, unit: str) -> str:
    return f"{at:.0f} {unit} ({value:.2f}x)" if value else "not reached"


def table(results: dict[str, Any]) -> str:
    """The setting in a few lines, then one row per model."""
    setting, machine, lengths_ = results["setting"], results["machine"], results["feature_lengths"]
    lines = [
        f"- Span corruption (`ptmjax_stdlib_span_corruption`), {setting['steps']} steps of 32 packed rows, inputs "
        f"{lengths_['inputs']} / targets {lengths_['targets']} tokens, Adafactor with the inverse-sqrt schedule "
        f"(peak 0.01, 100 warmup steps); seeds {list(setting['seeds'])}, the models interleaved seed by seed.",
        f"- Machine: {machine['cpus']} CPU cores shared with other jobs (1-minute load average min / median / max "
        f"over the runs: {' / '.join(f'{x:.1f}' for x in machine['load_1min_min_median_max'])}), JAX "
        f"{machine['jax']}; the runs took {machine['total_train_wall_s'] / 60:.0f} minutes in all.\n",
        "| model | parameters | training FLOPs per token (vs dense) | final val loss: mean [95% CI] (seeds) "
        "| vs dense [95% CI] | steps to dense's final loss (speed-up) | step time, ms (vs dense [95% CI]) "
        "| train time to dense's final loss (speed-up) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["rows"].items():
        low, high = row["final_eval_loss_ci95"]
        seeds = ", ".join(f"{x:.3f}" for x in row["final_eval_loss_by_seed"])
        vs_low, vs_high = row["vs_dense_ci95"]
        vs = f"{row['vs_dense']:+.3f} [{vs_low:+.3f}, {vs_high:+.3f}]" if row["vs_dense_ci95"] != [0.0, 0.0] else "-"
        r_low, r_high = row["step_time_ratio_ci95"]
        step_ms = 1000 * statistics.median(row["step_time_s_by_seed"])
        ratio = f"{row['step_time_ratio_to_dense']:.2f}x [{r_low:.2f}, {r_high:.2f}]" if vs != "-" else "1"
        lines.append(
            f"| {name} | {row['parameters']:,} | {row['training_flops_per_token'] / 1e6:.3f}M "
            f"({row['flops_ratio_to_dense']:.3f}) | **{row['final_eval_loss_mean']:.3f}** [{low:.3f}, {high:.3f}] "
            f"({seeds}) | {vs} | {speedup(row['speedup_steps'], row['steps_to_dense_final'], 'steps')} | "
            f"{step_ms:.0f} ({ratio}) | {speedup(row['speedup_time'], row['seconds_to_dense_final'], 's')} |")
    lines += [
        "",
        "Training FLOPs: ptmjax/models/flops.py (forward and backward; an MoE layer counts its router and the one "
        "expert each token goes to), per encoder or decoder position. Val loss: cross-entropy per target token on "
        "the whole validation split after the last step. vs dense: the mean over seeds of the difference to the dense "
        "run of the same seed (the same data order), with a 95% Student-t interval. Steps and train time to dense's "
        "final loss: where the model's mean curve first reaches the dense model's final mean loss (interpolated "
        "between evaluations), and the dense model's steps or time divided by it. Step time: the median logged step "
        "time (compilation and evaluations left out), the median over seeds; the ratio is the mean over seeds of "
        "the ratio to the dense run of the same seed, which ran next to it. Train time: the sum of the step times.",
    ]
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """The README's table (its `reduced` marker), from results_reduced.json."""
    return {"reduced": table(json.loads((EXPERIMENT_DIR / "results_reduced.json").read_text()))}


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Validation loss against steps and against training wall time, and its difference to the dense run of the same
    seed against steps: the mean over seeds with its 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for (name, row), color in zip(results["rows"].items(), plt.cm.tab10.colors, strict=False):
        curve = row["curve"]
        for axis, x, key in ((axes[0], curve["steps"], "loss"), (axes[1], curve["train_seconds_mean"], "loss"),
                             (axes[2], curve["steps"], "vs_dense")):
            low, high = np.array(curve[f"{key}_ci95"]).T
            axis.plot(x, curve[f"{key}_mean"], color=color, label=name)
            axis.fill_between(x, low, high, color=color, alpha=0.2)
    seeds = len(results["setting"]["seeds"])
    axes[0].set(xlabel="step", ylabel=f"validation loss per target token (mean of {seeds} seeds, 95% CI)",
                title="against steps")
    axes[1].set(xlabel="training wall time, s (mean over seeds; shared CPU)", title="against wall time")
    axes[2].set(xlabel="step", ylabel="minus the dense run of the same seed (mean, 95% CI)",
                title="difference to the dense model")
    axes[0].legend(fontsize=8)
    axes[1].sharey(axes[0])
    for axis in axes:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="reduced")
    parser.add_argument("--full", action="store_true", help="the same as --setting full")
    args = parser.parse_args(argv)
    setting = SETTINGS["full" if args.full else args.setting]
    results = {"measured": results_files.run_record(), **compare(setting, RUNS_DIR / setting.name)}
    text = table(results)
    results_files.publish(EXPERIMENT_DIR, f"_{setting.name}", results,
                          f"# MoE against dense: {setting.name} setting\n\n{text}", plot, "moe_vs_dense",
                          (SCRIPT, tables) if setting.name == "reduced" else None)  # the setting the README reports
    print(text)


if __name__ == "__main__":
    main()
