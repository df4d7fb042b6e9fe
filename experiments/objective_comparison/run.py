"""The objective comparison: pre-train one backbone with each text-to-text objective, fine-tune each on one
downstream task, and tabulate pre-training loss, downstream accuracy and wall time.

Run: python experiments/objective_comparison/run.py [--full] [--model_gin models/t5_1_1_small.gin]

Every run goes through ptmjax's own trainer (`parse_gin` + `run.train`) with the gin files next to
this script: `pretrain.gin` for each objective's task, then `finetune.gin` on
'ptmjax_stdlib_module_classification' from `train.init_checkpoint` (or from scratch: the baseline).
The fine-tuned model is scored by rank classification (`ptmjax.evaluation.rank_classification`).
Runs go under runs/objective_comparison/<setting>[_<model>]/ (git-ignored); a run whose result.json
exists is reused, so an interrupted comparison continues where it stopped (delete the folder to start over).
The results go next to this script: results.md, results.json, objective_comparison.png (with the
suffixes '_full' for --full, '_<model>' for another --model_gin and '_lr<rate>' for another --finetune_lr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import gin
import jax
import numpy as np
import tensorflow as tf
from flax import linen as nn

from ptmjax.data import pipeline
from ptmjax.evaluation import rank_classification as evaluation
from ptmjax.families.model_api import model_api
from ptmjax.families.registry import family_of
from ptmjax.gin_files import parse_gin, read_model_config, resolve_gin_file
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import module_classification, objective_mixture, pretraining
from ptmjax.tools import results_files
from ptmjax.training.run import train

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
SCRIPT = "experiments/objective_comparison/run.py"  # how the README's table markers name this script
REPO_DIR = EXPERIMENT_DIR.parents[1]
OBJECTIVES = {  # the name in the table -> its seqio task
    "T5 span corruption": pretraining.STDLIB_TASK,
    "BART denoising": objective_mixture.BART_TASK,
    "MASS": objective_mixture.MASS_TASK,
    "prefix LM": objective_mixture.PREFIX_LM_TASK,
    "UL2 mixture of denoisers": objective_mixture.UL2_TASK,
    "PEGASUS gap sentences": objective_mixture.PEGASUS_TASK,
    "BERT-style MLM (text to text)": objective_mixture.BERT_STYLE_TASK,
}
BASELINE = "no pre-training"
DEFAULT_MODEL_GIN = "models/t5_1_1_tiny.gin"
FINETUNE_TARGETS_LENGTH = 16  # the longest module name, 'http.cookiejar', is 9 tokens and EOS
LAST_LOGS = 5  # the pre-training loss is the mean of the last 5 logged train losses (the last 50 steps)
BOOTSTRAP_SAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Setting:
    """The knobs that differ between the reduced (default) and the full comparison."""

    name: str
    pretrain_steps: int
    finetune_steps: int
    finetune_seeds: tuple[int, ...]
    finetune_learning_rate: float  # constant (Adafactor, relative to the parameter scale)
    pretrain_lengths: tuple[int, int]  # (inputs, targets), the same for every objective
    finetune_inputs_length: int


REDUCED = Setting("reduced", pretrain_steps=500, finetune_steps=200, finetune_seeds=(0, 1, 2),
                  finetune_learning_rate=1e-2, pretrain_lengths=(64, 64), finetune_inputs_length=64)
FULL = Setting("full", pretrain_steps=3000, finetune_steps=300, finetune_seeds=(0, 1, 2, 3, 4),
               finetune_learning_rate=1e-2, pretrain_lengths=(128, 128), finetune_inputs_length=128)


def slug(name: str) -> str:
    """A folder name for an objective's name."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def run_train(model_dir: pathlib.Path, gin_files: Sequence[str], bindings: Sequence[str]) -> dict[str, Any]:
    """Trains through gin into `model_dir`; returns the wall time (s) and the machine's load averages around it."""
    gin.clear_config()
    parse_gin([str(path) for path in gin_files], bindings)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    train(str(model_dir))
    wall = time.perf_counter() - start
    gin.clear_config()
    return {"wall_s": wall, "load_1min": [load_before, os.getloadavg()[0]]}


