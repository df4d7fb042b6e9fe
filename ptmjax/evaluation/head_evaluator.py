"""Metrics of a task-head model (classification, regression, tagging, span QA) on a seqio task's split.

Head tasks have no target text for seqio's `Evaluator` to decode, so this one
reads each task's examples itself (unshuffled, cut to the feature lengths),
runs them through the family's converter in fixed-size batches on the mesh,
and takes the head's prediction per example (`ModelApi.head_predictions`): a
class id, a value, the tag id of every position, or, for span QA, the text of
the predicted span of 'inputs'. The task's `postprocess_fn` gives each
example's target (`is_target=True`, with the example) and its prediction, and
the task's `metric_fns(targets, predictions)` the metrics. The interface is
`InferenceEvaluator`'s, so training (`train.inference_eval_tasks`) and
`ptmjax eval` use either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import seqio
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.evaluation import batching
from ptmjax.evaluation.evaluator import InferenceEvaluator, TaskMetrics, scalars
from ptmjax.families import head_predictions
from ptmjax.families.model_api import ModelApi


class HeadEvaluator:
    """Evaluates a head model's parameters on the tasks of `mixture_or_task_name` that have `split` and metrics.

    task_feature_lengths: 'inputs' is cut to its length (None: the longest example's).
    """

    def __init__(
        self, api: ModelApi, mixture_or_task_name: str, mesh: Mesh, rules: partitioning.Rules, batch_size: int,
        task_feature_lengths: Mapping[str, int] | None = None, split: str = "validation",
        max_examples: int | None = None,
    ):
        if api.family.head_predictions is None:
            raise ValueError(f"{type(api.module).__name__} has no task head; evaluate it with InferenceEvaluator")
        provider = pipeline.get_task_or_mixture(mixture_or_task_name)
        self._tasks = [t for t in seqio.get_subtasks(provider) if split in t.splits and t.metric_fns]
        if not self._tasks:
            raise ValueError(
                f"no task of {mixture_or_task_name!r} has a {split!r} split and metric functions; "
                "evaluate a task registered with metric_fns"
            )
        batching.check_arguments(mesh, batch_size, max_examples)
        self._api, self._batch_size = api, batch_size
        self._examples, self._rows = {}, {}
        converter = api.family.feature_converter(pack=False)
        for task in self._tasks:
            dataset = task.get_dataset(None if task_feature_lengths is None else dict(task_feature_lengths),
                                       split=split, shuffle=False, num_epochs=1, seed=0, use_cached=False)
            if max_examples is not None:
                dataset = dataset.take(max_examples)
            self._examples[task.name] = examples = list(dataset.as_numpy_iterator())
            lengths = task_feature_lengths or {"inputs": max(len(example["inputs"]) for example in examples)}
            self._rows[task.name] = converter(dataset, dict(lengths)).enumerate()
        with jax.set_mesh(mesh):
            self._param_shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, rules)
        self._row_sharding = partitioning.batch_sharding(mesh)
        self._predict = batching.jit_on_rows(api.head_predictions, self._param_shardings, self._row_sharding, rules)

    @property
    def task_names(self) -> list[str]:
        return [task.name for task in self._tasks]

    def num_examples(self) -> dict[str, int]:
        """{task: examples evaluated}."""
        return {name: len(examples) for name, examples in self._examples.items()}

    def evaluate(self, params: Any, step: int | None = None) -> TaskMetrics:
        """{task: {metric: value}} of `params` (laid out anyhow; moved to the mesh once)."""
        del step  # kept for InferenceEvaluator's interface
        results = {}
        for task, (targets, predictions) in zip(self._tasks, self.outputs(params).values(), strict=True):
            metrics: dict[str, Any] = {}
            for metric_fn in task.metric_fns:
                metrics.update(metric_fn(targets, predictions))
            results[task.name] = scalars(metrics)
        return results

    def outputs(self, params: Any) -> dict[str, tuple[list[Any], list[Any]]]:
        """{task: (targets, predictions)}: every example's target and prediction as the task's metric functions
        take them (postprocessed), in the split's order; metrics of any subset of examples follow from these."""
        params = jax.device_put(params, self._param_shardings)
        outputs = {}
        for task in self._tasks:
            examples = self._examples[task.name]
            rows = self._predictions(params, task.name)
            raw = [self._output(task, row, example) for row, example in zip(rows, examples, strict=True)]
            targets = [task.postprocess_fn(example.get("targets_pretokenized"), example=example, is_target=True)
                       for example in examples]
            predictions = [task.postprocess_fn(output, example=example, is_target=False)
                           for output, example in zip(raw, examples, strict=True)]
            outputs[task.name] = targets, predictions
        return outputs

    def _predictions(self, params: Any, task_name: str) -> list[np.ndarray]:
        """The head's prediction row of every example, in order."""
        by_index = {}
        for batch in batching.padded_batches(self._rows[task_name], self._batch_size):
            rows = batching.to_host(self._predict(params, batching.on_mesh(batch.features, self._row_sharding)))
            by_index.update(zip(batch.indices.tolist(), rows[: batch.count], strict=True))
        return [by_index[i] for i in range(len(by_index))]

    def _output(self, task: seqio.Task, row: np.ndarray, example: Mapping[str, Any]) -> Any:
        """A prediction row as the task's postprocessor takes it: an int, a float, a list, or a span's text."""
        if self._api.family.head_predictions is head_predictions.answer_spans:
            start, end = (int(i) for i in row)
            return task.output_features["inputs"].vocabulary.decode(example["inputs"][start : end + 1].tolist())
        if row.ndim:
            return row.tolist()
        return row.item()


def evaluator_for(
    api: ModelApi, mixture_or_task_name: str, mesh: Mesh, rules: partitioning.Rules, decode_config: DecodeConfig,
    ids: GenerationIds, batch_size: int, split: str = "validation",
    task_feature_lengths: Mapping[str, int] | None = None, max_examples: int | None = None, show_progress: bool = False,
    logits_chunk_size: int | None = None,
) -> HeadEvaluator | InferenceEvaluator:
    """The evaluator of `api`'s model: a HeadEvaluator for a task head, else an InferenceEvaluator (scoring
    `logits_chunk_size` positions at a time if set)."""
    if api.family.head_predictions is not None:
        return HeadEvaluator(api, mixture_or_task_name, mesh, rules, batch_size, task_feature_lengths, split,
                             max_examples)
    return InferenceEvaluator(api, mixture_or_task_name, mesh, rules, decode_config, ids, batch_size, split,
                              task_feature_lengths, max_examples, show_progress, logits_chunk_size)
