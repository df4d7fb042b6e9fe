"""An early-exit model's score against the layers it uses, for any number of exit policies from one pass.

`ExitEvaluation(model_dir, task)` reads a model folder holding an `early_exit` model (its config.gin,
mesh and checkpoint, as `ptmjax eval` does), computes every exit's logits for each example of the
task's split once (jitted on the folder's mesh, all layers), and `report(policy)` gives, for an
`EntropyExit` or `PatienceExit` (ptmjax/compress/early_exit_policies.py), the task's metrics on the
predictions at each example's exit, the average exit layer (1-based) and the fraction of layer
computations an example-by-example exit leaves out. `EntropyExit(0)` is the plain classifier's score.

    evaluation = ExitEvaluation("runs/early_exit_demo", "ptmjax_stdlib_module_classification_head")
    for policy in (EntropyExit(0.0), EntropyExit(0.5), PatienceExit(1)):
        print(evaluation.report(policy))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import seqio

from ptmjax import gin_files, partitioning
from ptmjax.compress.early_exit import check_exit_model, exit_depth
from ptmjax.compress.early_exit_policies import ExitPolicy, exit_decisions, layers_saved
from ptmjax.data import pipeline
from ptmjax.evaluation import batching
from ptmjax.evaluation.evaluator import scalars
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir


@dataclasses.dataclass(frozen=True)
class ExitReport:
    """One policy on one task: its metrics, average exit layer (1-based) of `depth`, and the layers saved."""

    task: str
    policy: ExitPolicy
    metrics: dict[str, float]
    average_exit_layer: float
    layers_saved: float
    depth: int


class ExitEvaluation:
    """Every exit's logits on a task's split, computed once; `report` scores any policy on them."""

    def __init__(self, model_dir: str, task: str, *, split: str = "validation", step: int | None = None,
                 batch_size: int = 32, max_examples: int | None = None):
        folder = ModelDir(model_dir)
        model, mesh_config = gin_files.read_model_config(folder)
        check_exit_model(model, "ExitEvaluation")
        self.depth = exit_depth(model)
        self._tasks = [t for t in seqio.get_subtasks(pipeline.get_task_or_mixture(task)) if split in t.splits]
        if not self._tasks:
            raise ValueError(f"no task of {task!r} has a {split!r} split; pass a task with one")
        api, mesh = model_api(model), partitioning.make_mesh(mesh_config)
        batching.check_arguments(mesh, batch_size, max_examples)
        with jax.set_mesh(mesh):
            shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
        params = folder.read_params(api.abstract_params, shardings, folder.checkpoint_step(step))

        def all_exits(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
            logits = api.module.apply({"params": params}, **api.model_inputs(batch), method="exit_logits")
            return logits.transpose(1, 0, 2)  # [b, L, C]: rows first, as the mesh splits them

        rows = partitioning.batch_sharding(mesh)
        run = batching.jit_on_rows(all_exits, shardings, rows, mesh_config.rules)
        lengths = gin_files.read_train_bindings(folder).get("task_feature_lengths")
        self._examples, self._logits = {}, {}
        for t in self._tasks:
            dataset = t.get_dataset(lengths, split=split, shuffle=False, num_epochs=1, seed=0, use_cached=False)
            if max_examples is not None:
                dataset = dataset.take(max_examples)
            self._examples[t.name] = examples = list(dataset.as_numpy_iterator())
            converted = api.family.feature_converter(pack=False)(
                dataset, lengths or {"inputs": max(len(e["inputs"]) for e in examples)}
            )
            by_index = {}
            for batch in batching.padded_batches(converted.enumerate(), batch_size):
                logits = batching.to_host(run(params, batching.on_mesh(batch.features, rows)))
                by_index.update(zip(batch.indices.tolist(), logits[: batch.count], strict=True))
            self._logits[t.name] = np.stack([by_index[i] for i in range(len(examples))], axis=1)  # [L, n, C]

    def report(self, policy: ExitPolicy) -> list[ExitReport]:
        """Each task's `ExitReport` under `policy`."""
        reports = []
        for task in self._tasks:
            examples = self._examples[task.name]
            state = jax.jit(exit_decisions, static_argnums=0)(policy, self._logits[task.name])
            targets = [task.postprocess_fn(e.get("targets_pretokenized"), example=e, is_target=True) for e in examples]
            predictions = [task.postprocess_fn(int(p), example=e, is_target=False)
                           for p, e in zip(np.asarray(state.predictions), examples, strict=True)]
            metrics: dict[str, Any] = {}
            for metric_fn in task.metric_fns:
                metrics.update(metric_fn(targets, predictions))
            layers = np.asarray(state.layer)
            reports.append(ExitReport(task.name, policy, scalars(metrics), float(layers.mean()),
                                      layers_saved(layers, self.depth), self.depth))
        return reports

