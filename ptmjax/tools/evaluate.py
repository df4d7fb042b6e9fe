"""`ptmjax eval`: a model folder's checkpoint on a seqio task's (or a mixture's) evaluation split.

The model, its mesh and its generation ids come from the folder (config.gin,
generation.json); inputs and targets are cut to the run's
`train.task_feature_lengths` (an import without them: the longest example).
Results go to MODEL_DIR/eval/<task>_step<N>.json (or --output), written
whole or not at all and never over an existing file without --overwrite, and
to TensorBoard (ptmjax/evaluation/results.py); a table is printed.
--gin_bindings bind DecodeConfig (the decode flags override them) and
anything a task needs; they are read before the folder's config.gin.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    path = output or os.path.join(folder.path, "eval", f"{task}_step{step}.json")
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it, or --output to write elsewhere")
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

    from ptmjax.tools.decode_flags import decode_config

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

