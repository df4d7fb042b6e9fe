"""Folding trained LoRA updates into their kernels: the base model's parameters, for export and plain inference."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.interception import settings_of
from ptmjax.adapt.lora import LoraSettings, base_model

Array = jax.Array


def merge_lora(params: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """The parameters of `lora.base_model(model)`: each kernel W with LoRA becomes W + (alpha / r) * A @ B, and the
    `lora_a` / `lora_b` leaves go.

    `params` are the LoRA model `model`'s unboxed parameters (with or without a top 'params' key), scanned or not.
    """
    settings = getattr(model, "lora", None)
    if not isinstance(settings, LoraSettings):
        raise ValueError(
            f"merge_lora needs the LoRA model of the parameters (ptmjax.adapt.lora.lora), got {type(model).__name__}."
        )
    return _merged(params, settings.scale)


def without_lora(model: nn.Module, params: Mapping[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """The plain model and its parameters, LoRA folded in, when `model` is a LoRA model; else both as they are."""
    if settings_of(model, LoraSettings) is None:
        return model, params
    return base_model(model), merge_lora(params, model)


def _merged(tree: Mapping[str, Any], scale: float) -> dict[str, Any]:
    out = {key: _merged(value, scale) if isinstance(value, Mapping) else value for key, value in tree.items()}
    if "lora_a" in out:
        if isinstance(out["lora_a"], nn.Partitioned):
            raise ValueError("merge_lora needs unboxed parameters; pass nn.unbox(params).")
        lora_a, lora_b = out.pop("lora_a"), out.pop("lora_b")
        out["kernel"] = _with_update(out["kernel"], lora_a, lora_b, scale)
    return out


def _with_update(kernel: Array, lora_a: Array, lora_b: Array, scale: float) -> Array:
    """kernel [lead..., in..., out...] + scale * A [lead..., in..., r] @ B [lead..., r, out...] (lead: scanned axes)."""
    lead = lora_a.ndim + lora_b.ndim - 2 - kernel.ndim
    rank = lora_a.shape[-1]
    stacks = math.prod(kernel.shape[:lead])
    a = jnp.reshape(lora_a, (stacks, -1, rank)).astype(jnp.float32)
    b = jnp.reshape(lora_b, (stacks, rank, -1)).astype(jnp.float32)
    update = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(kernel.shape)
    return (kernel.astype(jnp.float32) + scale * update).astype(kernel.dtype)
