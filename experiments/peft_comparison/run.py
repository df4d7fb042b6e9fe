"""The PEFT comparison: from one pre-trained backbone, fine-tune each embedded head task with every adaptation
method, and tabulate score against trainable parameters, peak memory and wall time.

Run: python experiments/peft_comparison/run.py [--setting reduced|full|smoke]

The backbone is the BERT demo model (`runs/bert_demo.gin`, pre-trained here on the embedded corpus). Each
task is a head run file (`runs/bert_classify_demo.gin`, `runs/bert_tagging_demo.gin`, `runs/bert_qa_demo.gin`)
started from it with `train.init_checkpoint`; a method is a few gin bindings on top (which parameters train,
and the PEFT wrapper). The first fine-tuning seed runs each method at its own peak learning rate times each
of the setting's `lr_factors` (1 and 4); the rate with the better score on the development half of the
validation split (its even-numbered examples) is the one the other seeds run at, and every run is scored on
the held-out half (the odd-numbered ones), which chooses nothing: the mean over seeds is reported with a 95%
bootstrap interval over the held-out examples (every run is in the JSON). Every
run is its own `ptmjax train` process, so its peak resident memory (from `os.wait4`) and wall time are its
own. Runs go under runs/peft_comparison/<setting>/<task>/<method>/lr_<lr>_seed<seed>/ (git-ignored); a run
with a result.json is reused, so an interrupted comparison continues. Outputs next to this script:
results_<setting>.md, results_<setting>.json and peft_comparison_<setting>.png; the reduced setting also
rewrites the README's summary table (`tables`, marked as ptmjax/tools/results_files.py says).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from ptmjax.tools import results_files

SCRIPT = "experiments/peft_comparison/run.py"  # how the README's table marker names this script
EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
REPO_DIR = EXPERIMENT_DIR.parents[1]
RUNS_DIR = REPO_DIR / "runs" / "peft_comparison"
HEAD = "'classifier/.*'"  # the new head of every task model below trains in every method


@dataclasses.dataclass(frozen=True)
class Task:
    run_file: str
    model: str  # the gin name of the task model, which PEFT wrappers take as their `model`
    metric: str  # '<task>/<metric>' reported
    head: str = HEAD


TASKS = {
    "module classification": Task("runs/bert_classify_demo.gin", "EncoderForSequenceClassification",
                                  "ptmjax_stdlib_module_classification_head/accuracy"),
    "code tagging": Task("runs/bert_tagging_demo.gin", "EncoderForTokenClassification",
                         "ptmjax_stdlib_code_tagging/span_f1"),
    "cloze QA": Task("runs/bert_qa_demo.gin", "EncoderForQuestionAnswering", "ptmjax_stdlib_code_qa/f1",
                     head="'qa_outputs/.*'"),
}


PROMPT_LENGTH = 20  # soft-prompt tokens: they occupy positions of the BERT demo's 128-position table


def methods(task: Task, inputs_length: int) -> dict[str, tuple[float, list[str]]]:
    """Each method's (lowest) peak learning rate and gin bindings for `task` with inputs of `inputs_length` tokens."""

    def wrapped(wrapper: str, pattern: str, *settings: str) -> list[str]:
        return [f"train.model = @{wrapper}()", f"{wrapper}.model = @{task.model}()", *settings,
                f"train.trainable = [%ptmjax.adapt.{pattern}, {task.head}]"]

    prompt_inputs = f"train.task_feature_lengths = {{'inputs': {inputs_length - PROMPT_LENGTH}}}"
    return {
        "full fine-tuning": (1e-3, []),
        "linear probe (frozen backbone)": (1e-2, [f"train.trainable = [{task.head}]"]),
        "BitFit": (1e-2, [f"train.trainable = [%ptmjax.adapt.BITFIT_PARAMS, {task.head}]"]),
        "LoRA (r=8, query and value)": (5e-3, wrapped("lora", "LORA_PARAMS", "lora.rank = 8", "lora.alpha = 16.0")),
        "adapters (Houlsby, 16)": (5e-3, wrapped("adapters", "ADAPTER_PARAMS", "adapters.placement = 'houlsby'",
                                                 "adapters.bottleneck = 16")),
        "adapters (Pfeiffer, 16)": (5e-3, wrapped("adapters", "ADAPTER_PARAMS", "adapters.placement = 'pfeiffer'",
                                                  "adapters.bottleneck = 16")),
        f"prompt tuning ({PROMPT_LENGTH})": (3e-2, [
            *wrapped("prompt_tuning", "PROMPT_PARAMS", f"prompt_tuning.length = {PROMPT_LENGTH}"), prompt_inputs]),
        f"P-tuning ({PROMPT_LENGTH}, MLP 64)": (1e-2, [
            *wrapped("p_tuning", "PROMPT_PARAMS", f"p_tuning.length = {PROMPT_LENGTH}", "p_tuning.hidden = 64"),
            prompt_inputs]),
        "prefix tuning (10, MLP 64)": (1e-2, wrapped("prefix_tuning", "PREFIX_PARAMS", "prefix_tuning.length = 10",
                                                     "prefix_tuning.hidden = 64")),
    }


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    pretrain_steps: int
    finetune_steps: int
    inputs_length: int
    tasks: tuple[str, ...]
    eval_examples: int | None  # None: the whole validation split
    lr_factors: tuple[float, ...] = (1, 4)  # the first seed runs at each method's rate times each; dev chooses
    seeds: tuple[int, ...] = (0, 1, 2)  # fine-tuning seeds (the head's initialisation, dropout, data order)
    bootstrap_samples: int = 1000  # resamples of the held-out examples for each interval


