"""The experiment's statistics, table and plot, from its results file."""

from __future__ import annotations

import pathlib
import statistics
from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 10_000


def t_interval(values: list[float]) -> list[float]:
    """The 95% t-interval of the mean of `values` (one per seed); a single value is its own interval."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return [mean, mean]
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return [mean - half, mean + half]


def paired_bootstrap(correct: np.ndarray, baseline: np.ndarray) -> list[float]:
    """95% paired-bootstrap interval of mean(correct - baseline) over the validation examples.

    correct, baseline: [seeds, examples] 0/1; each example's correctness is first averaged over seeds (seed s of a
    row is compressed from seed s of the baseline)."""
    difference = correct.mean(axis=0) - baseline.mean(axis=0)
    rng = np.random.default_rng(0)
    resampled = difference[rng.integers(0, difference.size, (BOOTSTRAP_SAMPLES, difference.size))].mean(axis=1)
    return [float(x) for x in np.percentile(resampled, [2.5, 97.5])]


def summary(results: dict[str, Any], float_name: str) -> dict[str, dict[str, Any]]:
    """Each row's accuracy (mean, 95% t-interval over seeds, share of the float baseline's, paired difference from
    it with its bootstrap interval), parameters and bytes (the first seed's; they differ between seeds only in
    nonzero counts), and throughput."""
    correct = {row["name"]: np.array([seed["correct"] for seed in row["seeds"]], np.float64)
               for row in results["rows"]}
    metric = results["metric"]
    float_mean = statistics.fmean(seed[metric] for seed in next(r for r in results["rows"]
                                                                 if r["name"] == float_name)["seeds"])
    out = {}
    for row in results["rows"]:
        scores = [seed[metric] for seed in row["seeds"]]
        mean = statistics.fmean(scores)
        first = row["seeds"][0]
        out[row["name"]] = {
            "mean": mean, "ci95": t_interval(scores), "of_float": mean / float_mean,
            "vs_float": mean - float_mean, "vs_float_ci95": paired_bootstrap(correct[row["name"]], correct[float_name]),
            "parameters": first["parameters"],
            "nonzero_share": statistics.fmean(s["nonzero_parameters"] / s["parameters"] for s in row["seeds"]),
            "disk_bytes": first["disk_bytes"], "examples_per_s": row["throughput"]["examples_per_s"],
            "average_exit_layer": statistics.fmean(s["exits"]["average_exit_layer"] for s in row["seeds"])
            if row["exit_threshold"] is not None else None,
            "token_layers": statistics.fmean(s["tokens"]["token_layers"] for s in row["seeds"])
            if "tokens" in first else None,
        }
    return out


def table(results: dict[str, Any]) -> str:
    """The README's table: the setting in a few lines, then one row per model."""
    setting, summary_ = results["setting"], results["summary"]
    float_row = summary_[results["rows"][0]["name"]]
    lines = [
        f"- Setting '{setting['name']}': BERT demo backbone, {setting['num_layers']} layers, pre-trained "
        f"{setting['pretrain_steps']} steps; fine-tuned {setting['finetune_steps']} steps on "
        f"`{results['task']}` (inputs {setting['inputs_length']} tokens); QAT, magnitude pruning and PoWER-BERT "
        f"fine-tune {setting['compress_steps']} steps more; seeds {list(setting['seeds'])}, seed s of every row made "
        "from seed s of the float baseline.",
        f"- Machine: {results['measured']['machine']}, shared with other jobs (1-minute load "
        f"{' -> '.join(f'{x:.1f}' for x in results['load_1min'])}); the training runs took "
        f"{results['training_wall_s'] / 60:.0f} minutes in all; the invocation that wrote this table, reusing the "
        f"runs that had finished, {results['wall_s'] / 60:.1f} minutes.",
        "",
        f"| model | layers | parameters (nonzero) | bytes on disk | {results['metric']} [95% CI over seeds] "
        "| each seed "
        "| % of float | vs float [95% CI over examples] | examples/s (x float) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        s = summary_[row["name"]]
        low, high = s["ci95"]
        dlow, dhigh = s["vs_float_ci95"]
        seeds = ", ".join(f"{seed[results['metric']]:.3f}" for seed in row["seeds"])
        difference = "-" if s is float_row else f"{s['vs_float']:+.3f} [{dlow:+.3f}, {dhigh:+.3f}]"
        exit_layer, token_layers = s["average_exit_layer"], s["token_layers"]
        layers = row["layers"] if exit_layer is None else f"{exit_layer:.2f} of {row['layers']}"
        if token_layers is not None:
            layers = f"{row['layers']} ({token_layers:.0%} of token-layers)"
        lines.append(
            f"| {row['name']} | {layers} | {s['parameters']:,} ({s['nonzero_share']:.0%}) "
            f"| {s['disk_bytes'] / 1024:,.0f} KiB ({s['disk_bytes'] / float_row['disk_bytes']:.2f}) "
            f"| **{s['mean']:.3f}** [{low:.3f}, {high:.3f}] | {seeds} | {s['of_float']:.0%} | {difference} "
            f"| {s['examples_per_s']:,.0f} ({s['examples_per_s'] / float_row['examples_per_s']:.2f}) |")
    lines += [
        "",
        "Parameters: every stored value (integer kernels and their float32 scales for the quantized rows); nonzero: "
        "their share that is not zero, mean over seeds. Bytes on disk: the files of an Orbax checkpoint of the "
        "parameters alone (first seed; in brackets, of the float baseline's). Accuracy: on the whole validation "
        "split, mean over seeds with a 95% t-interval; vs float: the paired difference from the float baseline, "
        "with a 95% bootstrap interval over the validation examples (each example's correctness averaged over "
        "seeds). Layers of an early-exit row: the average layer its examples leave at (mean over seeds), of all; of a "
        "PoWER-BERT row: the positions its layers compute, summed over the layers, as a share of the full model's. "
        "Examples/s: the scoring forward pass over the validation split in batches of 32 (the first seed's model; "
        "an early-exit row's layer by layer, each batch until its last example has left), the median of 3 rounds "
        "that time every row once each, after one compiling pass.",
    ]
    return "\n".join(lines) + "\n"


def markdown(results: dict[str, Any]) -> str:
    """results.md: a title, the table, and what each row ran."""
    lines = [f"# Compression: {results['setting']['name']} setting", "", table(results), "| model | what ran |",
             "|---|---|"]
    lines += [f"| {row['name']} | {row['how']} |" for row in results["rows"]]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Accuracy (mean over seeds, 95% t-interval) against bytes on disk and against throughput, one marker per
    group."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    groups = list(dict.fromkeys(row["group"] for row in results["rows"]))
    colors = dict(zip(groups, plt.cm.tab10(np.arange(len(groups))), strict=True))
    markers = dict(zip(groups, "o*s^DvpX", strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(16, 7))
    for axis, key, label in ((axes[0], "disk_bytes", "bytes on disk of the parameters (KiB)"),
                             (axes[1], "examples_per_s", "scoring throughput (examples/s, this CPU)")):
        for row in results["rows"]:
            s = results["summary"][row["name"]]
            x = s[key] / 1024 if key == "disk_bytes" else s[key]
            low, high = s["ci95"]
            axis.errorbar(x, s["mean"], yerr=[[s["mean"] - low], [high - s["mean"]]], fmt=markers[row["group"]],
                          color=colors[row["group"]], capsize=3, markersize=7,
                          label=row["group"] if row is next(r for r in results["rows"] if r["group"] == row["group"])
                          else None)
            axis.annotate(row["name"], (x, s["mean"]), fontsize=6.5, xytext=(4, 3), textcoords="offset points")
        axis.set(xlabel=label, ylabel=f"{results['metric']} (mean over seeds, 95% t-interval)", xscale="log")
        axis.axhline(results["summary"][results["rows"][0]["name"]]["mean"], color="gray", linestyle="--",
                     linewidth=0.8)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Compression of the fine-tuned BERT demo ({results['setting']['num_layers']} layers) on "
                 f"{results['task']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
