"""Prefix tuning (Li and Liang, 2021): trainable keys and values of n virtual tokens before every self-attention's.

`prefix_tuning(model, length, hidden)` returns the model adapted by
interception (`ptmjax.adapt.interception`). Each layer stack (T5's and BART's
encoder and decoder, GPT-2's and the BERT family's layers) gets its prefixes
[layers, 2 (key, value), heads, n, head_dim] when its module's stack method
(`entries.STACKS`) is called, before any layer (so rematerialised
layers read them too), created in the stack module's scope:

- `hidden` set (training, as the paper): an embedding `prefix_embedding`
  [n, d_model] through an MLP, tanh(E @ `prefix_wi` + `prefix_wi_bias`) @
  `prefix_wo` + `prefix_wo_bias`, hidden width `hidden` (Hugging Face PEFT's
  prefix_projection);
- `hidden=None`: the prefixes are the parameter `prefix_keys_values` itself
  (the paper keeps only these after training; `fold_prefixes` computes them).

Every self-attention (`MultiHeadAttention.attended`, the hook in
ptmjax/layers/attention.py) then attends to its layer's n prefix keys and
values before its own; T5's and BART's cross-attention is left alone (the
paper prefixes the encoder and the decoder, not the encoder output). The
prefix is visible to every query (padding and causality mask only real keys)
and gets zero attention bias: no relative position bias in T5 either, as it
has no position (the layer's mask is folded into one bias for that, also for
'pallas_tpu_flash', which then gets it as its `ab`). Decoding: the hook sees the whole key/value cache, so the
prefix sits before the cache and cached steps need no change. ALBERT's shared layers
share their prefixes (one per parameter set). Scanned layers are refused.
`PREFIX_PARAMS` matches the prefix parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.interception import adapted
from ptmjax.families.entries import runs_stack
from ptmjax.layers import precision
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.common import dtype_kwargs
from ptmjax.models.config import check_positive_ints

Array = jax.Array

PREFIX_PARAMS = r"^(.*/)?prefix_(embedding|wi|wi_bias|wo|wo_bias|keys_values)$"  # e.g. 'encoder/prefix_wo'
KEYS_VALUES_AXES = ("layers", None, "heads", "prompt", "kv")  # [layers, 2, heads, n, head_dim]


@dataclasses.dataclass(frozen=True)
class PrefixSettings:
    """length n of the prefixes and the MLP's hidden width (None: the prefixes are parameters themselves)."""

    field: ClassVar[str] = "prefix_tuning"
    class_prefix: ClassVar[str] = "PrefixTuned"
    title: ClassVar[str] = "prefix tuning"

    length: int = 10
    hidden: int | None = 512

    def __post_init__(self) -> None:
        check_positive_ints(self, "length", *(() if self.hidden is None else ("hidden",)))

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        return _Call(self)


@dataclasses.dataclass
class _Call:
    """A prefix model call in progress: each stack's prefixes, by the stack's module path."""

    settings: PrefixSettings
    prefixes: dict[tuple[str, ...], Array] = dataclasses.field(default_factory=dict)

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if runs_stack(module, context.method_name) and module.scope.path not in self.prefixes:
            if module.config.scan_layers:
                raise ValueError(
                    f"prefix tuning needs unscanned layers (each its own prefix); set {type(module.config).__name__}"
                    ".scan_layers = False."
                )
            self.prefixes[module.scope.path] = _stack_prefixes(module, module.config, self.settings)
        out = next_fun(*args, **kwargs)
        if not isinstance(module, MultiHeadAttention) or context.method_name != "attended" or module.cross_attention:
            return out
        *stack_path, layer, _ = module.scope.path
        if tuple(stack_path) not in self.prefixes:
            raise ValueError(
                f"prefix tuning knows no layer stack at {'/'.join(stack_path)!r}; it adapts T5, BART, GPT-2 and the "
                "BERT family (ptmjax.families.entries)."
            )
        prefix = self.prefixes[tuple(stack_path)][int(layer.removeprefix("layers_"))]  # [2, heads, n, head_dim]
        return with_prefix(*out, prefix)

    def finish(self, model: nn.Module) -> None:
        if model.is_initializing() and not self.prefixes:
            raise ValueError(
                f"prefix tuning found no layer stack in {type(model).__name__}; it adapts T5, BART, GPT-2 and the "
                "BERT family."
            )


