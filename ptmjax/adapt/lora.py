"""LoRA (Hu et al., 2021): a trainable low-rank update `scale * dropout(x) @ A @ B` beside chosen Dense kernels.

`lora(model, rank, alpha, dropout, targets)` returns the model as a subclass of
its own class (so `model_api`'s family lookup, gin and decoding treat it as the
model it was) whose entry methods (`__call__`, `encode`, `decode`,
`hidden_states`, ...: every public method, so decoding's `method=` calls too)
run under a Flax method interceptor. The interceptor adds the update to each
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

import contextvars
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.dense import Dense

Array = jax.Array

LORA_PARAMS = r"^(.*/)?lora_[ab]$"  # unboxed paths (tree_paths.path_name), e.g. 'decoder/.../query/lora_a'
QUERY_AND_VALUE = r".*attention/(query|value)"  # every family's self- and cross-attention query and value projections


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """rank r of the update, alpha (scale = alpha / r), dropout rate on the input, targets (module-path regex)."""

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


@dataclasses.dataclass
class _Call:
    """The LoRA model call in progress: its settings, whether dropout is on, and the Dense paths it has seen."""

    settings: LoraSettings
    enable_dropout: bool
    seen: list[str] = dataclasses.field(default_factory=list)
    targeted: int = 0


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("ptmjax_lora_call", default=None)


def lora(
    model: nn.Module, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0, targets: str = QUERY_AND_VALUE
) -> nn.Module:
    """`model` with LoRA on the Dense layers whose module path `targets` fully matches (see the module docstring)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"lora needs a Flax module to adapt, got {type(model).__name__}; e.g. lora.model = @GPT2()")
    if isinstance(model, _LoraModel):
        raise ValueError(f"{type(model).__name__} already has LoRA; apply lora to the base model once.")
    return _lora_class(type(model))(**_fields(model, type(model)), lora=LoraSettings(rank, alpha, dropout, targets))


def base_model(model: nn.Module) -> nn.Module:
    """The plain model under a LoRA model (for merged parameters: `lora_merge.merge_lora`)."""
    if not isinstance(model, _LoraModel):
        raise ValueError(f"{type(model).__name__} is not a LoRA model (see ptmjax.adapt.lora.lora).")
    base = type(model).__bases__[1]  # (_LoraModel, the base class)
    return base(**_fields(model, base))


def _fields(model: nn.Module, cls: type[nn.Module]) -> dict[str, Any]:
    """`model`'s values of the constructor fields of `cls` (not Flax's parent and name)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")]
    return {name: getattr(model, name) for name in names}


class _LoraModel:
    """Marks the classes `_lora_class` makes."""

    lora: LoraSettings


@functools.cache
def _lora_class(base: type[nn.Module]) -> type[nn.Module]:
    """`base` subclassed with a `lora: LoraSettings` field and every entry method intercepted (one class per base)."""
    namespace: dict[str, Any] = {
        "__module__": __name__, "__annotations__": {"lora": LoraSettings},
        "lora": dataclasses.field(kw_only=True),
    }  # fmt: skip
    for name in _entry_methods(base):
        namespace[name] = _intercepted(getattr(base, name))
    return type(f"Lora{base.__name__}", (_LoraModel, base), namespace)


def _entry_methods(base: type[nn.Module]) -> set[str]:
    """`__call__` and the public methods `base` defines (not nn.Module's, not setup)."""
    names = set()
    for klass in base.__mro__:
        if klass is nn.Module:
            break
        names |= {
            name for name, value in vars(klass).items()
            if inspect.isfunction(value) and (name == "__call__" or not name.startswith("_")) and name != "setup"
        }  # fmt: skip
    return names


def _intercepted(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` run with the LoRA interceptor when it is the call that enters the model."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def entry(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _CURRENT.get() is not None:  # called by another intercepted method: already intercepted
            return method(self, *args, **kwargs)
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        call = _Call(self.lora, bool(arguments.arguments.get("enable_dropout", False)))
        token = _CURRENT.set(call)
        try:
            with nn.intercept_methods(_add_lora):
                out = method(self, *args, **kwargs)
        finally:
            _CURRENT.reset(token)
        if self.is_initializing() and call.seen and not call.targeted:
            raise ValueError(
                f"lora targets={call.settings.targets!r} match no Dense module of {type(self).__name__} (its paths: "
                f"{', '.join(call.seen[:4])}, ...); give a regex that fully matches the paths to adapt."
            )
        return out

    return entry


def _add_lora(next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: nn.module.InterceptorContext) -> Any:
    """The interceptor: a targeted Dense's output plus its LoRA update; every other call unchanged."""
    out = next_fun(*args, **kwargs)
    module, call = context.module, _CURRENT.get()
    if call is None or context.method_name != "__call__" or not isinstance(module, Dense):
        return out
    path = "/".join(module.scope.path)
    call.seen.append(path)
    if not re.fullmatch(call.settings.targets, path):
        return out
    call.targeted += 1
    return out + _update(module, args[0] if args else kwargs["inputs"], call).astype(out.dtype)


def _update(dense: Dense, inputs: Array, call: _Call) -> Array:
    """scale * dropout(inputs) @ A @ B with A [in..., r] and B [r, out...], created in the Dense's scope."""
    settings = call.settings
    axis = tuple(a % inputs.ndim for a in ((dense.axis,) if isinstance(dense.axis, int) else dense.axis))
    in_shape, n_in = tuple(inputs.shape[a] for a in axis), len(axis)
    init_a = nn.initializers.variance_scaling(
        1 / 3, "fan_in", "uniform", in_axis=tuple(range(n_in)), out_axis=(n_in,)
    )  # fmt: skip
    a_axes, b_axes = (*dense.kernel_axes[:n_in], None), (None, *dense.kernel_axes[n_in:])
    lora_a = dense.param(
        "lora_a", nn.with_logical_partitioning(init_a, a_axes), (*in_shape, settings.rank), dense.param_dtype
    )  # fmt: skip
    lora_b = dense.param(
        "lora_b", nn.with_logical_partitioning(nn.initializers.zeros, b_axes), (settings.rank, *dense.features),
        dense.param_dtype,
    )  # fmt: skip
    x = jnp.asarray(inputs, dense.dtype)
    if call.enable_dropout and settings.dropout > 0:
        keep = jax.random.bernoulli(dense.make_rng("dropout"), 1.0 - settings.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - settings.dropout), 0).astype(x.dtype)
    low = jax.lax.dot_general(x, jnp.asarray(lora_a, dense.dtype), ((axis, tuple(range(n_in))), ((), ())))
    update = jax.lax.dot_general(low, jnp.asarray(lora_b, dense.dtype), (((low.ndim - 1,), (0,)), ((), ())))
    return update * jnp.asarray(settings.scale, dense.dtype)

