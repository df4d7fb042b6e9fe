"""The PEFT comparison: from one pre-trained backbone, fine-tune each embedded head task with every adaptation
method, and tabulate score against trainable parameters, peak memory and wall time.

Run: python experiments/peft_comparison/run.py [--setting reduced|full|smoke]

The backbone is the BERT demo model (`runs/bert_demo.gin`, pre-trained here on the embedded corpus). Each
task is a head run file (`runs/bert_classify_demo.gin`, `runs/bert_tagging_demo.gin`, `runs/bert_qa_demo.gin`)
started from it with `train.init_checkpoint`; a method is a few gin bindings on top (which parameters train,
and the PEFT wrapper). Each method runs at its own peak learning rate times each of the setting's
`lr_factors` (1 and 4), and the run with the best validation score is reported (all are in the JSON). Every
run is its own `ptmjax train` process, so its peak resident memory (from `os.wait4`) and wall time are its
own. Runs go under runs/peft_comparison/<setting>/<task>/<method>/lr_<lr>/ (git-ignored); a run with a
result.json is reused, so an interrupted comparison continues. Outputs next to this script:
results_<setting>.md, results_<setting>.json and peft_comparison_<setting>.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any

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
    lr_factors: tuple[float, ...] = (1, 4)  # each method runs at its learning rate times each; the best is reported


SETTINGS = {
    "reduced": Setting("reduced", 600, 300, 128, ("module classification", "code tagging"), None),
    "full": Setting("full", 3000, 1000, 128, tuple(TASKS), None),
    "smoke": Setting("smoke", 4, 10, 32, tuple(TASKS), 8, (1,)),  # the harness end to end in minutes (a test)
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
            method: best_of(setting, runs / slug(task_name) / slug(method), backbone, task, learning_rate, bindings)
            for method, (learning_rate, bindings) in methods(task, setting.inputs_length).items()
        }
    return results


def best_of(setting: Setting, method_dir: pathlib.Path, backbone: pathlib.Path, task: Task, learning_rate: float,
            bindings: list[str]) -> dict[str, Any]:
    """The run of the best validation score among `learning_rate` times each of the setting's factors, with the
    score of each."""
    runs = [finetune(setting, method_dir / f"lr_{factor * learning_rate:g}", backbone, task, factor * learning_rate,
                     bindings) for factor in setting.lr_factors]
    best = max(runs, key=lambda run: run["score"])
    return {**best, "runs": {f"{run['learning_rate']:g}": run["score"] for run in runs}}


def finetune(setting: Setting, model_dir: pathlib.Path, backbone: pathlib.Path, task: Task, learning_rate: float,
             bindings: list[str]) -> dict[str, Any]:
    """One method on one task from the backbone (or the run's result.json)."""
    common = [
        f"train.init_checkpoint = '{backbone}'", f"train.num_steps = {setting.finetune_steps}",
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
        return {**timing, "score": last_eval(model_dir, task.metric), "trainable": trainable, "total": total,
                "learning_rate": learning_rate}

    return cached(model_dir, compute)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_").replace("__", "_")


def table(setting: Setting, results: dict[str, Any]) -> str:
    lines = [f"Setting '{setting.name}': BERT demo backbone pre-trained {setting.pretrain_steps} steps "
             f"({results['pretrain']['wall_s']:.0f} s), fine-tuned {setting.finetune_steps} steps per method, inputs "
             f"{setting.inputs_length} tokens; machine: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPUs.", ""]
    for task_name, rows in results["tasks"].items():
        metric = TASKS[task_name].metric.split("/")[1]
        lines += [f"### {task_name} ({metric})", "",
                  "| method | score | trainable parameters | % of all | peak RSS (MiB) | wall time (s) | load | lr | "
                  "score at each lr |", "|---|---|---|---|---|---|---|---|---|"]
        for method, row in rows.items():
            tried = ", ".join(f"{score:.1f} at {lr}" for lr, score in row["runs"].items())
            lines.append(f"| {method} | {row['score']:.1f} | {row['trainable']:,} | "
                         f"{100 * row['trainable'] / row['total']:.2f} | {row['peak_rss_mib']:.0f} | "
                         f"{row['wall_s']:.0f} | {max(row['load_1min']):.1f} | {row['learning_rate']:g} | "
                         f"{tried} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False)
    for ax, (task_name, rows) in zip(axes[0], tasks.items(), strict=True):
        for method, row in rows.items():
            ax.scatter(row["trainable"], row["score"], s=40)
            ax.annotate(method, (row["trainable"], row["score"]), fontsize=7, xytext=(4, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("trainable parameters")
        ax.set_ylabel(TASKS[task_name].metric.split("/")[1])
        ax.set_title(task_name)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="reduced")
    setting = SETTINGS[parser.parse_args().setting]
    results = compare(setting)
    (EXPERIMENT_DIR / f"results_{setting.name}.json").write_text(json.dumps(results, indent=1))
    (EXPERIMENT_DIR / f"results_{setting.name}.md").write_text(table(setting, results))
    plot(results, EXPERIMENT_DIR / f"peft_comparison_{setting.name}.png")
    print(table(setting, results))


if __name__ == "__main__":
    main()
