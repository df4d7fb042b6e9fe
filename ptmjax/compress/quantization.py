"""Post-training quantization of a model's Dense kernels: int8, int4, nf4, ternary or binary weights, optionally int8
activations.

`quantized(model, weights='int8', activations=None, tile_size=None, targets=LAYER_DENSES)` returns `model`
adapted by interception (ptmjax/adapt/interception.py: a subclass of its own class, so every family, decoding,
`ptmjax.load`, `eval` and `infer` treat it as the model it was). Each `ptmjax.layers.dense.Dense` whose module
path ('/'-joined, e.g. 'encoder/layers_0/attention/query'; scanned stacks '.../layers/...') `targets` matches
in full holds its kernel quantized:

- `kernel`: the integers of `weights` ('int8'; 'int4'; 'nf4' indices, ternary and binary as int4), the float
  kernel's shape and logical axes, so the partitioning rules shard it as before;
- `kernel_scale`: float32, one scale per output channel (the kernel's shape with its contracted dims 1), or
  with `tile_size` one per tile of `tile_size` weights along the last contracted dim (sub-channel scales);
  named by the kernel's output axes (None for the contracted ones).

The integers and scales are quantization_scheme.py's. With `activations='int8'` (w8a8) each product also
quantizes its input per row (dynamic range: the absmax over the contracted dims of each token, at run time)
and multiplies integers with integer accumulation; without it the kernel is dequantized into a float
product. The numerics are qwix's (`qwix.quantize`, `qwix.dot_general` on `qwix.QArray`s).

A fresh `init` quantizes the float initialisation; `quantize_params(model, params)` quantizes a float model's
parameters (the targeted kernels; every other parameter is kept as it is); the quantized model refuses a
float kernel in a call that cannot change its parameters; `float_model.dequantized_params` is the way back, the
float model's parameters that compute what the weight-only quantized model computes. LoRA goes on top of a
quantized model (QLoRA: `lora(quantized(model, weights='nf4', tile_size=64))`), not under it.

Why not qwix's model interception (`qwix.quantize_model` with a `PtqProvider`, 0.1.8): its quantized
parameters are `WithAux` wrappers (a `QArray` with how it was quantized) in the parameter tree, which the
checkpoints, partitioning rules, `ptmjax inspect` and Hugging Face export would each have to learn; here
they stay arrays with logical axes, and the interception is the one every PEFT method already uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import qwix

from ptmjax.adapt import interception
from ptmjax.adapt.interception import DenseTargets, adapted
from ptmjax.compress.quantization_scheme import LAYER_DENSES, QuantizationScheme, refuse_lora_under
from ptmjax.families.model_api import model_api
from ptmjax.layers.dense import Dense

Array = jax.Array

SCALE = "kernel_scale"


@dataclasses.dataclass(frozen=True)
class QuantizationSettings(QuantizationScheme):
    """The quantized model's scheme (quantization_scheme.QuantizationScheme): its kernels stored as integers."""

    field: ClassVar[str] = "quantization"
    class_prefix: ClassVar[str] = "Quantized"
    title: ClassVar[str] = "quantization"

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        return _Call(self, DenseTargets(self.targets, "quantized targets"))


@dataclasses.dataclass
class _Call:
    """The quantized model's call in progress: its settings and the Dense modules it targets."""

    settings: QuantizationSettings
    targets: DenseTargets

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        """A targeted Dense's product with its quantized kernel; every other call unchanged."""
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, Dense):
            return next_fun(*args, **kwargs)
        path = self.targets.match(module)
        if path is None:
            return next_fun(*args, **kwargs)
        return _quantized_product(module, args[0] if args else kwargs["inputs"], self.settings, path)

    def finish(self, model: nn.Module) -> None:
        self.targets.check(model)


def quantized(
    model: nn.Module, weights: str = "int8", activations: str | None = None, tile_size: int | None = None,
    targets: str = LAYER_DENSES,
) -> nn.Module:
    """`model` with the Dense kernels whose module path `targets` fully matches quantized (module docstring)."""
    refuse_lora_under(model, "quantized")
    return adapted(model, QuantizationSettings(weights, activations, tile_size, targets))


def base_model(model: nn.Module) -> nn.Module:
    """The float model under a quantized model."""
    return interception.base_model(model, QuantizationSettings)


def quantize_params(model: nn.Module, params: Any) -> Any:
    """The parameters of the quantized `model` from its float model's `params` (unboxed): each targeted kernel
    quantized, with its scale beside it; every other parameter as given. Jit it with the quantized model's
    shardings to quantize a sharded model in place."""
    return model_api(model).init_around(jax.random.key(0), params)


def _quantized_product(dense: Dense, inputs: Array, settings: QuantizationSettings, path: str) -> Array:
    """`dense(inputs)` with its kernel quantized: quantized in place first if it is still float."""
    axis = dense.contracted_axes(inputs.ndim)
    kernel = dense.kernel_param(tuple(inputs.shape[a] for a in axis))
    if jnp.issubdtype(kernel.dtype, jnp.floating):
        if not dense.is_mutable_collection("params"):
            raise ValueError(f"{path} holds a float kernel in a quantized model; quantize the float model's "
                             "parameters first (ptmjax.compress.quantization.quantize_params, or `ptmjax quantize`)")
        kernel, scale = _store_quantized(dense, kernel, len(axis), settings)
    else:
        scale = dense.get_variable("params", SCALE)
        scale = scale.unbox() if isinstance(scale, nn.Partitioned) else scale
    weight = settings.stored_kernel(kernel, scale, dense.dtype)
    x = jnp.asarray(inputs, dense.dtype)
    if settings.activations is not None:
        x = settings.quantize_inputs(x, axis)
    dimensions = ((axis, tuple(range(len(axis)))), ((), ()))
    out = qwix.dot_general(x, weight, dimensions, preferred_element_type=dense.dtype)
    return dense.with_bias(jnp.asarray(out, dense.dtype))


def _store_quantized(dense: Dense, kernel: Array, contracted: int, settings: QuantizationSettings) -> tuple:
    """Replaces `dense`'s float kernel by its integers and adds their scales, boxed as the kernel was."""
    quantized_kernel = settings.quantize_kernel(kernel, contracted)
    scale_axes = (None,) * contracted + tuple(dense.kernel_axes[contracted:])
    box = dense.get_variable("params", "kernel")
    integers = settings.stored_integers(quantized_kernel)
    for name, value, names in (("kernel", integers, box.names if isinstance(box, nn.Partitioned)
                                else None), (SCALE, quantized_kernel.scale, scale_axes)):
        dense.put_variable("params", name, box.replace(value=value, names=names) if isinstance(
            box, nn.Partitioned) else value)
    return integers, quantized_kernel.scale
