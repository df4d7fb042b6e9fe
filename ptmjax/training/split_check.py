"""Before the first step: every split a run reads exists and yields an example once tokenised."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import seqio

from ptmjax.data import pipeline

SAMPLED = 16  # tokenised examples of each split the check reads
UNKNOWN_SHARE = 0.25  # of their ids: this share of unknown ids or more is a warning

RUN_SPLITS = {
    "train": "trains on",
    "validation": "evaluates on every train.eval_every steps and at the end",
}


def check_run_splits(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int]) -> None:
    """Raises a ValueError naming the split and the fix when one of RUN_SPLITS is missing or yields nothing.

    Each split, in order, is checked on its first raw example (a mixture's: of any of its tasks with
    that split), then on its first preprocessed examples at the run's feature lengths: text that
    tokenises to nothing (zero-width characters) yields none, and text mostly of unknown ids (a
    script the vocabulary lacks) is a warning. Both read the whole split, not this host's shard
    (evaluation pads a host whose shard ran out).
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
        if not _tokenised_examples_of_one(tasks, split, task_feature_lengths):
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples once tokenised and "
                f"preprocessed (its text is all characters the vocabulary drops, such as zero-width spaces, or "
                f"too short for the objective), and the run {use}; add text to it"
            )


def _tasks_with(provider: seqio.Task | seqio.Mixture, split: str) -> list[seqio.Task]:
    """The tasks whose examples `provider` draws for `split`: itself, or a mixture's tasks that have the split."""
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    return [task for task in tasks if split in task.splits]


def _tokenised_examples_of_one(tasks: list[seqio.Task], split: str, lengths: Mapping[str, int]) -> bool:
    """Whether one of `tasks` yields a preprocessed example of `split`; reads them in order until one does
    (each read traces its preprocessors: about a second), warning for those whose ids are mostly unknown."""
    for task in tasks:
        examples = _first(task.get_dataset(dict(lengths), split=split, shuffle=False, num_epochs=1), SAMPLED)
        _warn_if_mostly_unknown(task, split, examples)
        if examples:
            return True
    return False


def _yields_an_example(dataset: Any) -> bool:
    """Whether the tf.data `dataset` yields anything."""
    return bool(_first(dataset, 1))


def _first(dataset: Any, count: int) -> list[dict[str, Any]]:
    """The first `count` examples of a tf.data `dataset` (fewer if it has fewer), as numpy."""
    return list(dataset.take(count).as_numpy_iterator())


def _warn_if_mostly_unknown(task: seqio.Task, split: str, examples: list[dict[str, Any]]) -> None:
    """Warns when the vocabulary's unknown id is at least UNKNOWN_SHARE of the first examples' ids: text in
    a script the vocabulary lacks (CJK under an English SentencePiece model) trains on nothing."""
    unknown_ids = {name: getattr(feature.vocabulary, "unk_id", None) for name, feature in task.output_features.items()}
    rows = [(np.asarray(example[name]), unknown) for example in examples for name, unknown in unknown_ids.items()
            if unknown is not None and name in example]
    ids = np.concatenate([row[row > 0] == unknown for row, unknown in rows]) if rows else np.zeros(0)  # 0: padding
    if ids.size and ids.mean() >= UNKNOWN_SHARE:
        warnings.warn(
            f"{ids.mean():.0%} of the ids of the first {len(examples)} {split!r} examples of {task.name!r} are "
            "its vocabulary's unknown id: the text is mostly characters the vocabulary lacks (say CJK under an "
            "English SentencePiece model); use a vocabulary trained on such text", stacklevel=3,
        )
