"""Quantization-aware training: a model whose Dense products use their kernels (and inputs) quantized and
dequantized in the forward pass, with straight-through gradients to the float weights.

`fake_quantized(model, weights='int8', activations=None, tile_size=None, targets=LAYER_DENSES)` returns `model`
adapted by interception (ptmjax/adapt/interception.py), like `quantization.quantized`, with the same scheme
(quantization_scheme.py: int8, int4, nf4, TernaryBERT's ternary, binary; per-channel or per-tile scales; int8
activations per token). Its parameters are the float model's, so it trains from a float checkpoint
(`train.init_checkpoint`) as the float model does, with distillation from a float teacher too (TernaryBERT).
Each targeted Dense computes its product, as the float Dense does (`dense.dense_product`), with

- the kernel w replaced by w_q = dequantize(quantize(w)), the numbers the quantized model stores;
- with `activations`, its input x by x_q = dequantize(quantize(x)) per token;

and the straight-through estimator (Bengio et al., 2013) in the backward pass: dL/dw = dL/dw_q, dL/dx =
dL/dx_q, the scales' and roundings' dependence on w ignored. The forward value is w_q exactly
(stop_gradient(w_q) + (w - stop_gradient(w)), whose second term is 0), so a fake-quantized model computes what
the float model computes on the dequantized kernels, and `ptmjax quantize` of a trained run stores the very
integers it trained with (`quantize_folder` reads the scheme from the run).
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
from ptmjax.layers.dense import Dense, dense_product

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FakeQuantizationSettings(QuantizationScheme):
    """The fake-quantized model's scheme (quantization_scheme.QuantizationScheme), simulated on float weights."""

    function: ClassVar[str] = "fake_quantized"
    field: ClassVar[str] = "fake_quantization"
    class_prefix: ClassVar[str] = "FakeQuantized"
    title: ClassVar[str] = "fake quantization"

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        return _Call(self, DenseTargets(self.targets, "fake_quantized targets"))


@dataclasses.dataclass
class _Call:
    """The fake-quantized model's call in progress: its settings and the Dense modules it targets."""

    settings: FakeQuantizationSettings
    targets: DenseTargets

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        """A targeted Dense's product on its fake-quantized kernel and inputs; every other call unchanged."""
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, Dense) or self.targets.match(module) is None:
            return next_fun(*args, **kwargs)
        return _fake_quantized_product(module, args[0] if args else kwargs["inputs"], self.settings)

    def finish(self, model: nn.Module) -> None:
        self.targets.check(model)


def fake_quantized(
    model: nn.Module, weights: str = "int8", activations: str | None = None, tile_size: int | None = None,
    targets: str = LAYER_DENSES,
) -> nn.Module:
    """`model` trained with the Dense kernels whose module path `targets` fully matches fake-quantized (module
    docstring)."""
    refuse_lora_under(model, "fake_quantized")
    return adapted(model, FakeQuantizationSettings(weights, activations, tile_size, targets))


def base_model(model: nn.Module) -> nn.Module:
    """The float model under a fake-quantized model."""
    return interception.base_model(model, FakeQuantizationSettings)


def straight_through(x: Array, quantized: Array) -> Array:
    """`quantized` in value, the identity of `x` in gradient."""
    return jax.lax.stop_gradient(quantized) + (x - jax.lax.stop_gradient(x))


def _fake_quantized_product(dense: Dense, inputs: Array, settings: FakeQuantizationSettings) -> Array:
    """`dense(inputs)` on its fake-quantized kernel (and inputs), with straight-through gradients."""
    axis = dense.contracted_axes(inputs.ndim)
    kernel = jnp.asarray(dense.kernel_param(tuple(inputs.shape[a] for a in axis)), jnp.float32)
    kernel = straight_through(kernel, qwix.dequantize(settings.quantize_kernel(kernel, len(axis))))
    x = jnp.asarray(inputs, dense.dtype)
    if settings.activations is not None:
        x = straight_through(x, qwix.dequantize(settings.quantize_inputs(x, axis)))
    return dense.with_bias(dense_product(x, jnp.asarray(kernel, dense.dtype), axis))
