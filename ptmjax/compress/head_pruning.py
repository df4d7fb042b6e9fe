"""Attention heads removed from a model's parameters: smaller query, key, value and output kernels.

`head_pruned(model, pruned_heads)` returns `model` adapted by interception (ptmjax/adapt/interception.py), where
`pruned_heads` maps attention module paths ('/'-joined, e.g. 'encoder/layers_0/attention', as
`head_masks.masks_of` names them) to the heads each loses. Such an attention keeps k of its h heads: its
`query`, `key` and `value` kernels are [embed, k, head_dim] (biases [k, head_dim]), its `out` kernel
[k, head_dim, embed], and an additive bias with a heads axis (T5's relative-position bias) is read at the kept
heads. T5's relative-position table itself keeps every head: a stack's layers share it, each reading its own
kept heads. `prune_params(params, pruned_heads)` slices a float model's parameters to these shapes, and the
pruned model computes what the head-masked model (ptmjax/compress/head_masks.py) computes with zeros at the
pruned heads, with fewer products.

Why interception rather than a per-layer head count in each family's config (`heads_per_layer`): the counts
alone cannot say which heads T5's shared relative-position table keeps for each layer, every family's config
and layer would need the field threaded through, and a config field would not reach a model whose layers a
family builds elsewhere; the interception changes no model code, serves every family (self- and cross-attention,
encoder and decoder stacks, decoding's cache, which takes the kept heads' shape), and a folder's config.gin
rebuilds it as `head_pruned(model, pruned_heads)`. Scanned layers are refused (one stacked kernel per stack
cannot hold layers of different head counts).

Hugging Face export: transformers 5 has no head pruning (`pruned_heads` left its configs), so a pruned model is
refused there; `zeroed_params(params, pruned_heads)` gives the full-size alternative, the pruned heads' output-kernel
rows zero, which computes what the masked model does at Hugging Face's shapes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from ptmjax.adapt.interception import adapted, settings_of
from ptmjax.compress.head_masks import OUTPUT, refuse_scanned
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.dense import Dense, dense_product

Array = jax.Array

PROJECTIONS = ("query", "key", "value")
_MASK_ARGUMENT = list(inspect.signature(MultiHeadAttention.__call__).parameters).index("mask") - 1  # less self


@dataclasses.dataclass(frozen=True)
class HeadPruningSettings:
    """pruned_heads: ((attention module path, (pruned head, ...)), ...), sorted; built from a dict by `head_pruned`."""

    field: ClassVar[str] = "head_pruning"
    class_prefix: ClassVar[str] = "HeadPruned"
    title: ClassVar[str] = "head pruning"

    pruned_heads: tuple[tuple[str, tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        for path, heads in self.pruned_heads:
            if not heads or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in heads):
                raise ValueError(f"head_pruned pruned_heads[{path!r}]={heads!r} must be a non-empty tuple of head "
                                 "indices >= 0 (drop the entry to keep every head)")

    @property
    def by_path(self) -> dict[str, tuple[int, ...]]:
        return dict(self.pruned_heads)

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        refuse_scanned(model, "pruned heads")
        return _Call(self.by_path)


@dataclasses.dataclass
class _Call:
    """A head-pruned model's call in progress: the pruned heads by attention path, and the attentions seen."""

    pruned: dict[str, tuple[int, ...]]
    seen: list[str] = dataclasses.field(default_factory=list)

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if isinstance(module, MultiHeadAttention):
            path = "/".join(module.scope.path)
            self.seen.append(path)
            if path in self.pruned:
                args, kwargs = _with_kept_bias(args, kwargs, kept_heads(module.num_heads, self.pruned[path], path))
        elif (isinstance(module, Dense) and module.name in PROJECTIONS and isinstance(module.parent, MultiHeadAttention)
              and "/".join(module.parent.scope.path) in self.pruned):
            parent = module.parent
            kept = kept_heads(parent.num_heads, self.pruned["/".join(parent.scope.path)], "")
            return _projection(module, args[0] if args else kwargs["inputs"], len(kept))
        return next_fun(*args, **kwargs)

    def finish(self, model: nn.Module) -> None:
        unknown = sorted(set(self.pruned) - set(self.seen))
        if model.is_initializing() and self.seen and unknown:
            raise ValueError(f"head_pruned pruned_heads names {unknown[0]!r}, which is no attention of "
                             f"{type(model).__name__} (its attentions: {', '.join(self.seen[:4])}, ...)")


def head_pruned(model: nn.Module, pruned_heads: Mapping[str, Any]) -> nn.Module:
    """`model` with the heads `pruned_heads` ({attention path: heads}) names removed (module docstring)."""
    entries = tuple(sorted((str(path), tuple(sorted(set(heads)))) for path, heads in dict(pruned_heads).items()))
    return adapted(model, HeadPruningSettings(entries))


def pruning_of(model: nn.Module) -> HeadPruningSettings | None:
    """The head pruning of a head-pruned model, else None."""
    return settings_of(model, HeadPruningSettings)


