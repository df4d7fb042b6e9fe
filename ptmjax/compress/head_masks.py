"""Head masks (Michel et al., 2019): every attention's per-head output scaled by a mask before its output projection.

`head_masked(model)` returns `model` adapted by interception (ptmjax/adapt/interception.py: a subclass of its own
class, so every family, its loss and decoding treat it as the model it was). The output Dense `out` of each
`MultiHeadAttention` (self- and cross-attention, encoder and decoder stacks) gets one more parameter, `head_mask`
[heads] (float32, ones at initialisation, logical axis 'heads'), and multiplies its input, the attention's
context [b, q, heads, head_dim], by it along the heads axis: ξ_h of the paper, so that 0 removes head h's
contribution and dL/dξ_h is the gradient of that parameter.

The masks live in the parameter tree, so every function of the parameters takes them as an input: the family's
loss (`model_api(masked).loss`), its gradient, a sharded jit (they shard as the heads do). `with_masks(masked,
params, masks)` puts a {attention module path: [heads] array} dict into a float model's parameters (ones where
none is given) and `masks_of(params)` reads them back. Scanned layers are refused: a mask per layer needs the
layers' own paths, those of the unscanned twin (`layer_stack.unscanned(model, params)`), which `head_importance`
and `ptmjax prune-heads` take for a scanned model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from ptmjax.adapt import interception
from ptmjax.adapt.interception import adapted
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.dense import Dense

Array = jax.Array

MASK = "head_mask"
OUTPUT = "out"  # MultiHeadAttention's output projection


@dataclasses.dataclass(frozen=True)
class HeadMaskSettings:
    """Head masks have no options: every attention gets one."""

    field: ClassVar[str] = "head_masks"
    class_prefix: ClassVar[str] = "HeadMasked"
    title: ClassVar[str] = "head masks"

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        refuse_scanned(model, "head masks")
        return _Call()


@dataclasses.dataclass
class _Call:
    """A head-masked model's call in progress: scales each attention output projection's input by its mask."""

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if context.method_name != "__call__" or not is_attention_output(module):
            return next_fun(*args, **kwargs)
        context_heads = args[0] if args else kwargs["inputs"]  # [b, q, heads, head_dim]
        mask = module.param(MASK, nn.with_logical_partitioning(nn.initializers.ones, ("heads",)),
                            (context_heads.shape[-2],), jnp.float32)
        return next_fun(context_heads * jnp.asarray(mask, context_heads.dtype)[:, None])

    def finish(self, model: nn.Module) -> None:
        pass


def head_masked(model: nn.Module) -> nn.Module:
    """`model` with a `head_mask` parameter on every attention (module docstring)."""
    return adapted(model, HeadMaskSettings())


def base_model(model: nn.Module) -> nn.Module:
    """The model under a head-masked model."""
    return interception.base_model(model, HeadMaskSettings)


def is_attention_output(module: nn.Module) -> bool:
    """Whether `module` is a MultiHeadAttention's output projection."""
    return isinstance(module, Dense) and module.name == OUTPUT and isinstance(module.parent, MultiHeadAttention)


def refuse_scanned(model: nn.Module, what: str) -> None:
    """Raise if `model` scans its layers: `what` acts on each layer's attention by its own path."""
    if layer_stack.scanning_config(model) is not None:
        raise ValueError(f"{what} need each layer's own attention path, but {type(model).__name__} scans its layers; "
                         "set its config's scan_layers = False, or take its twin layer_stack.unscanned(model, params)")


def with_masks(masked: nn.Module, params: Any, masks: Mapping[str, Any] | None = None) -> dict:
    """The parameters of the head-masked model `masked` from its float model's `params` (unboxed): `masks`
    ({attention module path, e.g. 'encoder/layers_0/attention': [heads]}) where given, ones elsewhere."""
    full = traverse_util.flatten_dict(model_api(masked).init_around(jax.random.key(0), params), sep="/")
    for path, mask in (masks or {}).items():
        key = f"{path}/{OUTPUT}/{MASK}"
        if key not in full:
            known = ", ".join(list(masks_of(traverse_util.unflatten_dict(full, sep="/")))[:4])
            raise ValueError(f"head mask for {path!r}: no attention has that path (paths: {known}, ...); give "
                             "attention module paths, e.g. 'encoder/layers_0/attention'")
        if jnp.shape(mask) != full[key].shape:
            raise ValueError(f"head mask for {path!r} has shape {jnp.shape(mask)}; that attention has "
                             f"{full[key].shape[0]} heads: give one value per head")
        full[key] = jnp.asarray(mask, jnp.float32)
    return traverse_util.unflatten_dict(full, sep="/")


def masks_of(params: Any) -> dict[str, Array]:
    """{attention module path: its [heads] mask} of a head-masked model's parameters (or of their gradient)."""
    suffix = f"/{OUTPUT}/{MASK}"
    flat = traverse_util.flatten_dict(params, sep="/")
    return {path[: -len(suffix)]: value for path, value in flat.items() if path.endswith(suffix)}