SETTINGS = {
    "reduced": Setting("reduced", 600, 300, 128, ("module classification", "code tagging"), None),
    "full": Setting("full", 3000, 1000, 128, tuple(TASKS), None, seeds=(0, 1, 2, 3, 4)),
    "smoke": Setting("smoke", 4, 10, 32, tuple(TASKS), 8, (1,), (0,), 20),  # the harness end to end (a test)
}


def train(model_dir: pathlib.Path, gin_file: str, bindings: list[str]) -> dict[str, float]:
    """`ptmjax train` in its own process: its wall time (s), peak resident memory (MiB), and the machine's
    1-minute load average before and after (a load above the core count means the time was shared)."""
    command = [sys.executable, "-m", "ptmjax.cli", "train", "--gin_file", gin_file, "--model_dir", str(model_dir)]
    for binding in [*bindings, "train.show_progress = False"]:
        command += ["--gin_bindings", binding]
    load_before, start = os.getloadavg()[0], time.perf_counter()
    with open(model_dir.parent / f"{model_dir.name}.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(command)} failed; see {model_dir.parent / f'{model_dir.name}.log'}")
    return {"wall_s": time.perf_counter() - start, "peak_rss_mib": usage.ru_maxrss / 1024,
            "load_1min": [load_before, os.getloadavg()[0]]}


def cached(model_dir: pathlib.Path, compute) -> dict[str, Any]:
    """model_dir/result.json, computed and written if absent."""
    path = model_dir / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    result = compute()
    path.write_text(json.dumps(result, indent=1))
    return result


def last_eval(model_dir: pathlib.Path, metric: str) -> float:
    """The run's last logged value of eval_<metric>."""
    with open(model_dir / "metrics.jsonl") as f:
        values = [r[f"eval_{metric}"] for r in map(json.loads, f) if f"eval_{metric}" in r]
    return values[-1]


def trainable_counts(model_dir: pathlib.Path) -> tuple[int, int]:
    """(trainable, total) parameter values of a run, from its config.gin."""
    from ptmjax import gin_files
    from ptmjax.families.model_api import model_api
    from ptmjax.storage.model_dir import ModelDir
    from ptmjax.training.trainable import Trainable

    folder = ModelDir(str(model_dir))
    model, _ = gin_files.read_model_config(folder)
    patterns = gin_files.read_train_bindings(folder).get("trainable")
    return Trainable(None if patterns is None else tuple(patterns)).counts(model_api(model).unscanned().abstract_params)


def validation_outputs(model_dir: pathlib.Path, task: Task, eval_examples: int | None) -> dict[str, list[Any]]:
    """{'targets', 'predictions'}: every evaluated validation example's, in order, from the run's final checkpoint
    (through the evaluator `ptmjax eval` uses), as JSON values."""
    from ptmjax.decoding import DecodeConfig
    from ptmjax.tools.evaluate import folder_evaluator

    task_name = task.metric.split("/")[0]
    evaluator, params = folder_evaluator(str(model_dir), task_name, DecodeConfig(), max_examples=eval_examples)
    targets, predictions = evaluator.outputs(params)[task_name]
    as_json = lambda values: [v.tolist() if hasattr(v, "tolist") else v for v in values]  # noqa: E731
    return {"targets": as_json(targets), "predictions": as_json(predictions)}


def score(task: Task, outputs: dict[str, list[Any]], indices: Any) -> float:
    """The task's metric over the examples at `indices` of `outputs`."""
    import ptmjax.configurables  # noqa: F401  (registers the built-in tasks)
    from ptmjax.data import pipeline

    metric_fns = pipeline.get_task_or_mixture(task.metric.split("/")[0]).metric_fns
    targets, predictions = ([outputs[key][i] for i in indices] for key in ("targets", "predictions"))
    values = {}
    for metric_fn in metric_fns:
        values.update(metric_fn(targets, predictions))
    return float(values[task.metric.split("/")[1]])


