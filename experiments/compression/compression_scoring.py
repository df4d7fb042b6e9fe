"""Scoring a row's model folder: every validation example's correctness, its parameters and their bytes on disk,
and the throughput of its scoring forward pass."""

from __future__ import annotations

import json
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from compression_methods import TASK

BATCH_SIZE = 32
THROUGHPUT_ROUNDS = 3

Scorer = Callable[[], list[bool]]  # one scoring pass over the validation split: each example's correctness


def cached(folder: pathlib.Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """folder/result.json, computed and written if absent."""
    path = folder / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    result = compute()
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def evaluator_of(folder: pathlib.Path) -> tuple[Any, Any]:
    """(the head evaluator `ptmjax eval` builds for the folder's newest checkpoint on TASK, its parameters)."""
    from ptmjax.decoding import DecodeConfig
    from ptmjax.tools.evaluate import folder_evaluator

    return folder_evaluator(str(folder), TASK, DecodeConfig(), batch_size=BATCH_SIZE)


def validation_batches(folder: pathlib.Path, model: Any) -> list[dict[str, np.ndarray]]:
    """The task's validation split in batches of BATCH_SIZE, as the folder's run cut its inputs."""
    from ptmjax.data import pipeline
    from ptmjax.families.model_api import model_api
    from ptmjax.gin_files import read_train_bindings
    from ptmjax.storage.model_dir import ModelDir

    lengths = read_train_bindings(ModelDir(str(folder)))["task_feature_lengths"]
    dataset = pipeline.get_dataset(TASK, "validation", lengths, BATCH_SIZE, seed=0, shuffle=False, pack=False,
                                   num_epochs=1, feature_converter=model_api(model).family.feature_converter)
    return list(dataset.as_numpy_iterator())


def scorer(folder: pathlib.Path, exit_threshold: float | None) -> Scorer:
    """The folder's scoring pass over the validation batches: the head's class of each example, jitted on the
    folder's mesh as the evaluator of `ptmjax eval` jits it; for an early-exit row, `LayerByLayer` under
    `EntropyExit(exit_threshold)` (each batch computing layers until its last example has left)."""
    from ptmjax import partitioning
    from ptmjax.compress.early_exit_policies import EntropyExit
    from ptmjax.compress.early_exit_runner import LayerByLayer
    from ptmjax.evaluation import batching
    from ptmjax.families.model_api import model_api
    from ptmjax.gin_files import read_model_config
    from ptmjax.storage.model_dir import ModelDir

    source = ModelDir(str(folder))
    model, mesh_config = read_model_config(source)
    api, batches = model_api(model), validation_batches(folder, model)
    if exit_threshold is None:
        mesh = partitioning.make_mesh(mesh_config)
        with jax.set_mesh(mesh):
            shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
        params, rows = source.read_params(api.abstract_params, shardings), partitioning.batch_sharding(mesh)
        predict = batching.jit_on_rows(api.head_predictions, shardings, rows, mesh_config.rules)
        classes = lambda batch: batching.to_host(predict(params, batching.on_mesh(batch, rows)))  # noqa: E731
    else:
        runner = LayerByLayer(model, source.read_params(api.abstract_params), EntropyExit(exit_threshold))
        classes = lambda batch: np.asarray(  # noqa: E731
            runner(batch["input_tokens"], batch["token_type_ids"]).state.predictions)

    def score() -> list[bool]:
        correct = []
        for batch in batches:
            hits = np.asarray(classes(batch)) == batch["label"]
            correct += [bool(hit) for hit, weight in zip(hits, batch["example_weight"], strict=True) if weight]
        return correct

    return score


def evaluated(folder: pathlib.Path) -> list[bool]:
    """Every validation example's correctness by the evaluator of `ptmjax eval` (the task's own targets and
    postprocessed predictions)."""
    evaluator, params = evaluator_of(folder)
    targets, predictions = evaluator.outputs(params)[TASK]
    return [bool(t == p) for t, p in zip(targets, predictions, strict=True)]


def exit_report(folder: pathlib.Path, exit_threshold: float) -> dict[str, float]:
    """`ExitEvaluation`'s report of the policy: the accuracy, the average exit layer and the layers saved."""
    from ptmjax.compress.early_exit_evaluation import ExitEvaluation
    from ptmjax.compress.early_exit_policies import EntropyExit

    (report,) = ExitEvaluation(str(folder), TASK, batch_size=BATCH_SIZE).report(EntropyExit(exit_threshold))
    return {"accuracy": report.metrics["accuracy"] / 100, "average_exit_layer": report.average_exit_layer,
            "layers_saved": report.layers_saved}


def token_report(folder: pathlib.Path) -> dict[str, Any] | None:
    """A PoWER-BERT folder's `RetentionEvaluation` report at its own retention: accuracy, positions kept per layer,
    real tokens kept on average per layer, the token-layers' share of the full model's and the FLOPs'; None for
    another folder."""
    from ptmjax.compress.token_dropping import is_token_dropping
    from ptmjax.compress.token_dropping_evaluation import RetentionEvaluation
    from ptmjax.gin_files import read_model_config
    from ptmjax.storage.model_dir import ModelDir

    model, _ = read_model_config(ModelDir(str(folder)))
    if not is_token_dropping(model):
        return None
    (report,) = RetentionEvaluation(str(folder), TASK, batch_size=BATCH_SIZE).report(model.retention)
    return {"accuracy": report.metrics["accuracy"] / 100, "tokens_kept": report.tokens_kept,
            "real_tokens_kept": report.real_tokens_kept, "token_layers": report.token_layers,
            "flops_ratio": report.flops_ratio}


def measure(folder: pathlib.Path, exit_threshold: float | None) -> dict[str, Any]:
    """The folder's accuracy and every validation example's correctness, its parameter counts, and the bytes its
    parameters take on disk as a checkpoint of the parameters alone (written beside it, as `ptmjax quantize` and
    the pruning commands write theirs). The scoring pass must agree with the evaluator of `ptmjax eval` example by
    example; an early-exit row's with ExitEvaluation's accuracy, a PoWER-BERT row's with RetentionEvaluation's,
    which they report too."""
    from ptmjax.storage.model_dir import ModelDir
    from ptmjax.tools.derived_folder import checkpoint_bytes, source_config, write_derived_folder

    def compute() -> dict[str, Any]:
        correct = scorer(folder, exit_threshold)()
        result = {"correct": correct, "accuracy": float(np.mean(correct))}
        if exit_threshold is None and evaluated(folder) != correct:
            raise RuntimeError(f"{folder}: the scoring pass and the evaluator of `ptmjax eval` disagree")
        if exit_threshold is not None:
            result["exits"] = exit_report(folder, exit_threshold)
            if abs(result["exits"]["accuracy"] - result["accuracy"]) > 1e-9:
                raise RuntimeError(f"{folder}: ExitEvaluation scores {result['exits']['accuracy']}, the layer-by-layer "
                                   f"run {result['accuracy']}")
        if (tokens := token_report(folder)) is not None:
            result["tokens"] = tokens
            if abs(tokens["accuracy"] - result["accuracy"]) > 1e-9:
                raise RuntimeError(f"{folder}: RetentionEvaluation scores {tokens['accuracy']}, the scoring pass "
                                   f"{result['accuracy']}")
        _, params = evaluator_of(folder)
        params = jax.device_get(params)
        leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(params)]
        source = ModelDir(str(folder))
        only = folder / "parameters_only"
        checkpoint = only / "checkpoints" / str(source.checkpoint_step())
        if not only.exists():
            checkpoint = pathlib.Path(write_derived_folder(source, str(only), source_config(source)[0], params,
                                                           source.checkpoint_step()))
        return {**result, "parameters": sum(leaf.size for leaf in leaves),
                "nonzero_parameters": sum(int(np.count_nonzero(leaf)) for leaf in leaves),
                "memory_bytes": sum(leaf.nbytes for leaf in leaves), "disk_bytes": checkpoint_bytes(str(checkpoint))}

    name = "measured" if exit_threshold is None else f"measured_exit{exit_threshold:g}"
    return cached(folder / name, compute)


def throughputs(scorers: dict[str, Scorer]) -> dict[str, dict[str, Any]]:
    """Examples per second of each row's scoring pass over the validation split, compiled first: THROUGHPUT_ROUNDS
    rounds, every row once per round, the median kept."""
    examples = {name: len(score()) for name, score in scorers.items()}  # the first pass compiles
    seconds: dict[str, list[float]] = {name: [] for name in scorers}
    for _ in range(THROUGHPUT_ROUNDS):
        for name, score in scorers.items():
            start = time.perf_counter()
            score()
            seconds[name].append(time.perf_counter() - start)
    return {name: {"seconds": values, "examples": examples[name],
                   "examples_per_s": examples[name] / statistics.median(values)} for name, values in seconds.items()}