def records(model_dir: pathlib.Path) -> list[dict[str, float]]:
    """The run's metrics.jsonl records."""
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def count_tokens(dataset: tf.data.Dataset) -> dict[str, int]:
    """Real (non-padding) encoder input tokens and weighted target tokens of the dataset's batches."""
    encoder = targets = 0
    for batch in dataset.as_numpy_iterator():
        encoder += int(np.count_nonzero(batch["encoder_input_tokens"]))
        targets += int(batch["decoder_loss_weights"].sum())
    return {"encoder_tokens": encoder, "target_tokens": targets}


def cached(model_dir: pathlib.Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """model_dir/result.json, computed by `compute()` and written if absent."""
    path = model_dir / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    result = compute()
    path.write_text(json.dumps(result, indent=1))
    return result


def pretrain(setting: Setting, gin_files: list[str], runs_dir: pathlib.Path, name: str) -> dict[str, Any]:
    """Pre-trains with objective `name` (or reuses the run): timing, losses, curves and real tokens seen."""
    task = OBJECTIVES[name]
    model_dir = runs_dir / "pretrain" / slug(name)
    inputs, targets = setting.pretrain_lengths
    bindings = [
        f"train.mixture_or_task_name = '{task}'", f"train.num_steps = {setting.pretrain_steps}",
        f"train.task_feature_lengths = {{'inputs': {inputs}, 'targets': {targets}}}",
        f"train.eval_every = {setting.pretrain_steps // 5}", f"train.checkpoint_every = {setting.pretrain_steps}",
    ]

    def compute() -> dict[str, Any]:
        print(f"\n=== pre-training: {name} ({task}), {setting.pretrain_steps} steps -> {model_dir}", flush=True)
        timing = run_train(model_dir, [*gin_files, EXPERIMENT_DIR / "pretrain.gin"], bindings)
        logs = records(model_dir)
        train_logs = [r for r in logs if "loss" in r]
        eval_logs = [r for r in logs if "eval_loss" in r]
        parse_gin([str(model_dir / "config.gin")])
        model, batch_size = gin.get_bindings("train")["model"], gin.query_parameter("train.batch_size")
        seed, pack = gin.query_parameter("train.seed"), gin.query_parameter("train.pack")
        gin.clear_config()
        # The arguments of the loop's own train pipeline: this deterministic stream is the one the run read.
        dataset = pipeline.get_dataset(task, "train", {"inputs": inputs, "targets": targets}, batch_size,
                                       seed=seed, shuffle=True, pack=pack,
                                       feature_converter=family_of(model).feature_converter)
        tokens = count_tokens(dataset.take(setting.pretrain_steps))
        return {
            "task": task, "model_dir": str(model_dir), **timing,
            # The loop's step times leave out the first step, which compiles.
            "step_time_s": statistics.median(r["step_time_s"] for r in train_logs if "step_time_s" in r),
            "train_loss": statistics.fmean(r["loss"] for r in train_logs[-LAST_LOGS:]),
            "eval_loss": eval_logs[-1]["eval_loss"], "eval_accuracy": eval_logs[-1]["eval_accuracy"],
            "loss_curve": [(r["step"], r["loss"]) for r in train_logs],
            "eval_curve": [(r["step"], r["eval_loss"]) for r in eval_logs],
            **tokens, "rows": setting.pretrain_steps * batch_size,
        }

    return cached(model_dir, compute)


def restore_params(model_dir: pathlib.Path) -> tuple[nn.Module, Any]:
    """The run's model (from its config.gin) and its newest parameters, on the host."""
    folder = ModelDir(str(model_dir))
    model, _ = read_model_config(folder)
    return model, folder.read_params(model_api(model).abstract_params)


def finetune(setting: Setting, gin_files: list[str], runs_dir: pathlib.Path, name: str, seed: int,
             init_dir: str | None) -> dict[str, Any]:
    """Fine-tunes from `init_dir` (None: from scratch) with `seed` (or reuses the run); rank-classifies."""
    model_dir = runs_dir / f"finetune_lr{setting.finetune_learning_rate:g}" / slug(name) / f"seed{seed}"
    lengths = {"inputs": setting.finetune_inputs_length, "targets": FINETUNE_TARGETS_LENGTH}
    bindings = [
        f"train.num_steps = {setting.finetune_steps}", f"train.seed = {seed}",
        f"rsqrt_with_warmup.peak_learning_rate = {setting.finetune_learning_rate!r}",
        f"train.task_feature_lengths = {lengths!r}",
        f"train.eval_every = {setting.finetune_steps // 3}", f"train.checkpoint_every = {setting.finetune_steps}",
        f"train.init_checkpoint = {init_dir!r}",
    ]

    def compute() -> dict[str, Any]:
        print(f"\n=== fine-tuning: {name}, seed {seed} -> {model_dir}", flush=True)
        timing = run_train(model_dir, [*gin_files, EXPERIMENT_DIR / "finetune.gin"], bindings)
        eval_logs = [r for r in records(model_dir) if "eval_loss" in r]
        model, params = restore_params(model_dir)
        ranked = evaluation.rank_classification(
            model, params, module_classification.MODULE_TASK, "validation", module_classification.module_labels(),
            lengths,
        )
        return {**timing, "eval_loss": eval_logs[-1]["eval_loss"], "accuracy": ranked.accuracy,
                "eval_curve": [(r["step"], r["eval_loss"]) for r in eval_logs],
                "labels": ranked.labels.tolist(), "predictions": ranked.predictions.tolist()}

    return cached(model_dir, compute)


def difference_interval(correct: np.ndarray, baseline: np.ndarray) -> list[float]:
    """95% paired-bootstrap interval of mean(correct - baseline) over validation examples.

    correct, baseline: [seeds, examples] 0/1; each example's correctness is first averaged over seeds.
    """
    difference = correct.mean(axis=0) - baseline.mean(axis=0)
    rng = np.random.default_rng(0)
    resampled = difference[rng.integers(0, difference.size, (BOOTSTRAP_SAMPLES, difference.size))].mean(axis=1)
    return [float(x) for x in np.percentile(resampled, [2.5, 97.5])]


def correctness(runs: list[dict[str, Any]]) -> np.ndarray:
    """[seeds, examples] 0/1: whether each fine-tuned run classified each validation example right."""
    return np.array([np.equal(r["labels"], r["predictions"]) for r in runs], np.float64)


def summarise(setting: Setting, model_gin: str, pretrained: dict, finetuned: dict) -> dict[str, Any]:
    """results.json: the setting, the budget's definition, the machine and one row per objective."""
    baseline = correctness(finetuned[BASELINE])
    baseline_accuracy = statistics.fmean(r["accuracy"] for r in finetuned[BASELINE])
    rows = []
    for name in [*OBJECTIVES, BASELINE]:
        runs = finetuned[name]
        accuracies = [r["accuracy"] for r in runs]
        row = {"objective": name, "pretrain": pretrained.get(name),
               "finetune_runs": runs, "accuracy_mean": statistics.fmean(accuracies),
               "accuracy_vs_baseline": statistics.fmean(accuracies) - baseline_accuracy,
               "accuracy_vs_baseline_95": difference_interval(correctness(runs), baseline),
               "downstream_eval_loss_mean": statistics.fmean(r["eval_loss"] for r in runs),
               "finetune_wall_s_median": statistics.median(r["wall_s"] for r in runs)}
        rows.append(row)
    every_run = [*pretrained.values(), *(r for runs in finetuned.values() for r in runs)]
    loads = [x for r in every_run for x in r["load_1min"]]
    inputs, targets = setting.pretrain_lengths
    return {
        "setting": dataclasses.asdict(setting), "model_gin": model_gin,
        "budget": (f"every objective: {setting.pretrain_steps} steps of batch 32 packed rows, inputs {inputs} and "
                   f"targets {targets} tokens per row (the same model FLOPs per step); real tokens reported"),
        "downstream": {
            "task": module_classification.MODULE_TASK,
            "classes": list(module_classification.module_labels()),
            "train_examples": len(module_classification.module_classification_examples("train")),
            "validation_examples": len(module_classification.module_classification_examples("validation")),
        },
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__,
                    "devices": [str(d) for d in jax.devices()],
                    "load_1min_min_median_max": [min(loads), statistics.median(loads), max(loads)],
                    "total_train_wall_s": sum(r["wall_s"] for r in every_run)},
        "rows": rows,
    }


