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

    Returns the validation dataset that `make_validation` builds (the run's
    evaluation batches: unshuffled, so every iteration reads the same
    batches), checked on its first batch, for the run to evaluate on: built
    once. The train split is checked on the task's own examples, before the
    feature converter, packing and batching, which the run's train dataset (a
    seeded shuffle that must start with its first iteration) adds itself.
    """
    provider = pipeline.get_task_or_mixture(mixture_or_task_name)
    datasets = {
        "train": lambda: provider.get_dataset(dict(task_feature_lengths), split="train", shuffle=False, num_epochs=1,
                                              seed=0),
        "validation": make_validation,
    }  # fmt: skip
    for split, use in RUN_SPLITS.items():  # in order: a train split's problem is named first
        if split not in provider.splits:
            raise ValueError(
                f"{mixture_or_task_name!r} has no {split!r} split, which the run {use}; register it with one "
                f"(e.g. register_text_files_task.{split}_pattern); its splits: {', '.join(provider.splits)}"
            )
        dataset = datasets[split]()
        if next(iter(dataset.take(1)), None) is None:
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples, and the run {use}; "
                "add data to it (are its files empty?)"
            )
    return dataset