def prefix_tuning(model: nn.Module, length: int = 10, hidden: int | None = 512) -> nn.Module:
    """`model` with trainable attention prefixes of `length` (see the module docstring)."""
    return adapted(model, PrefixSettings(length, hidden))


def with_prefix(key: Array, value: Array, mask: AttentionMask, prefix: Array) -> tuple[Array, Array, AttentionMask]:
    """key and value [b, h, k, d] with prefix [2, h, n, d] in front; the mask folded into a bias [.., q, k]
    with n zeros in front (a structured mask cannot show the prefix to every query)."""
    batch, n = key.shape[0], prefix.shape[2]
    key, value = (
        jnp.concatenate([jnp.broadcast_to(p[None].astype(x.dtype), (batch, *p.shape)), x], axis=2)
        for p, x in ((prefix[0], key), (prefix[1], value))
    )
    bias = mask.dense_bias(key.dtype)
    if bias is not None:
        bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(n, 0)])
    return key, value, AttentionMask(bias)


def fold_prefixes(params: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """The parameters of `model` with `hidden=None`: each stack's MLP replaced by the prefixes it computes."""
    settings = getattr(model, "prefix_tuning", None)
    if not isinstance(settings, PrefixSettings) or settings.hidden is None:
        raise ValueError(
            f"fold_prefixes needs a prefix tuning model with an MLP (hidden set), got {type(model).__name__}."
        )
    return _folded(params)


def _folded(tree: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: _folded(value) if isinstance(value, Mapping) else value for key, value in tree.items()}
    if "prefix_embedding" in out:
        mlp = {name: out.pop(f"prefix_{name}") for name in ("embedding", "wi", "wi_bias", "wo", "wo_bias")}
        out["prefix_keys_values"] = _through_mlp(mlp, jnp.float32)
    return out


def _stack_prefixes(stack: nn.Module, config: Any, settings: PrefixSettings) -> Array:
    """[layers, 2, heads, n, head_dim] of the stack, its parameters created in the stack's scope."""
    depth = _depth(stack, config)
    dtypes = dtype_kwargs(config)
    n, heads, head_dim = settings.length, config.num_heads, config.head_dim
    init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # PyTorch's Linear, as Hugging Face PEFT

    def param(name: str, initializer: Callable[..., Array], shape: tuple[int, ...], axes: tuple) -> Array:
        return stack.param(name, nn.with_logical_partitioning(initializer, axes), shape, dtypes["param_dtype"])

    if settings.hidden is None:
        shape = (depth, 2, heads, n, head_dim)
        return jnp.asarray(param("prefix_keys_values", nn.initializers.normal(1.0), shape, KEYS_VALUES_AXES),
                           dtypes["dtype"])
    out_shape, zeros = (depth, 2, heads, head_dim), nn.initializers.zeros
    wo_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0, out_axis=(1, 2, 3, 4))
    mlp = {
        "embedding": param("prefix_embedding", nn.initializers.normal(1.0), (n, config.d_model), ("prompt", "embed")),
        "wi": param("prefix_wi", init, (config.d_model, settings.hidden), ("embed", "mlp")),
        "wi_bias": param("prefix_wi_bias", zeros, (settings.hidden,), ("mlp",)),
        "wo": param("prefix_wo", wo_init, (settings.hidden, *out_shape), ("mlp", "layers", None, "heads", "kv")),
        "wo_bias": param("prefix_wo_bias", zeros, out_shape, ("layers", None, "heads", "kv")),
    }
    return _through_mlp(mlp, dtypes["dtype"])


def _through_mlp(mlp: Mapping[str, Array], dtype: Any) -> Array:
    """tanh(E @ wi + b_i) @ wo + b_o, as [layers, 2, heads, n, head_dim]."""
    p = {name: jnp.asarray(value, dtype) for name, value in mlp.items()}
    hidden = jnp.tanh(precision.matmul(p["embedding"], p["wi"]) + p["wi_bias"])  # [n, hidden]
    return precision.einsum("nm,mlchd->lchnd", hidden, p["wo"]) + p["wo_bias"][:, :, :, None, :]


def _depth(stack: nn.Module, config: Any) -> int:
    """The number of layer parameter sets of the stack at `stack`'s path (the config's stack whose path ends it)."""
    path = stack.scope.path
    matches = [p for p in config.layer_stacks() if path[len(path) - len(p) :] == p]
    if not matches:
        raise ValueError(f"prefix tuning: no layer stack of {type(config).__name__} is at {'/'.join(path)!r}.")
    return config.layer_stacks()[max(matches, key=len)]
