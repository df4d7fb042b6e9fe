"""Before the first step: every split a run reads exists and yields an example."""

from __future__ import annotations

import seqio

from ptmjax.data import pipeline

RUN_SPLITS = {
    "train": "trains on",
    "validation": "evaluates on every train.eval_every steps and at the end",
}


def check_run_splits(mixture_or_task_name: str) -> None:
    """Raises a ValueError naming the split and the fix when one of RUN_SPLITS is missing or yields nothing.

    Each split, in order, is checked on the first raw example of its source (a mixture's: of any
    of its tasks with that split), over the whole split (not this host's shard: evaluation pads a
    host whose shard ran out). No preprocessor runs, so the check traces none of their map
    functions: the run's pipelines trace them once, when they are built (the train pipeline
    before the first step, the validation pipeline at the first evaluation).
    """
    provider = pipeline.get_task_or_mixture(mixture_or_task_name)
    for split, use in RUN_SPLITS.items():
        if split not in provider.splits:
            raise ValueError(
                f"{mixture_or_task_name!r} has no {split!r} split, which the run {use}; register it with one "
                f"(e.g. register_text_files_task.{split}_pattern); its splits: {', '.join(provider.splits)}"
            )
        if not any(_yields_an_example(task, split) for task in _tasks_with(provider, split)):
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples, and the run {use}; "
                "add data to it (are its files empty?)"
            )


def _tasks_with(provider: seqio.Task | seqio.Mixture, split: str) -> list[seqio.Task]:
    """The tasks whose examples `provider` draws for `split`: itself, or a mixture's tasks that have the split."""
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    return [task for task in tasks if split in task.splits]


def _yields_an_example(task: seqio.Task, split: str) -> bool:
    return next(iter(task.source.get_dataset(split=split, shuffle=False).take(1)), None) is not None
