"""How a Dense's kernel and inputs are quantized: the numerics that post-training quantization
(`quantization.py`) stores and quantization-aware training (`fake_quantization.py`) simulates.

A `QuantizationScheme` names the weights' type, the activations' (None: weight-only), the sub-channel tile size
(None: one scale per output channel; else one per `tile_size` weights along the last contracted dim) and the
Dense module paths it applies to (a regex). Kernels are [in..., out...], their first dims contracted.

Weights, each integer q times a float32 scale s per channel or tile:

- 'int8' / 'int4': symmetric absmax (Q8BERT's): s = max |w| / q_max (127 / 7), q the nearest integer of w / s.
  (qwix's default bound is q_max + 1/2, which puts each channel's largest magnitude exactly on a rounding tie,
  so that a negative one becomes -q_max - 1 or -q_max as float rounding upstream falls; with int8 activations
  that made a sharded model's logits differ from one device's by most of the quantization error. Here that
  weight is q_max exactly.)
- 'nf4': QLoRA's 4-bit NormalFloat: q indexes the 16 quantiles of a normal distribution scaled to [-1, 1],
  s = max |w|, the weight q's quantile times s (Dettmers et al., 2023; qwix's table). qwix holds q as uint4,
  which Orbax cannot save: a checkpoint stores q - 8 as int4 (`stored_integers`, `stored_kernel`).
- 'ternary': TernaryBERT's (TWN) q in {-1, 0, 1}: q = sign(w) where |w| > Δ = 0.7 mean |w|, else 0;
  s = the mean of |w| over those weights (Zhang et al., 2020; Li and Liu, 2016).
- 'binary': BinaryBERT's (BWN) q in {-1, 1}: q = 1 where w >= 0, else -1; s = mean |w|.

A channel or tile of zeros (a pruned row) gets scale 0 and integers 0. Ternary and binary integers are
stored as int4, whose range holds them. Activations ('int8') are quantized per row of the product's input
(per token: the absmax over the contracted dims), at run time. The numbers are qwix's `QArray`s
(`qwix.quantize`, `qwix.dequantize`, `qwix.dot_general`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import qwix

from ptmjax.adapt.interception import settings_of
from ptmjax.adapt.lora import LoraSettings

Array = jax.Array

WEIGHT_TYPES = ("int8", "int4", "nf4", "ternary", "binary")
ACTIVATION_TYPES = {"int8": jnp.int8}
Q_MAX = {"int8": 127, "int4": 7}
INTEGER_DTYPES = {"int8": jnp.int8, "int4": jnp.int4}
NF4_OFFSET = 8  # a stored nf4 index is q - 8, an int4
TWN_THRESHOLD = 0.7  # Δ = 0.7 mean |w| (Li and Liu's approximation of the optimal ternary threshold)
LAYER_DENSES = r"(.*/)?layers(_\d+)?/.*"  # every Dense inside a layer stack: not embeddings or output heads


@dataclasses.dataclass(frozen=True)
class QuantizationScheme:
    """The weights' type (WEIGHT_TYPES), the activations' (None: weight-only), the sub-channel tile size (None:
    one scale per output channel) and the Dense module paths quantized (a regex)."""

    function: ClassVar[str] = "quantized"  # the function a user calls, for messages

    weights: str = "int8"
    activations: str | None = None
    tile_size: int | None = None
    targets: str = LAYER_DENSES

    def __post_init__(self) -> None:
        name = self.function
        if self.weights not in WEIGHT_TYPES:
            raise ValueError(f"{name} weights={self.weights!r} must be one of {list(WEIGHT_TYPES)}")
        if self.activations is not None and self.activations not in ACTIVATION_TYPES:
            raise ValueError(f"{name} activations={self.activations!r} must be None (weight-only) or one of "
                             f"{sorted(ACTIVATION_TYPES)}")
        if self.activations is not None and self.weights == "nf4":
            raise ValueError(f"{name} activations={self.activations!r} with weights='nf4': nf4 kernels are "
                             "dequantized before their product, so the activations stay float; give activations=None")
        if self.tile_size is not None and (isinstance(self.tile_size, bool) or not isinstance(self.tile_size, int)
                                           or self.tile_size < 1):
            raise ValueError(f"{name} tile_size={self.tile_size!r} must be a positive int (e.g. 32) or None "
                             "(one scale per output channel)")
        try:
            re.compile(self.targets)
        except re.error as error:
            raise ValueError(f"{name} targets={self.targets!r} is not a valid regex ({error})") from None

    def quantize_kernel(self, kernel: Array, contracted: int) -> qwix.QArray:
        """`kernel` [in..., out...] (its first `contracted` dims contracted) as integers and float32 scales."""
        kernel = jnp.asarray(kernel, jnp.float32)
        tiled = self._tiled(kernel.shape, contracted)
        if self.weights in ("ternary", "binary"):
            return _sign_quantized(kernel, contracted, self.tile_size, ternary=self.weights == "ternary")
        channels = tuple(range(contracted, kernel.ndim))
        if self.weights == "nf4":  # qwix's nf4 bound is 1: s = absmax
            return _without_nan(qwix.quantize(kernel, "nf4", channelwise_axes=channels, tiled_axes=tiled))
        return _without_nan(qwix.quantize(kernel, INTEGER_DTYPES[self.weights], channelwise_axes=channels,
                                          tiled_axes=tiled, calibration_method=absmax_calibration(self.weights)))

    def stored_integers(self, kernel: qwix.QArray) -> Array:
        """The integers of a quantized kernel as a checkpoint stores them (nf4's uint4 indices as int4 q - 8)."""
        if self.weights != "nf4":
            return kernel.qvalue
        return (kernel.qvalue.astype(jnp.int8) - NF4_OFFSET).astype(jnp.int4)

    def stored_kernel(self, integers: Array, scale: Array, dtype: jnp.dtype) -> qwix.QArray:
        """The QArray of a stored kernel's integers and scales, dequantizing to `dtype`."""
        scale = jnp.asarray(scale, dtype)
        if self.weights != "nf4":
            return qwix.QArray(integers, scale)
        return qwix.QArray((integers.astype(jnp.int8) + NF4_OFFSET).astype(jnp.uint4), scale, qtype="nf4")

    def quantize_inputs(self, x: Array, contracted_axes: tuple[int, ...]) -> qwix.QArray:
        """The product's input `x` per row (absmax over `contracted_axes`; per tile of the last one with tiles)."""
        tiled = None if self.tile_size is None else {contracted_axes[-1]: self.tile_size}
        rows = tuple(a for a in range(x.ndim) if a not in contracted_axes)
        return _without_nan(qwix.quantize(x, ACTIVATION_TYPES[self.activations], channelwise_axes=rows,
                                          tiled_axes=tiled, calibration_method=absmax_calibration(self.activations)))

    def _tiled(self, shape: tuple[int, ...], contracted: int) -> dict[int, int] | None:
        if self.tile_size is None:
            return None
        size = shape[contracted - 1]
        if size % self.tile_size:
            raise ValueError(f"{self.function} tile_size={self.tile_size} does not divide a kernel's contracted dim "
                             f"of {size} (kernel shape {shape}); give a divisor of it")
        return {contracted - 1: self.tile_size}


def refuse_lora_under(model: nn.Module, function: str) -> None:
    """LoRA adds its update to the product a quantized Dense returns, so it goes on top: lora(quantized(...))."""
    if settings_of(model, LoraSettings) is not None:
        raise ValueError(f"{function}() of a LoRA model: apply LoRA on top instead, lora({function}(model)) (QLoRA), "
                         f"or merge a trained LoRA first (ptmjax.adapt.lora_merge.merge_lora), then {function}()")


def absmax_calibration(qtype: str) -> str:
    """qwix's calibration for scale = absmax / q_max (its own bound is q_max + 1/2: the module docstring)."""
    return f"absmax,{(Q_MAX[qtype] + 0.5) / Q_MAX[qtype]!r}"


def _without_nan(q: qwix.QArray) -> qwix.QArray:
    """`q` with the integers of a zero channel, row or tile 0 (qwix divides by their zero scale)."""
    if q.qtype == "nf4":  # an index: its quantile times the zero scale is 0 whatever it is
        return q
    unscaled = qwix.dequantize(dataclasses.replace(q, qvalue=jnp.ones_like(q.qvalue))) == 0
    return dataclasses.replace(q, qvalue=jnp.where(unscaled, jnp.zeros((), q.qvalue.dtype), q.qvalue))


def _sign_quantized(kernel: Array, contracted: int, tile: int | None, ternary: bool) -> qwix.QArray:
    """TWN ternary or BWN binary integers (int4) and their float32 scales per channel or tile."""
    shape = kernel.shape
    if tile is None:
        groups, reduced = kernel, tuple(range(contracted))
    else:
        groups = kernel.reshape(shape[:contracted - 1] + (shape[contracted - 1] // tile, tile) + shape[contracted:])
        reduced = tuple(range(contracted - 1)) + (contracted,)
    magnitude = jnp.abs(groups)
    if ternary:
        kept = magnitude > TWN_THRESHOLD * jnp.mean(magnitude, reduced, keepdims=True)
        count = jnp.sum(kept, reduced, keepdims=True)
        scale = jnp.sum(jnp.where(kept, magnitude, 0.0), reduced, keepdims=True) / jnp.maximum(count, 1)
        integers = jnp.where(kept, jnp.sign(groups), 0.0)
    else:
        scale = jnp.mean(magnitude, reduced, keepdims=True)
        integers = jnp.where(groups >= 0, 1.0, -1.0)
    if tile is not None:
        scale = jnp.squeeze(scale, contracted)
    return qwix.QArray(integers.reshape(shape).astype(jnp.int4), scale)