def markdown(results: dict[str, Any]) -> str:
    """results.md: the setting, then one table row per objective."""
    setting, downstream, machine = results["setting"], results["downstream"], results["machine"]
    lines = [
        f"# Objective comparison: {setting['name']} setting\n",
        f"- Backbone: `{results['model_gin']}`, the same for every objective.",
        f"- Pre-training budget: {results['budget']}.",
        f"- Downstream: `{downstream['task']}`, {len(downstream['classes'])} classes (chance "
        f"{1 / len(downstream['classes']):.3f}), {downstream['train_examples']} train / "
        f"{downstream['validation_examples']} validation examples; {setting['finetune_steps']} fine-tuning steps "
        f"(`finetune.gin`) at a constant learning rate of {setting['finetune_learning_rate']:g}, seeds "
        f"{list(setting['finetune_seeds'])}; accuracy by rank classification.",
        f"- Machine: {machine['cpus']} CPU cores shared with other jobs (1-minute load average min / median / max "
        f"over the runs: {' / '.join(f'{x:.1f}' for x in machine['load_1min_min_median_max'])}), JAX "
        f"{machine['jax']}; the training runs took {machine['total_train_wall_s'] / 60:.0f} minutes in all.\n",
        "| objective | pre-train loss (train / val) | real tokens seen (inputs / targets) | pre-train wall (s/step) "
        "| downstream accuracy: mean (seeds) | vs no pre-training [95% CI] | downstream val loss | fine-tune wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        p = row["pretrain"]
        accuracies = ", ".join(f"{r['accuracy']:.3f}" for r in row["finetune_runs"])
        pretrain_cells = (
            f"{p['train_loss']:.3f} / {p['eval_loss']:.3f} | {p['encoder_tokens'] / 1e6:.3f}M / "
            f"{p['target_tokens'] / 1e6:.3f}M | {p['wall_s']:.0f} s ({p['step_time_s']:.3f})"
            if p else "- | - | -"
        )
        low, high = row["accuracy_vs_baseline_95"]
        difference = f"{row['accuracy_vs_baseline']:+.3f} [{low:+.3f}, {high:+.3f}]" if p else "-"
        lines.append(
            f"| {row['objective']} | {pretrain_cells} | **{row['accuracy_mean']:.3f}** ({accuracies}) | {difference} "
            f"| {row['downstream_eval_loss_mean']:.3f} | {row['finetune_wall_s_median']:.0f} s |"
        )
    lines += [
        "",
        "Pre-train loss: cross-entropy per target token, the mean of the last 5 logged train losses (last 50 steps) "
        "and the whole validation split of the objective's task at the end; objectives predict different targets, "
        "so these are not comparable across rows. Real tokens: non-padding encoder inputs and loss-weighted "
        "targets over all pre-training batches. Wall: the whole `train` call (compilation and evaluations "
        "included); s/step: the median logged step time. vs no pre-training: the difference in mean accuracy, "
        "with a 95% paired bootstrap interval over the validation examples (each example's correctness averaged "
        "over seeds; it covers the choice of examples, not pre-training seeds). Downstream val loss: per target "
        "token (label and EOS), mean over seeds; fine-tune wall: the median over seeds.",
    ]
    return "\n".join(lines) + "\n"


def learning_rates(results: dict[str, Any], other: dict[str, Any]) -> str:
    """Each objective's accuracy and loss at two fine-tuning learning rates (the same pre-trained models)."""
    rates = [f"{r['setting']['finetune_learning_rate']:g}" for r in (results, other)]
    lines = ["| objective | " + " | ".join(f"accuracy at {rate} | vs no pre-training [95% CI]" for rate in rates)
             + f" | val loss {' / '.join(rates)} |", "|---|---|---|---|---|---|"]
    for row, other_row in zip(results["rows"], other["rows"], strict=True):
        cells = []
        for r in (row, other_row):
            low, high = r["accuracy_vs_baseline_95"]
            difference = f"{r['accuracy_vs_baseline']:+.3f} [{low:+.3f}, {high:+.3f}]" if r["pretrain"] else "-"
            cells += [f"{r['accuracy_mean']:.3f}", difference]
        losses = " / ".join(f"{r['downstream_eval_loss_mean']:.3f}" for r in (row, other_row))
        lines.append(f"| {row['objective']} | {' | '.join(cells)} | {losses} |")
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """The README's tables: the reduced setting's results (`reduced`, results.json, as results.md states it
    without its title) and both fine-tuning learning rates side by side (`learning_rates`, with
    results_lr0.003.json)."""
    results = json.loads((EXPERIMENT_DIR / "results.json").read_text())
    other = json.loads((EXPERIMENT_DIR / "results_lr0.003.json").read_text())
    return {"reduced": markdown(results).split("\n", 2)[2], "learning_rates": learning_rates(results, other)}


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Pre-training loss curves, and downstream accuracy and validation loss per objective."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (curves, accuracy, loss) = plt.subplots(1, 3, figsize=(17, 5.5), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    rows = results["rows"]
    colors = plt.cm.tab10(np.arange(len(rows)))
    for row, color in zip(rows, colors, strict=True):
        if row["pretrain"]:
            steps, values = zip(*row["pretrain"]["loss_curve"], strict=True)
            curves.plot(steps, values, color=color, label=row["objective"])
    curves.set(xlabel="pre-training step", ylabel="train loss per target token (objectives differ)",
               title="pre-training loss", yscale="log")
    curves.legend(fontsize=8)
    names = [row["objective"] for row in rows]
    positions = np.arange(len(rows))
    for axis, key, mean_key, label in (
        (accuracy, "accuracy", "accuracy_mean", "rank-classification accuracy"),
        (loss, "eval_loss", "downstream_eval_loss_mean", "validation loss per token"),
    ):
        axis.barh(positions, [row[mean_key] for row in rows], color=colors, alpha=0.6)
        for i, row in enumerate(rows):
            axis.plot([r[key] for r in row["finetune_runs"]], [i] * len(row["finetune_runs"]), "k.", markersize=6)
        axis.set_yticks(positions, names if axis is accuracy else [], fontsize=8)
        axis.invert_yaxis()
        axis.set(xlabel=f"{label} (bar: mean; dots: seeds)")
    accuracy.set_xlim(0, 1)
    accuracy.axvline(1 / len(results["downstream"]["classes"]), color="gray", linestyle="--", label="chance")
    accuracy.legend(fontsize=8)
    accuracy.set_title(f"downstream: {results['downstream']['task']}")
    loss.set_title("downstream validation loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the full setting (more steps, longer sequences)")
    parser.add_argument("--model_gin", default=DEFAULT_MODEL_GIN,
                        help="the backbone's gin file (another one gets its own runs folder and results suffix)")
    parser.add_argument("--finetune_lr", type=float, default=None,
                        help="another fine-tuning learning rate (a sensitivity check; results get an _lr suffix)")
    parser.add_argument("--runs_dir", default=None, help="default: runs/objective_comparison/<setting>[_<model>]")
    args = parser.parse_args(argv)
    setting = FULL if args.full else REDUCED
    model_tag = "" if args.model_gin == DEFAULT_MODEL_GIN else f"_{pathlib.Path(args.model_gin).stem}"
    suffix = ("" if setting is REDUCED else f"_{setting.name}") + model_tag
    runs_name = setting.name + model_tag
    if args.finetune_lr is not None and args.finetune_lr != setting.finetune_learning_rate:
        setting = dataclasses.replace(setting, finetune_learning_rate=args.finetune_lr)
        suffix += f"_lr{args.finetune_lr:g}"
    runs_dir = pathlib.Path(args.runs_dir or REPO_DIR / "runs" / "objective_comparison" / runs_name).resolve()
    gin_files = [str(pathlib.Path(resolve_gin_file(args.model_gin)).resolve())]

    pretrained = {name: pretrain(setting, gin_files, runs_dir, name) for name in OBJECTIVES}
    finetuned = {
        name: [finetune(setting, gin_files, runs_dir, name, seed, pretrained[name]["model_dir"] if name in pretrained
                        else None) for seed in setting.finetune_seeds]
        for name in [*OBJECTIVES, BASELINE]
    }

    results = {"measured": results_files.run_record(), **summarise(setting, args.model_gin, pretrained, finetuned)}
    text = markdown(results)
    results_files.publish(EXPERIMENT_DIR, suffix, results, text, plot, "objective_comparison",
                          (SCRIPT, tables) if suffix in ("", "_lr0.003") else None)  # what the README states
    print(text)


if __name__ == "__main__":
    main()