def kept_heads(num_heads: int, pruned: tuple[int, ...], path: str) -> tuple[int, ...]:
    """The heads of `num_heads` that `pruned` leaves; refuses an index out of range and pruning every head."""
    if max(pruned) >= num_heads:
        raise ValueError(f"head_pruned pruned_heads[{path!r}] has head {max(pruned)}, but that attention has "
                         f"{num_heads} heads (0 to {num_heads - 1})")
    kept = tuple(h for h in range(num_heads) if h not in pruned)
    if not kept:
        raise ValueError(f"head_pruned pruned_heads[{path!r}] prunes all {num_heads} heads; keep at least one "
                         "(an attention without heads has no output to project)")
    return kept


def prune_params(params: Any, pruned_heads: Mapping[str, tuple[int, ...]]) -> dict:
    """A float model's `params` (unboxed) with the `pruned_heads` sliced out of each attention's projections."""
    flat = dict(traverse_util.flatten_dict(params, sep="/"))
    for path, pruned in pruned_heads.items():
        for key, heads_axis in _head_arrays(flat, path):
            kept = kept_heads(flat[key].shape[heads_axis], tuple(pruned), path)
            flat[key] = jnp.take(flat[key], jnp.asarray(kept), axis=heads_axis)
    return traverse_util.unflatten_dict(flat, sep="/")


def zeroed_params(params: Any, pruned_heads: Mapping[str, tuple[int, ...]]) -> dict:
    """A float model's `params` (unboxed) at full size with the `pruned_heads`' rows of each output kernel zero:
    the masked model's function at the unpruned shapes (what Hugging Face can hold)."""
    flat = dict(traverse_util.flatten_dict(params, sep="/"))
    for path, pruned in pruned_heads.items():
        key = _key(flat, f"{path}/{OUTPUT}/kernel")
        kept = np.isin(np.arange(flat[key].shape[0]), kept_heads(flat[key].shape[0], tuple(pruned), path))
        flat[key] = flat[key] * jnp.asarray(kept, flat[key].dtype)[:, None, None]
    return traverse_util.unflatten_dict(flat, sep="/")


def _head_arrays(flat: Mapping[str, Any], path: str) -> list[tuple[str, int]]:
    """The parameter keys of the attention at `path` that have a heads axis, with that axis."""
    keys = [(_key(flat, f"{path}/{name}/kernel"), 1) for name in PROJECTIONS]
    keys += [(f"{path}/{name}/bias", 0) for name in PROJECTIONS if f"{path}/{name}/bias" in flat]
    return [*keys, (_key(flat, f"{path}/{OUTPUT}/kernel"), 0)]


def _key(flat: Mapping[str, Any], key: str) -> str:
    if key not in flat:
        attentions = sorted({k.rsplit("/", 2)[0] for k in flat if k.endswith(f"/{OUTPUT}/kernel")})
        raise ValueError(f"pruned heads name {key.rsplit('/', 2)[0]!r}, which is no attention of these parameters "
                         f"(attentions: {', '.join(attentions[:4])}, ...)")
    return key


def _with_kept_bias(args: tuple, kwargs: dict, kept: tuple[int, ...]) -> tuple[tuple, dict]:
    """MultiHeadAttention's arguments with its mask's additive bias read at the `kept` heads where it has them."""
    args, kwargs = list(args), dict(kwargs)
    if len(args) > _MASK_ARGUMENT:
        args[_MASK_ARGUMENT] = _kept_mask(args[_MASK_ARGUMENT], kept)
    elif "mask" in kwargs:
        kwargs["mask"] = _kept_mask(kwargs["mask"], kept)
    return tuple(args), kwargs


def _kept_mask(mask: AttentionMask | Array | None, kept: tuple[int, ...]) -> AttentionMask | Array | None:
    if isinstance(mask, AttentionMask):
        return mask.replace(bias=_kept_mask(mask.bias, kept))
    if mask is None or mask.ndim < 4 or mask.shape[1] == 1:
        return mask
    return jnp.take(mask, jnp.asarray(kept), axis=1)  # [b, heads, q, k]


def _projection(dense: Dense, inputs: Array, heads: int) -> Array:
    """A query, key or value projection [..., embed] -> [..., heads, head_dim] with `heads` of its heads: its kernel
    [embed, heads, head_dim] and bias [heads, head_dim] created (at initialisation) as the Dense creates them."""
    features = (heads, *dense.features[1:])
    init = nn.initializers.variance_scaling(dense.kernel_scale, "fan_in", dense.kernel_distribution, in_axis=(0,),
                                            out_axis=(1, 2))
    kernel = dense.param("kernel", nn.with_logical_partitioning(init, dense.kernel_axes),
                         (inputs.shape[-1], *features), dense.param_dtype)
    out = dense_product(jnp.asarray(inputs, dense.dtype), jnp.asarray(kernel, dense.dtype), (inputs.ndim - 1,))
    if not dense.use_bias:
        return out
    bias = dense.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, dense.kernel_axes[1:]), features,
                       dense.param_dtype)
    return out + jnp.asarray(bias, dense.dtype)
