"""Before the first step: every split a run reads exists and yields an example."""

from __future__ import annotations

from collections.abc import Mapping

import seqio

from ptmjax.data import pipeline

RUN_SPLITS = {
    "train": "trains on",
    "validation": "evaluates on every train.eval_every steps and at the end",
}


def check_run_splits(
    mixture_or_task_name: str,
    task_feature_lengths: Mapping[str, int],
    feature_converter: type[seqio.FeatureConverter],
    pack: bool,
) -> None:
    """Raises a ValueError naming the split and the fix when one of RUN_SPLITS is missing or yields nothing."""
    provider = pipeline.get_task_or_mixture(mixture_or_task_name)
    for split, use in RUN_SPLITS.items():
        if split not in provider.splits:
            raise ValueError(
                f"{mixture_or_task_name!r} has no {split!r} split, which the run {use}; register it with one "
                f"(e.g. register_text_files_task.{split}_pattern); its splits: {', '.join(provider.splits)}"
            )
        dataset = pipeline.get_dataset(
            mixture_or_task_name, split, task_feature_lengths, 1, seed=0, shuffle=False, pack=pack, num_epochs=1,
            feature_converter=feature_converter,
        )  # fmt: skip
        if next(dataset.as_numpy_iterator(), None) is None:
            raise ValueError(
                f"the {split!r} split of {mixture_or_task_name!r} yields no examples, and the run {use}; "
                "add data to it (are its files empty?)"
            )
