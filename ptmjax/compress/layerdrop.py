"""LayerDrop's pruning at inference (Fan et al., 2019): a shallower model that keeps some of each stack's layers.

A model trained with LayerDrop (`layerdrop` on its config, ptmjax/layers/layer_stack.py) loses little
when layers are removed. `prune_layers` keeps the layers a keep-list names and returns the shallower
model, whose config has fewer layers, with its parameters: the kept layers renumbered `layers_0`, ...,
every other parameter (embeddings, norms, T5's relative-position biases, heads) as it was. It equals
the full model run with the other layers skipped. Keep-lists:

- `'every_other'`: layers 0, 2, 4, ... of every stack (the paper's "every other layer");
- a list of layer indices, for a model with one stack (GPT-2, the BERT family);
- a mapping from stack name to either of those (T5, BART: {'encoder': [0, 2], 'decoder': 'every_other'});
  a stack it does not name keeps all its layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn

from ptmjax.layers.layer_stack import LayerStackConfig, scan, unscan

EVERY_OTHER = "every_other"
StackKeep = str | Sequence[int]
Keep = StackKeep | Mapping[str, StackKeep]
Path = tuple[str, ...]
LAYER_NAME = re.compile(r"layers_\d+")


def every_other(depth: int) -> tuple[int, ...]:
    """Layers 0, 2, 4, ... of a stack `depth` layers deep."""
    return tuple(range(0, depth, 2))


def stack_name(path: Path) -> str:
    """A stack's name in a keep mapping: its path joined by '/' ('encoder', 'decoder'; '' for a model's one stack)."""
    return "/".join(path)


def kept_layers(config: LayerStackConfig, keep: Keep) -> dict[Path, tuple[int, ...]]:
    """{stack path: the indices of the layers it keeps}, for every stack of `config`; errors name the fix."""
    depths = config.layer_stacks()
    if isinstance(keep, Mapping):
        names = {stack_name(path): path for path in depths}
        unknown = [name for name in keep if name not in names]
        if unknown:
            raise ValueError(
                f"prune_layers: keep names the stacks {unknown}, but the model's stacks are {list(names)}."
            )
        by_path = {names[name]: stack_keep for name, stack_keep in keep.items()}
    elif isinstance(keep, str) or len(depths) == 1:
        by_path = dict.fromkeys(depths, keep)
    else:
        raise ValueError(
            f"prune_layers: keep={list(keep)!r} is one list, but the model has the stacks "
            f"{[stack_name(p) for p in depths]}; name them, e.g. keep={{'encoder': [0, 2], 'decoder': [0]}}."
        )
    return {path: _layer_indices(by_path.get(path, range(depth)), depth, stack_name(path)) for path, depth in
            depths.items()}


def _layer_indices(keep: StackKeep, depth: int, name: str) -> tuple[int, ...]:
    """One stack's keep-list as increasing layer indices in [0, depth)."""
    where = f"the {name} stack" if name else "the layer stack"
    if isinstance(keep, str):
        if keep != EVERY_OTHER:
            raise ValueError(f"prune_layers: keep={keep!r} for {where} is unknown; use {EVERY_OTHER!r} or a list.")
        return every_other(depth)
    indices = tuple(keep)
    if not indices or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth for i in indices):
        raise ValueError(
            f"prune_layers: keep={list(indices)!r} for {where} must name at least one of its layers 0 ... {depth - 1}."
        )
    if any(a >= b for a, b in zip(indices, indices[1:], strict=False)):
        raise ValueError(
            f"prune_layers: keep={list(indices)!r} for {where} must list distinct layers in increasing order."
        )
    return indices


def prune_layers(model: nn.Module, params: Mapping[str, Any], keep: Keep) -> tuple[nn.Module, dict]:
    """(the shallower model, its parameters) keeping the layers `keep` names (see the module docstring).

    `params`: the model's unboxed parameters, with or without a top 'params' key, scanned when its
    config scans (the result is laid out as the input). A layer must keep its layer fields at its new
    position (MoE every k layers: whole periods of k layers); layers that share parameters (ALBERT) are
    refused, naming the fix.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, LayerStackConfig):
        raise ValueError(
            f"prune_layers needs a model whose config is one family's LayerStackConfig, got {type(config).__name__}; "
            "prune a joint model's parts (ELECTRA's discriminator) one by one."
        )
    kept = kept_layers(config, keep)
    pruned_config = config.with_stack_depths({path: len(indices) for path, indices in kept.items()})
    for path, indices in kept.items():
        for new, old in enumerate(indices):
            if config.layer_fields(old) != pruned_config.layer_fields(new):
                raise ValueError(
                    f"prune_layers: layer {old} of the {stack_name(path) or 'layer'} stack has "
                    f"{config.layer_fields(old)} but would become layer {new}, which has "
                    f"{pruned_config.layer_fields(new)}; keep layers with the fields of their new positions "
                    "(MoE every k layers: whole periods of k layers)."
                )
    unscanned = unscan(params, config) if config.scan_layers else params
    has_root = set(unscanned) == {"params"}
    tree = _renumbered(dict(unscanned["params"] if has_root else unscanned), kept)
    pruned = {"params": tree} if has_root else tree
    return model.clone(config=pruned_config), scan(pruned, pruned_config) if config.scan_layers else pruned


def _renumbered(tree: dict, kept: Mapping[Path, Sequence[int]]) -> dict:
    """`tree` with each stack's layers_{i} for i in its kept indices renumbered layers_0, ...; the rest dropped."""
    for path, indices in kept.items():
        node = tree
        for key in path:
            node[key] = dict(node[key])
            node = node[key]
        renumbered = {f"layers_{new}": node[f"layers_{old}"] for new, old in enumerate(indices)}
        for name in [name for name in node if LAYER_NAME.fullmatch(name)]:
            del node[name]
        node.update(renumbered)
    return tree
