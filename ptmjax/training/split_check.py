"""Before the first step: every split a run reads exists and yields an example."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tensorflow as tf

from ptmjax.data import pipeline

RUN_SPLITS = {
    "train": "trains on",
    "validation": "evaluates on every train.eval_every steps and at the end",
}


def check_run_splits(
    mixture_or_task_name: str,
    task_feature_lengths: Mapping[str, int],
    make_validation: Callable[[], tf.data.Dataset],
) -> tf.data.Dataset:
    """Raises a ValueError naming the split and the fix when one of RUN_SPLITS is missing or yields nothing.

    Each split, in order, is checked on its first example before the feature
    converter, over the whole split (not this host's shard: evaluation pads a
    host whose shard ran out). Returns the run's validation dataset, built by
    `make_validation` (its converter's errors surface here, before anything
    is written) and not read: unshuffled, it reads the same batches at every
    evaluation, so the run builds it once. The run builds its train dataset
    itself: a seeded shuffle whose order starts with its first iteration.
    """
    provider = pipeline.get_task_or_mixture(mixture_or_task_name)
    for split, use in RUN_SPLITS.items():
        if split not in provider.splits:
            raise ValueError(
                f"{mixture_or_task_name!r} has no {split!r} split, which the run {use}; register it with one "
                f"(e.g. register_text_files_task.{split}_pattern); its splits: {', '.join(provider.splits)}"
            )
        examples = provider.get_dataset(dict(task_feature_lengths), split=split, shuffle=False, num_epochs=1, seed=0)
        if next(iter(examples.take(1)), None) is None:
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples, and the run {use}; "
                "add data to it (are its files empty?)"
            )
    return make_validation()
