"""`ptmjax prune-layers --from MODEL_DIR --to OUT_DIR --keep every_other`: a model folder's layers pruned as
LayerDrop prunes them at inference (Fan et al., 2019; ptmjax/compress/layerdrop.py), written as a new, shallower
model folder (tools/derived_folder.py) that `ptmjax.load`, `eval`, `infer` and `inspect` read as any other.

Its config.gin rebinds the model config's layer counts; its checkpoint holds the kept layers, renumbered.
`--keep` is 'every_other' (layers 0, 2, 4, ... of every stack), a list of layer indices ('0,2,5') for a model
with one stack, or per stack ('encoder=every_other', 'decoder=0,3'; given once per stack, a stack not named
keeping all its layers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ptmjax import gin_files
from ptmjax.compress.layerdrop import EVERY_OTHER, Keep, StackKeep, prune_layers
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tools.derived_folder import refuse_target, source_config, write_derived_folder


def prune_layers_folder(source: str, target: str, keep: Keep, step: int | None = None,
                        overwrite: bool = False) -> str:
    """Writes `source`'s checkpoint `step` (default: the newest) keeping the layers `keep` names as the model folder
    `target`; returns the checkpoint path."""
    folder = ModelDir(source)
    model, _ = gin_files.read_model_config(folder)
    config, _ = source_config(folder)
    refuse_target(target, "a layer-pruned model folder", "ptmjax prune-layers", overwrite)
    step = folder.checkpoint_step(step)
    pruned_model, params = prune_layers(model, folder.read_params(model_api(model).abstract_params, step=step), keep)
    note = f"\n# Layers kept from {folder.path} (step {step}) by `ptmjax prune-layers --keep {keep!r}`.\n"
    return write_derived_folder(folder, target, config + note + _depth_bindings(model.config, pruned_model.config),
                                params, step)


def parse_keep(values: Sequence[str]) -> Keep:
    """`--keep` values: one 'every_other' or 'i,j,...', or 'stack=every_other' / 'stack=i,j,...' for each stack."""
    if len(values) == 1 and "=" not in values[0]:
        return _stack_keep(values[0])
    named = [value.partition("=") for value in values]
    if any(not name or not sep for name, sep, _ in named):
        raise ValueError(f"--keep {' '.join(values)}: give one keep-list, or one 'stack=list' per stack (e.g. "
                         "--keep encoder=every_other --keep decoder=0,3)")
    return {name: _stack_keep(value) for name, _, value in named}


def _stack_keep(value: str) -> StackKeep:
    if value == EVERY_OTHER:
        return value
    try:
        return [int(index) for index in value.split(",")]
    except ValueError:
        raise ValueError(f"--keep {value!r} is neither {EVERY_OTHER!r} nor layer indices like '0,2,5'") from None


def _depth_bindings(config, pruned) -> str:
    """The gin lines that give the model config the pruned one's fields where they differ."""
    name = type(config).__name__
    return "".join(f"{name}.{field.name} = {getattr(pruned, field.name)!r}\n" for field in dataclasses.fields(config)
                   if getattr(config, field.name) != getattr(pruned, field.name))