def halves(outputs: dict[str, list[Any]]) -> dict[str, range]:
    """The development half (even-numbered validation examples), which chooses the learning rate, and the held-out
    half (odd-numbered), which only scores."""
    count = len(outputs["targets"])
    return {"dev": range(0, count, 2), "test": range(1, count, 2)}


def compare(setting: Setting) -> dict[str, Any]:
    runs = RUNS_DIR / setting.name
    backbone = runs / "bert_demo"
    lengths = f"{{'inputs': {setting.inputs_length}, 'targets': {setting.inputs_length}}}"
    pretrain = cached(backbone, lambda: train(backbone, "runs/bert_demo.gin", [
        f"train.num_steps = {setting.pretrain_steps}", f"train.task_feature_lengths = {lengths}",
        f"warmup_cosine.total_steps = {setting.pretrain_steps}",
        f"warmup_cosine.warmup_steps = {max(1, setting.pretrain_steps // 12)}"]))
    results = {"pretrain": pretrain, "tasks": {}}
    for task_name in setting.tasks:
        task = TASKS[task_name]
        results["tasks"][task_name] = {
            method: chosen_and_seeds(setting, runs / slug(task_name) / slug(method), backbone, task, learning_rate,
                                     bindings)
            for method, (learning_rate, bindings) in methods(task, setting.inputs_length).items()
        }
    return results


def chosen_and_seeds(setting: Setting, method_dir: pathlib.Path, backbone: pathlib.Path, task: Task,
                     learning_rate: float, bindings: list[str]) -> dict[str, Any]:
    """The first seed at `learning_rate` times each of the setting's factors; the rate of the best development
    score; every other seed at that rate; the held-out score of each seed, their mean and its 95% interval."""
    run = functools.partial(finetune, setting, method_dir=method_dir, backbone=backbone, task=task,
                            bindings=bindings)
    first_seed, *other_seeds = setting.seeds
    searched = [run(learning_rate=factor * learning_rate, seed=first_seed) for factor in setting.lr_factors]
    best = max(searched, key=lambda result: result["dev"])
    seeds = [best, *(run(learning_rate=best["learning_rate"], seed=seed) for seed in other_seeds)]
    test = [result["test"] for result in seeds]
    return {
        "learning_rate": best["learning_rate"], "trainable": best["trainable"], "total": best["total"],
        "dev_at_each_lr": {f"{result['learning_rate']:g}": result["dev"] for result in searched},
        "test_at_each_lr": {f"{result['learning_rate']:g}": result["test"] for result in searched},
        "test_by_seed": dict(zip(map(str, setting.seeds), test, strict=True)),
        "test_mean": statistics.fmean(test),
        "test_ci95": bootstrap_interval(task, [result["outputs"] for result in seeds], setting.bootstrap_samples),
        "wall_s": statistics.median(result["wall_s"] for result in seeds),
        "peak_rss_mib": statistics.median(result["peak_rss_mib"] for result in seeds),
        "load_1min": max(max(result["load_1min"]) for result in seeds),
    }


