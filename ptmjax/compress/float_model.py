"""The float model that computes what a quantized, fake-quantized or LoRA model computes, with its parameters:
what Hugging Face export writes, and QLoRA's merge (merge in float, then quantize again if wanted).

`float_model(model, params)` peels the adaptations off from the outside in:

- LoRA (`lora(model)`, QLoRA's `lora(quantized(model, weights='nf4'))` too): the model under it is made float
  first, then each update folded into its float kernel (`lora_merge.merge_lora`);
- a quantized model: each integer kernel times its scales, in float32 (the weight-only model's numbers;
  int8 activations are not parameters, so a w8a8 model's float model computes with float activations);
- a fake-quantized model: each targeted kernel as the quantized model would store it, dequantized, which is
  what the fake-quantized model computes with;
- a distillation student's hidden-state projection (`hidden_projection`): left out, as nothing but the
  distillation objective reads it.

Each step says what it did in a note, for the user to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import qwix

from ptmjax.adapt import lora
from ptmjax.adapt.interception import adapted, settings_of
from ptmjax.adapt.lora import LoraSettings
from ptmjax.adapt.lora_merge import without_lora
from ptmjax.compress import fake_quantization, hidden_projection, quantization
from ptmjax.compress.fake_quantization import FakeQuantizationSettings
from ptmjax.compress.quantization import SCALE, QuantizationSettings


def float_model(model: nn.Module, params: Mapping[str, Any]) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """(the float model, its parameters, notes on what was merged or dequantized) of `model` and its unboxed
    `params` (module docstring); a plain model comes back as it is, with no notes."""
    if hidden_projection.settings_of(model):
        under, params, notes = float_model(*hidden_projection.without_projection(model, params))
        return under, params, [*notes, "the distillation's hidden-state projection left out (only training reads it)"]
    if settings := settings_of(model, LoraSettings):
        under, params, notes = float_model(lora.base_model(model), params)
        merged, params = without_lora(adapted(under, settings), params)
        return merged, params, [*notes, "LoRA updates merged into their float kernels"]
    if settings := settings_of(model, QuantizationSettings):
        return quantization.base_model(model), dequantized_params(params, settings), [_note(settings, "quantized")]
    if settings := settings_of(model, FakeQuantizationSettings):
        base = fake_quantization.base_model(model)
        stored = quantization.quantized(base, settings.weights, settings.activations, settings.tile_size,
                                        settings.targets)
        params = dequantized_params(quantization.quantize_params(stored, params), settings)
        return base, params, [_note(settings, "fake-quantized")]
    return model, dict(params), []


def dequantized_params(params: Mapping[str, Any], settings: QuantizationSettings) -> dict[str, Any]:
    """`params` with each stored kernel (integers beside a `kernel_scale`) as float32 integers times scales."""
    out = {key: dequantized_params(value, settings) if isinstance(value, Mapping) else value
           for key, value in params.items()}
    if SCALE in out:
        scale = out.pop(SCALE)
        out["kernel"] = jax.device_get(qwix.dequantize(settings.stored_kernel(out["kernel"], scale, jnp.float32)))
    return out


def _note(settings: QuantizationSettings, kind: str) -> str:
    activations = (f"; its {settings.activations} activations are not kept: the float model computes with float "
                   "activations") if settings.activations else ""
    return f"{kind} {settings.weights} kernels dequantized to float32{activations}"
