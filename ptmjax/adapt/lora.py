"""LoRA (Hu et al., 2021): a trainable low-rank update `scale * dropout(x) @ A @ B` beside chosen Dense kernels.

`lora(model, rank, alpha, dropout, targets)` returns the model adapted by
interception (`ptmjax.adapt.interception`: a subclass of its own class whose
entry methods, decoding's `method=` calls too, run under a Flax method
interceptor). The interceptor adds the update to each
`ptmjax.layers.dense.Dense` whose module path ('/'-joined, e.g.
'encoder/layers_0/attention/query'; scanned stacks: '.../layers/...')
`targets` matches in full. Every family computes its projections with that
Dense, so one interceptor serves them all, scanned or not.

Parameters: beside a targeted `kernel` [in..., out...] the Dense gets `lora_a`
[in..., rank] (uniform in ±1/sqrt(fan_in), as Hugging Face PEFT) and `lora_b`
[rank, out...] (zeros, so a fresh LoRA model computes exactly what the base
model does), named by the kernel's logical axes and None for the rank, so the
partitioning rules shard them like their kernel. `LORA_PARAMS` matches exactly
their paths, for `train.trainable = [LORA_PARAMS]`; `lora_merge.merge_lora`
folds them into the kernels. scale = alpha / rank. LoRA dropout (on the
projection's input) is active when the call that enters the model has
`enable_dropout=True`.

Why not qwix (Google's LoraProvider, tried at 0.1.8): its LoRA dropout ignores
the model's `enable_dropout` and always draws, so with dropout > 0 evaluation
and decoding fail ("query needs PRNG for 'dropout'") or would be random; every
`apply_lora_to_model` call makes a new class, so two equal LoRA models are
unequal (a jit static argument recompiles); and its B flattens the output axes
(a [rank, heads*kv] B named by 'heads' alone). Targeting, logical axes,
decoding and scanned layers did work there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt import interception
from ptmjax.adapt.interception import DenseTargets, adapted
from ptmjax.layers import precision
from ptmjax.layers.dense import Dense

Array = jax.Array

LORA_PARAMS = r"^(.*/)?lora_[ab]$"  # unboxed paths (tree_paths.path_name), e.g. 'decoder/.../query/lora_a'
QUERY_AND_VALUE = r".*attention/(query|value)"  # every family's self- and cross-attention query and value projections


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """rank r of the update, alpha (scale = alpha / r), dropout rate on the input, targets (module-path regex)."""

    field: ClassVar[str] = "lora"
    class_prefix: ClassVar[str] = "Lora"
    title: ClassVar[str] = "LoRA"

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = QUERY_AND_VALUE

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora rank={self.rank!r} must be a positive int (e.g. 8).")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout={self.dropout!r} must be in [0, 1).")
        try:
            re.compile(self.targets)
        except re.error as error:
            raise ValueError(f"lora targets={self.targets!r} is not a valid regex ({error}).") from None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        return _Call(self, bool(arguments.get("enable_dropout", False)), DenseTargets(self.targets, "lora targets"))


@dataclasses.dataclass
class _Call:
    """The LoRA model call in progress: its settings, whether dropout is on, and the Dense modules it targets."""

    settings: LoraSettings
    enable_dropout: bool
    targets: DenseTargets

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        """A targeted Dense's output plus its LoRA update; every other call unchanged."""
        out = next_fun(*args, **kwargs)
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, Dense):
            return out
        if self.targets.match(module) is None:
            return out
        return out + _update(module, args[0] if args else kwargs["inputs"], self).astype(out.dtype)

    def finish(self, model: nn.Module) -> None:
        self.targets.check(model)


def lora(
    model: nn.Module, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0, targets: str = QUERY_AND_VALUE
) -> nn.Module:
    """`model` with LoRA on the Dense layers whose module path `targets` fully matches (see the module docstring)."""
    return adapted(model, LoraSettings(rank, alpha, dropout, targets))


def base_model(model: nn.Module) -> nn.Module:
    """The plain model under a LoRA model (for merged parameters: `lora_merge.merge_lora`)."""
    return interception.base_model(model, LoraSettings)


def _update(dense: Dense, inputs: Array, call: _Call) -> Array:
    """scale * dropout(inputs) @ A @ B with A [in..., r] and B [r, out...], created in the Dense's scope."""
    settings = call.settings
    axis = tuple(a % inputs.ndim for a in ((dense.axis,) if isinstance(dense.axis, int) else dense.axis))
    in_shape, n_in = tuple(inputs.shape[a] for a in axis), len(axis)
    init_a = nn.initializers.variance_scaling(
        1 / 3, "fan_in", "uniform", in_axis=tuple(range(n_in)), out_axis=(n_in,)
    )
    a_axes, b_axes = (*dense.kernel_axes[:n_in], None), (None, *dense.kernel_axes[n_in:])
    lora_a = dense.param(
        "lora_a", nn.with_logical_partitioning(init_a, a_axes), (*in_shape, settings.rank), dense.param_dtype
    )
    lora_b = dense.param(
        "lora_b", nn.with_logical_partitioning(nn.initializers.zeros, b_axes), (settings.rank, *dense.features),
        dense.param_dtype,
    )
    x = jnp.asarray(inputs, dense.dtype)
    if call.enable_dropout and settings.dropout > 0:
        keep = jax.random.bernoulli(dense.make_rng("dropout"), 1.0 - settings.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - settings.dropout), 0).astype(x.dtype)
    low = precision.dot_general(x, jnp.asarray(lora_a, dense.dtype), ((axis, tuple(range(n_in))), ((), ())))
    update = precision.dot_general(low, jnp.asarray(lora_b, dense.dtype), (((low.ndim - 1,), (0,)), ((), ())))
    return update * jnp.asarray(settings.scale, dense.dtype)

