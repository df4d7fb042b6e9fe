"""A classifier's score against the tokens PoWER-BERT keeps, the FLOPs and the measured speed, per retention.

`RetentionEvaluation(model_dir, task)` reads a model folder holding an encoder-family sequence classifier, plain
or `power_bert` (ptmjax/compress/token_dropping.py; the transformation adds no parameters, so either folder
serves any retention), with its config.gin, mesh and checkpoint as `ptmjax eval` does. `report(retention)`
wraps the classifier in `power_bert(classifier, retention)` (None: the plain classifier) and gives, per task:
the head evaluator's metrics; the positions each layer keeps per row and the average real (non-padding)
tokens among them (padding goes first, so a row of n real tokens keeps min(l_j, n)); the token-layers
computed as a fraction of the full model's (sum of l_j over L * s); XLA's FLOPs of one batch against the
full model's; and the speed-up over the full model measured on one device of this host (median seconds of
`repeats` jitted calls on the split's first batch, alternating with the full model's).

    evaluation = RetentionEvaluation("runs/power_bert_demo", "ptmjax_stdlib_module_classification_head")
    for retention in (None, [0.5, 0.25], [0.25, 0.125]):
        print(evaluation.report(retention))

`searched_retention(model_dir, length)` reads the retention a `retention_search` run found
(ptmjax/compress/retention_search.py), for `power_bert.retention`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import seqio

from ptmjax import gin_files, partitioning
from ptmjax.compress.retention_search import SOFT_RETENTION, is_searching, retention_of
from ptmjax.compress.token_dropping import check_dropping_base, plain_classifier, power_bert
from ptmjax.data import pipeline
from ptmjax.evaluation.head_evaluator import HeadEvaluator
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tree_paths import subtree


@dataclasses.dataclass(frozen=True)
class RetentionReport:
    """One retention (None: the plain classifier) on one task; see the module docstring for each field."""

    task: str
    retention: tuple[int | float, ...] | None
    metrics: dict[str, float]
    tokens_kept: tuple[int, ...]
    real_tokens_kept: tuple[float, ...]
    token_layers: float
    flops_ratio: float
    speedup: float


class RetentionEvaluation:
    """A classifier folder's checkpoint, evaluated at any retention by `report`."""

    def __init__(self, model_dir: str, task: str, *, split: str = "validation", step: int | None = None,
                 batch_size: int = 32, max_examples: int | None = None, repeats: int = 5):
        folder = ModelDir(model_dir)
        model, self._mesh_config = gin_files.read_model_config(folder)
        self.classifier = plain_classifier(model)
        check_dropping_base(self.classifier)
        self._task, self._split, self._batch_size, self._max_examples = task, split, batch_size, max_examples
        self._repeats = repeats
        self._lengths = gin_files.read_train_bindings(folder).get("task_feature_lengths")
        self._mesh = partitioning.make_mesh(self._mesh_config)
        api = model_api(self.classifier)
        with jax.set_mesh(self._mesh):
            shardings = partitioning.logical_shardings(api.boxed_abstract_params, self._mesh, self._mesh_config.rules)
        self.params = folder.read_params(api.abstract_params, shardings, folder.checkpoint_step(step))
        self._rows = {t.name: self._input_rows(t) for t in seqio.get_subtasks(pipeline.get_task_or_mixture(task))
                      if split in t.splits}
        if not self._rows:
            raise ValueError(f"no task of {task!r} has a {split!r} split; pass a task with one")
        self._batch = jax.device_put(next(iter(self._rows.values()))[:batch_size], jax.devices()[0])
        self._device_params = jax.device_put(self.params, jax.devices()[0])
        self._full, self._full_flops = self._compiled(self.classifier)

    def report(self, retention: Sequence[int | float] | None) -> list[RetentionReport]:
        """Each task's `RetentionReport` with `retention` (None: the plain classifier)."""
        model = self.classifier if retention is None else power_bert(self.classifier, retention)
        evaluator = HeadEvaluator(model_api(model), self._task, self._mesh, self._mesh_config.rules,
                                  self._batch_size, self._lengths, self._split, self._max_examples)
        results = evaluator.evaluate(self.params)
        compiled, flops = self._compiled(model)
        speedup = self._speedup(compiled)
        reports = []
        for name, rows in self._rows.items():
            length, depth = rows.shape[1], self.classifier.config.num_layers
            kept = (length,) * depth if retention is None else model.retained_counts(length)
            real = (rows != self.classifier.config.pad_token_id).sum(-1)
            reports.append(RetentionReport(
                name, None if retention is None else model.retention, results[name], kept,
                tuple(float(np.minimum(count, real).mean()) for count in kept), sum(kept) / (depth * length),
                flops / self._full_flops, speedup,
            ))
        return reports

    def _input_rows(self, task: seqio.Task) -> np.ndarray:
        """int [n, s]: the split's input token rows, as the head evaluator converts them."""
        dataset = task.get_dataset(self._lengths, split=self._split, shuffle=False, num_epochs=1, seed=0,
                                   use_cached=False)
        if self._max_examples is not None:
            dataset = dataset.take(self._max_examples)
        lengths = self._lengths or {"inputs": max(len(e["inputs"]) for e in dataset.as_numpy_iterator())}
        converted = model_api(self.classifier).family.feature_converter(pack=False)(dataset, dict(lengths))
        return np.stack([row["input_tokens"] for row in converted.as_numpy_iterator()])

    def _compiled(self, model: Any) -> tuple[Any, float]:
        """(`model` jitted on the first task's first batch on one device, XLA's FLOPs of that call)."""
        compiled = jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(self._device_params,
                                                                              self._batch).compile()
        analysis = compiled.cost_analysis()
        return compiled, (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

    def _speedup(self, compiled: Any) -> float:
        """The full model's median seconds over `compiled`'s, their calls alternating (so that the host's other
        load weighs on both alike)."""
        runs, seconds = (self._full, compiled), ([], [])
        for _ in range(self._repeats + 1):
            for run, times in zip(runs, seconds, strict=True):
                start = time.perf_counter()
                run(self._device_params, self._batch).block_until_ready()
                times.append(time.perf_counter() - start)
        full, own = (statistics.median(times[1:]) for times in seconds)  # the first calls warm up
        return full / own


def searched_retention(model_dir: str, length: int, step: int | None = None) -> tuple[int, ...]:
    """The retention a `retention_search` run found (its checkpoint `step`, default the newest), as token
    counts for inputs `length` long, for `power_bert.retention`."""
    folder = ModelDir(model_dir)
    model, _ = gin_files.read_model_config(folder)
    if not is_searching(model):
        raise ValueError(f"{folder.path} holds a {type(model).__name__}, not a retention_search model; give the "
                         "folder of the run that searched")
    wanted = subtree(model_api(model).abstract_params, [SOFT_RETENTION])  # the retention weights alone
    params = folder.read_params(wanted, step=step, whole=False)
    return retention_of(params[SOFT_RETENTION], model.rate, length)
