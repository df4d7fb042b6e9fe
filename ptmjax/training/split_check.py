"""Before the first step: every split a run reads exists and yields an example once tokenised."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import seqio

from ptmjax.data import pipeline

RUN_SPLITS = {
    "train": "trains on",
    "validation": "evaluates on every train.eval_every steps and at the end",
}


def check_run_splits(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int]) -> None:
    """Raises a ValueError naming the split and the fix when one of RUN_SPLITS is missing or yields nothing.

    Each split, in order, is checked on its first raw example (a mixture's: of any of its tasks with
    that split), then on its first preprocessed example at the run's feature lengths: text that
    tokenises to nothing (zero-width characters) yields none. Both read the whole split, not this
    host's shard (evaluation pads a host whose shard ran out).
    """
    provider = pipeline.get_task_or_mixture(mixture_or_task_name)
    for split, use in RUN_SPLITS.items():
        if split not in provider.splits:
            raise ValueError(
                f"{mixture_or_task_name!r} has no {split!r} split, which the run {use}; register it with one "
                f"(e.g. register_text_files_task.{split}_pattern); its splits: {', '.join(provider.splits)}"
            )
        tasks = _tasks_with(provider, split)
        if not any(_yields_an_example(task.source.get_dataset(split=split, shuffle=False)) for task in tasks):
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples, and the run {use}; "
                "add data to it (are its files empty?)"
            )
        lengths = dict(task_feature_lengths)
        if not any(_yields_an_example(task.get_dataset(lengths, split=split, shuffle=False, num_epochs=1))
                   for task in tasks):
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples once tokenised and "
                f"preprocessed (its text is all characters the vocabulary drops, such as zero-width spaces, or "
                f"too short for the objective), and the run {use}; add text to it"
            )


def _tasks_with(provider: seqio.Task | seqio.Mixture, split: str) -> list[seqio.Task]:
    """The tasks whose examples `provider` draws for `split`: itself, or a mixture's tasks that have the split."""
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    return [task for task in tasks if split in task.splits]


def _yields_an_example(dataset: Any) -> bool:
    """Whether the tf.data `dataset` yields anything."""
    return next(iter(dataset.take(1)), None) is not None
