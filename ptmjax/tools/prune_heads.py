"""`ptmjax prune-heads --from MODEL_DIR --to OUT_DIR --task TASK --fraction F [--rounds N]`: the least important
attention heads (Michel et al., 2019) of a model folder removed, written as a new model folder that `ptmjax.load`,
`eval`, `infer` and `inspect` read as any other.

Each head's importance is the mean |dL/dξ_h| of the family's loss over `num_batches` batches of the task's
`split` (ptmjax/compress/head_importance.py), normalised per attention by its L2 norm; the `fraction` of all heads
with the lowest scores go, never an attention's last, in one shot or in `rounds` equal shares, each round scoring
the heads with those of earlier rounds masked (`iterative_pruning`). The new folder's config.gin is the source's
with the model bound as `@head_pruned()` of the source's model and the pruned heads
(ptmjax/compress/head_pruning.py); its checkpoint, at the source's step, holds the smaller kernels. With
`keep_shapes` it holds the source's model instead, at full size, with the pruned heads' output-kernel rows zero:
the same function, in the shapes Hugging Face export needs. A scanned source is scored and written unscanned
(its config's `scan_layers` bound False): pruned layers hold different numbers of heads, which one stacked
kernel cannot. head_importance.json records the pruned heads and each round's scores and heads; an import's
tokenizer, generation ids and sentence-transformers files come along. The folder is written whole.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import jax
import numpy as np

from ptmjax import gin_files, partitioning
from ptmjax.compress.head_importance import PruningRound, iterative_pruning
from ptmjax.compress.head_pruning import prune_params, pruning_of, zeroed_params
from ptmjax.data import pipeline
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tools.derived_folder import refuse_target, source_config, unscanned_config, write_derived_folder

IMPORTANCE_FILE = "head_importance.json"


def prune_heads_folder(
    source: str, target: str, task: str, fraction: float, *, rounds: int = 1, split: str = "validation",
    num_batches: int = 8, batch_size: int = 8, task_feature_lengths: Mapping[str, int] | None = None,
    keep_shapes: bool = False, step: int | None = None, overwrite: bool = False,
) -> str:
    """Writes `source`'s checkpoint `step` (default: the newest) with the least important `fraction` of its heads
    pruned in `rounds` as the model folder `target` (module docstring); returns the checkpoint path."""
    folder = ModelDir(source)
    model, mesh_config = gin_files.read_model_config(folder)
    if pruning_of(model) is not None:
        raise ValueError(f"{folder.path} holds a head-pruned model already; prune its source's heads instead")
    bindings = gin_files.read_train_bindings(folder)
    lengths = task_feature_lengths or bindings.get("task_feature_lengths")
    if not lengths:
        raise ValueError(f"{folder.config_path} binds no train.task_feature_lengths; give the lengths to score the "
                         "task at (--inputs_length, --targets_length)")
    config, model_binding = source_config(folder)
    refuse_target(target, "a head-pruned model folder", "ptmjax prune-heads", overwrite)
    step = folder.checkpoint_step(step)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=-1))
    if batch_size % mesh.size:
        raise ValueError(f"--batch_size={batch_size} does not split over the {mesh.size} devices; give a multiple "
                         f"of {mesh.size}")
    api = model_api(model)
    if api.scanning:
        config = unscanned_config(folder, config, layer_stack.with_scan_layers(model, False))
        print(f"{folder.path} scans its layers: scoring its heads and writing {target} unscanned (scan_layers = "
              "False), since pruned layers differ in their numbers of heads")
    dataset = pipeline.get_dataset(task, split, lengths, batch_size, seed=0, shuffle=False, pack=False, num_epochs=1,
                                   feature_converter=api.family.feature_converter)
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
        model, params = layer_stack.unscanned(model, folder.read_params(api.abstract_params, shardings, step))
        batches = [partitioning.global_batch(batch, mesh)
                   for batch in itertools.islice(dataset.as_numpy_iterator(), num_batches)]
        pruned, done = iterative_pruning(model, params, batches, fraction, rounds,
                                         bindings.get("loss_config") or LossConfig())
        new_params = jax.device_get((zeroed_params if keep_shapes else prune_params)(params, pruned))
    record = {"source": folder.path, "step": step, "task": task, "split": split, "num_batches": num_batches,
              "batch_size": batch_size, "fraction": fraction, "keep_shapes": keep_shapes,
              "unscanned": bool(api.scanning), "pruned_heads": {path: list(heads) for path, heads in pruned.items()},
              "rounds": list(map(_round, done))}
    note = (f"# {sum(map(len, pruned.values()))} attention heads pruned from {folder.path} (step {step}) by "
            f"`ptmjax prune-heads` on {task}{', zeroed at full size' if keep_shapes else ''}.\n")
    config += "\n" + note + ("" if keep_shapes else _pruned_binding(model_binding, pruned))
    return write_derived_folder(folder, target, config, new_params, step, {IMPORTANCE_FILE: record})


def _round(done: PruningRound) -> dict:
    """A round as head_importance.json holds it: its pruned heads, and its scores (null at heads masked in it)."""
    return {"pruned_heads": {path: list(heads) for path, heads in done.pruned.items()},
            "importance": {path: values.tolist() for path, values in done.importance.items()},
            "normalised_importance": {path: [None if np.isnan(v) else float(v) for v in values]
                                      for path, values in done.scores.items()}}


def _pruned_binding(model_binding: str, pruned: Mapping[str, tuple[int, ...]]) -> str:
    """The gin lines that rebind train.model to the source model with `pruned` heads removed."""
    return "\n".join([f"head_pruned.model = {model_binding}", f"head_pruned.pruned_heads = {dict(pruned)!r}",
                      "train.model = @head_pruned()", ""])
