"""`ptmjax eval`: a model folder's checkpoint on a seqio task's (or a mixture's) evaluation split.

The model, its mesh and its generation ids come from the folder (config.gin,
generation.json); inputs and targets are cut to the run's
`train.task_feature_lengths` (an import without them: the longest example).
Results go to MODEL_DIR/eval/<task>_step<N>.json (or --output), written
whole or not at all and never over an existing file without --overwrite, and
to TensorBoard (ptmjax/evaluation/results.py); a table is printed.
--gin_bindings bind DecodeConfig (the decode flags override them) and
anything a task needs; they are read before the folder's config.gin.

`--harness TASK[,TASK]` runs lm-evaluation-harness tasks instead (ptmjax/inference/harness.py; lm-eval's own, or
the YAML files under --include_path) on any folder `ptmjax.load` reads, a Hugging Face one included; lm-eval's
results go to MODEL_DIR/eval/harness_<tasks>[_step<N>].json as above, and lm-eval's table is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from ptmjax.decoding import DecodeConfig


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """What one `evaluate_model_dir` wrote: the JSON file, the checkpoint step and {task: {metric: value}}."""

    path: str
    step: int
    results: dict[str, dict[str, float]]


def evaluate_model_dir(
    model_dir: str, task: str, decode_config: DecodeConfig, *, split: str = "validation", step: int | None = None,
    batch_size: int = 32, max_examples: int | None = None, output: str | None = None, overwrite: bool = False,
    show_progress: bool = True,
) -> EvalReport:
    """Evaluates checkpoint `step` (default: the newest) of `model_dir` on `task` and writes the results."""
    from ptmjax.evaluation import results as results_io
    from ptmjax.storage.model_dir import ModelDir

    folder = ModelDir(model_dir)
    step = folder.checkpoint_step(step)
    path = _unwritten(output or os.path.join(folder.path, "eval", f"{task}_step{step}.json"), overwrite)
    evaluator, params = folder_evaluator(folder.path, task, decode_config, split=split, step=step,
                                         batch_size=batch_size, max_examples=max_examples, show_progress=show_progress)
    results = evaluator.evaluate(params, step)
    payload = {
        "model_dir": folder.path, "step": step, "task": task, "split": split, "max_examples": max_examples,
        "num_examples": evaluator.num_examples(), "decode_config": dataclasses.asdict(decode_config),
        "metrics": results,
    }
    results_io.write_json(path, payload, overwrite=overwrite)
    results_io.write_tensorboard(folder.path, step, results)
    return EvalReport(path, step, results)


def evaluate_harness(
    model_dir: str, tasks: list[str], *, include_path: str | None = None, step: int | None = None,
    batch_size: int = 32, max_examples: int | None = None, output: str | None = None, overwrite: bool = False,
) -> tuple[str, dict[str, Any]]:
    """(the JSON file written, lm-eval's results) of lm-evaluation-harness `tasks` on `model_dir` at checkpoint
    `step` (a run's; default: the newest), through `ptmjax.inference.harness.evaluate`."""
    from ptmjax.evaluation import results as results_io
    from ptmjax.storage.model_dir import CONFIG_FILE, ModelDir

    try:
        from ptmjax.inference import harness
    except ModuleNotFoundError as error:
        raise ValueError(str(error)) from None
    from lm_eval.utils import handle_non_serializable

    model_dir = os.path.abspath(model_dir)
    if os.path.isfile(os.path.join(model_dir, CONFIG_FILE)):  # a run or an import: its checkpoints have steps
        step = ModelDir(model_dir).checkpoint_step(step)
    name = f"harness_{'+'.join(tasks)}" + ("" if step is None else f"_step{step}")
    path = _unwritten(output or os.path.join(model_dir, "eval", f"{name}.json"), overwrite)
    results = harness.evaluate(model_dir, tasks, include_path=include_path, limit=max_examples,
                               batch_size=batch_size, step=step, log_samples=False)
    payload = {"model_dir": model_dir, "step": step, "tasks": tasks, "max_examples": max_examples,
               **json.loads(json.dumps(results, default=handle_non_serializable))}
    return results_io.write_json(path, payload, overwrite=overwrite), results


def _unwritten(path: str, overwrite: bool) -> str:
    """`path`, which must not exist unless `overwrite` (checked before a long evaluation, and again at the write)."""
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it, or --output to write elsewhere")
    return path


def folder_evaluator(
    model_dir: str, task: str, decode_config: DecodeConfig, *, split: str = "validation", step: int | None = None,
    batch_size: int = 32, max_examples: int | None = None, show_progress: bool = False,
) -> tuple[Any, Any]:
    """(the evaluator of `model_dir`'s model on `task`, checkpoint `step`'s parameters on its mesh): a
    HeadEvaluator for a task head, whose `outputs` give every example's prediction, else an InferenceEvaluator."""
    import jax

    from ptmjax import gin_files, partitioning
    from ptmjax.data import pipeline
    from ptmjax.evaluation.head_evaluator import evaluator_for
    from ptmjax.families.model_api import model_api
    from ptmjax.storage.model_dir import ModelDir

    folder = ModelDir(model_dir)
    pipeline.get_task_or_mixture(task)
    model, mesh_config = gin_files.read_model_config(folder)
    bindings = gin_files.read_train_bindings(folder)
    lengths, loss_config = bindings.get("task_feature_lengths"), bindings.get("loss_config")
    ids = gin_files.folder_generation_ids(folder)
    mesh = partitioning.make_mesh(mesh_config)
    api = model_api(model)
    evaluator = evaluator_for(
        api, task, mesh, mesh_config.rules, decode_config, ids, batch_size, split=split,
        task_feature_lengths=lengths, max_examples=max_examples, show_progress=show_progress,
        logits_chunk_size=None if loss_config is None else loss_config.logits_chunk_size,
    )
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
    return evaluator, folder.read_params(api.abstract_params, shardings, folder.checkpoint_step(step))


def main(args: argparse.Namespace) -> int:
    """`ptmjax eval` (parser in ptmjax/cli.py): evaluates, writes the results and prints a table."""
    from rich.console import Console
    from rich.table import Table

    from ptmjax.tools.decode_flags import DECODE_FLAGS, decode_config

    if args.harness is not None:
        given = [f"--{name}" for name in DECODE_FLAGS if getattr(args, name, None) is not None]
        if given or args.gin_bindings:
            raise ValueError(f"{' '.join(given) or '--gin_bindings'} decode for --task; a --harness task decodes as "
                             "its own generation_kwargs say: drop them")
        return harness_main(args)
    report = evaluate_model_dir(
        args.model_dir, args.task, decode_config(args), split=args.split, step=args.step,
        batch_size=args.batch_size, max_examples=args.max_examples, output=args.output, overwrite=args.overwrite,
    )
    table = Table("task", "metric", "value", title=f"{args.model_dir} step {report.step}, {args.split} split")
    for task, values in report.results.items():
        for name, value in values.items():
            table.add_row(task, name, f"{value:.4f}")
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for one line a row
        console = Console(width=200)
    console.print(table)
    print(f"Results: {report.path}")
    return 0


def harness_main(args: argparse.Namespace) -> int:
    """`ptmjax eval --harness`: runs lm-eval's tasks, writes the results and prints lm-eval's tables."""
    from lm_eval.utils import make_table

    tasks = [task.strip() for task in args.harness.split(",") if task.strip()]
    if not tasks:
        raise ValueError(f"--harness {args.harness!r} names no task; pass TASK[,TASK]")
    path, results = evaluate_harness(
        args.model_dir, tasks, include_path=args.include_path, step=args.step, batch_size=args.batch_size,
        max_examples=args.max_examples, output=args.output, overwrite=args.overwrite,
    )
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    print(f"Results: {path}")
    return 0
