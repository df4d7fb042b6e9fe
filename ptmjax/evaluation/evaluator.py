"""Metrics of a model on a seqio task's (or every task of a mixture's) evaluation split, via seqio's `Evaluator`.

seqio caches each task's examples once (feature-converted by the model
family's converter, unpacked) and calls, per task, the model functions its
metrics need: `predict_fn` only for tasks with predict metric_fns (the model
decodes with a `DecodeConfig`: ModelApi.predict on the mesh), `score_fn` only
for tasks with score_metric_fns (ModelApi.score: each example's
log-likelihood of its targets). Both run in fixed-size batches (see
batching.py); seqio decodes, postprocesses and applies the metric functions.
One `InferenceEvaluator` serves any number of evaluations (e.g. one per
checkpoint in training): the data and the jitted functions are kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import seqio
import tensorflow as tf
from jax.sharding import Mesh
from tqdm.auto import tqdm

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.decoding.sharded import jit_predict
from ptmjax.evaluation import batching
from ptmjax.families.model_api import ModelApi

TaskMetrics = dict[str, dict[str, float]]
SAMPLE_SEED = 0  # method='sample' draws from fold_in(key(SAMPLE_SEED), batch number): evaluations repeat


class InferenceEvaluator:
    """Evaluates parameters of `api`'s model on the tasks of `mixture_or_task_name` (see the module doc).

    Args:
      api: the model.
      mixture_or_task_name: a registered seqio task or mixture; its tasks without `split` or without
        metric functions are left out.
      mesh, rules: where the parameters and batch rows go (the training layout).
      decode_config, ids: how predictions are decoded; a metric sees each example's first (best) decode.
      batch_size: rows per model call; must split over the mesh's data axes.
      split: the split evaluated.
      task_feature_lengths: inputs and targets are cut to these lengths (None: the longest example's).
      max_examples: evaluate only the first this many examples of each task (None: all).
      show_progress: a progress bar per task and model function, in examples/s.
      logits_chunk_size: score the targets' logits this many positions at a time (the training run's
        `LossConfig.logits_chunk_size`), so a large vocabulary's logits never exist for a whole batch.
    """

    def __init__(
        self, api: ModelApi, mixture_or_task_name: str, mesh: Mesh, rules: partitioning.Rules,
        decode_config: DecodeConfig, ids: GenerationIds, batch_size: int, split: str = "validation",
        task_feature_lengths: Mapping[str, int] | None = None, max_examples: int | None = None,
        show_progress: bool = False, logits_chunk_size: int | None = None,
    ):
        provider = pipeline.get_task_or_mixture(mixture_or_task_name)
        if split not in provider.splits:
            known = ", ".join(provider.splits)
            raise ValueError(f"unknown split {split!r} of {mixture_or_task_name!r}; known: {known}")
        batching.check_arguments(mesh, batch_size, max_examples)
        self._seqio = seqio.Evaluator(
            mixture_or_task_name, api.family.feature_converter(pack=False), eval_split=split,
            sequence_length=None if task_feature_lengths is None else dict(task_feature_lengths),
            num_examples=max_examples, async_compute_metrics=False,
        )
        if not self._seqio.eval_tasks:
            raise ValueError(
                f"no task of {mixture_or_task_name!r} has a {split!r} split and metric functions; "
                "evaluate a task registered with metric_fns"
            )
        self._task_of = {id(ds): name for name, ds in self._seqio.cached_model_datasets.items()}
        self.batch_size, self.show_progress = batch_size, show_progress
        self._sample = decode_config.method == "sample"
        with jax.set_mesh(mesh):
            self._param_shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, rules)
        self._rows = partitioning.batch_sharding(mesh)
        self._predict = jit_predict(api.predict, api.boxed_abstract_params, mesh, rules, decode_config, ids)
        score = functools.partial(api.score, logits_chunk_size=logits_chunk_size)
        self._score = batching.jit_on_rows(score, self._param_shardings, self._rows, rules)

    @property
    def task_names(self) -> list[str]:
        """The tasks evaluated, in the mixture's order."""
        return [task.name for task in self._seqio.eval_tasks]

    def num_examples(self) -> dict[str, int]:
        """{task: examples evaluated}."""
        return {name: int(ds.cardinality()) for name, ds in self._seqio.cached_task_datasets.items()}

    def evaluate(self, params: Any, step: int | None = None) -> TaskMetrics:
        """{task: {metric: value}} of `params` (laid out anyhow; moved to the mesh once).

        A metric value seqio gives as a `seqio.metrics.Scalar` is unwrapped; non-scalar ones (text,
        images, histograms) are left out.
        """
        params = jax.device_put(params, self._param_shardings)
        future, _ = self._seqio.evaluate(
            compute_metrics=True, step=step, predict_fn=functools.partial(self._predict_fn, params),
            score_fn=functools.partial(self._score_fn, params),
        )
        return {task: scalars(metrics) for task, metrics in future.result().items()}

    def _predict_fn(self, params: Any, dataset: tf.data.Dataset) -> list[tuple[int, list[int]]]:
        """(index, the first decode's tokens) per example."""
        key = jax.random.key(SAMPLE_SEED)

        def predict(number: int, batch: dict[str, jax.Array]) -> np.ndarray:
            rng = jax.random.fold_in(key, number) if self._sample else None
            return batching.to_host(self._predict(params, batch, rng).tokens[:, 0])

        return [(i, row.tolist()) for i, row in self._run(dataset, "predict", predict)]

    def _score_fn(self, params: Any, dataset: tf.data.Dataset) -> list[tuple[int, float]]:
        """(index, log-likelihood of the targets) per example."""
        scored = self._run(dataset, "score", lambda number, batch: batching.to_host(self._score(params, batch)))
        return [(i, float(score)) for i, score in scored]

    def _run(
        self, dataset: tf.data.Dataset, what: str, model_fn: Callable[[int, dict[str, jax.Array]], np.ndarray]
    ) -> list[tuple[int, np.ndarray]]:
        """(seqio index, model_fn's row) of every example; model_fn(batch number, batch on the mesh)."""
        total = int(dataset.cardinality())
        outputs = []
        with tqdm(
            total=total if total >= 0 else None, desc=f"{self._task_of.get(id(dataset), 'eval')} {what}", unit="ex",
            disable=not self.show_progress, dynamic_ncols=True, leave=False,
        ) as bar:
            for number, batch in enumerate(batching.padded_batches(dataset, self.batch_size)):
                rows = model_fn(number, batching.on_mesh(batch.features, self._rows))
                outputs.extend(zip(batch.indices.tolist(), rows[: batch.count], strict=True))
                bar.update(batch.count)
        return outputs


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """seqio's metric values as floats; non-scalar MetricValues are dropped."""
    values = {}
    for name, value in metrics.items():
        if isinstance(value, seqio.metrics.Scalar):
            value = value.value
        if not isinstance(value, seqio.metrics.MetricValue):
            values[name] = float(value)
    return values