def bootstrap_interval(task: Task, outputs_by_seed: list[dict[str, list[Any]]], samples: int) -> list[float]:
    """The 95% percentile interval of the mean over seeds of the held-out score, the held-out examples resampled
    with replacement (the same resample for every seed): it covers the choice of examples, and the seeds only as
    far as they are averaged."""
    import numpy as np

    test = np.asarray(halves(outputs_by_seed[0])["test"])
    rng = np.random.default_rng(0)
    means = [statistics.fmean(score(task, outputs, rng.choice(test, len(test))) for outputs in outputs_by_seed)
             for _ in range(samples)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def finetune(setting: Setting, *, method_dir: pathlib.Path, backbone: pathlib.Path, task: Task,
             learning_rate: float, seed: int, bindings: list[str]) -> dict[str, Any]:
    """One method on one task from the backbone, at one rate and seed (or the run's result.json): its scores on
    the whole validation split and on each half, and every example's output."""
    model_dir = method_dir / f"lr_{learning_rate:g}_seed{seed}"
    common = [
        f"train.init_checkpoint = '{backbone}'", f"train.num_steps = {setting.finetune_steps}", f"train.seed = {seed}",
        f"train.task_feature_lengths = {{'inputs': {setting.inputs_length}}}",
        f"slanted_triangular.total_steps = {setting.finetune_steps}",
        f"slanted_triangular.peak_learning_rate = {learning_rate}",
        f"train.eval_every = {setting.finetune_steps}", f"train.checkpoint_every = {setting.finetune_steps}",
        f"train.inference_eval_examples = {setting.eval_examples}",
    ]

    def compute() -> dict[str, Any]:
        print(f"=== {model_dir}", flush=True)
        timing = train(model_dir, task.run_file, [*common, *bindings])
        trainable, total = trainable_counts(model_dir)
        outputs = validation_outputs(model_dir, task, setting.eval_examples)
        whole = score(task, outputs, range(len(outputs["targets"])))
        if abs(whole - last_eval(model_dir, task.metric)) > 1e-6:
            raise RuntimeError(f"{model_dir}: the outputs score {whole} on the whole split, the run logged "
                               f"{last_eval(model_dir, task.metric)}")
        return {**timing, "validation": whole, **{name: score(task, outputs, indices)
                                                  for name, indices in halves(outputs).items()},
                "trainable": trainable, "total": total, "learning_rate": learning_rate, "seed": seed,
                "outputs": outputs}

    return cached(model_dir, compute)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_").replace("__", "_")


def table(setting: Setting, results: dict[str, Any]) -> str:
    lines = [f"Setting '{setting.name}': BERT demo backbone pre-trained {setting.pretrain_steps} steps "
             f"({results['pretrain']['wall_s']:.0f} s), fine-tuned {setting.finetune_steps} steps per method, inputs "
             f"{setting.inputs_length} tokens, fine-tuning seeds {list(setting.seeds)}; machine: "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs. Held-out: the odd-numbered "
             "validation examples (mean over seeds, 95% bootstrap interval over those examples); dev: the "
             "even-numbered ones, which choose the learning rate (first seed).", ""]
    for task_name, rows in results["tasks"].items():
        metric = TASKS[task_name].metric.split("/")[1]
        lines += [f"### {task_name} ({metric})", "",
                  "| method | held-out score [95% CI] | each seed | trainable parameters | % of all | lr | "
                  "dev at each lr | held-out at each lr | peak RSS (MiB) | wall time (s) | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for method, row in rows.items():
            low, high = row["test_ci95"]
            at_each = lambda scores: ", ".join(f"{value:.1f} at {lr}" for lr, value in scores.items())  # noqa: E731
            lines.append(f"| {method} | {row['test_mean']:.1f} [{low:.1f}, {high:.1f}] | "
                         f"{', '.join(f'{value:.1f}' for value in row['test_by_seed'].values())} | "
                         f"{row['trainable']:,} | {100 * row['trainable'] / row['total']:.2f} | "
                         f"{row['learning_rate']:g} | {at_each(row['dev_at_each_lr'])} | "
                         f"{at_each(row['test_at_each_lr'])} | {row['peak_rss_mib']:.0f} | {row['wall_s']:.0f} | "
                         f"{row['load_1min']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """One row per method: trainable share and each task's held-out score with its interval (the README's
    table)."""
    tasks = results["tasks"]
    metrics = [TASKS[task].metric.split("/")[1] for task in tasks]
    lines = ["| method | trainable | " + " | ".join(f"{task} ({metric})" for task, metric in zip(tasks, metrics,
                                                                                              strict=True)) + " |",
             "|---|---|" + "---|" * len(tasks)]
    first = next(iter(tasks.values()))
    for method, row in sorted(first.items(), key=lambda item: -item[1]["test_mean"]):
        cells = []
        for rows in tasks.values():
            low, high = rows[method]["test_ci95"]
            cells.append(f"{rows[method]['test_mean']:.1f} [{low:.1f}, {high:.1f}]")
        lines.append(f"| {method} | {100 * row['trainable'] / row['total']:.1f}% | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """The README's table (its `summary` marker), from results_reduced.json."""
    return {"summary": summary(json.loads((EXPERIMENT_DIR / "results_reduced.json").read_text()))}


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False)
    for ax, (task_name, rows) in zip(axes[0], tasks.items(), strict=True):
        for method, row in rows.items():
            low, high = row["test_ci95"]
            ax.errorbar(row["trainable"], row["test_mean"], yerr=[[row["test_mean"] - low], [high - row["test_mean"]]],
                        fmt="o", capsize=3, markersize=5)
            ax.annotate(method, (row["trainable"], row["test_mean"]), fontsize=7, xytext=(4, 2),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("trainable parameters")
        ax.set_ylabel(f"held-out {TASKS[task_name].metric.split('/')[1]} (mean of seeds, 95% CI)")
        ax.set_title(task_name)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="reduced")
    setting = SETTINGS[parser.parse_args().setting]
    results = {**compare(setting), "measured": results_files.run_record()}
    text = table(setting, results)
    results_files.publish(EXPERIMENT_DIR, f"_{setting.name}", results, text, plot, "peft_comparison",
                          (SCRIPT, tables) if setting.name == "reduced" else None)  # the setting the README reports
    print(text)


if __name__ == "__main__":
    main()
