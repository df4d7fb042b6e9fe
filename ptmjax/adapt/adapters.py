"""Bottleneck adapters: Houlsby et al. (2019) after both sublayers of a layer, Pfeiffer et al. (2021) after the FFN.

`adapters(model, placement, bottleneck, activation)` returns the model adapted
by interception (`ptmjax.adapt.interception`), so every family (T5, BART,
GPT-2, the BERT family), scanned or not, and decoding get adapters with no
model code changed. An adapter maps a sublayer's output h [b, l, embed] to
`h + up(act(down(h)))` before the layer's residual add (and T5's and GPT-2's
residual dropout):

- 'houlsby': after every self-attention (its output projection) and every
  feed-forward block (dense or MoE). Cross-attention (T5's and BART's
  decoders) gets none, as AdapterHub's default.
- 'pfeiffer': after every feed-forward block only.

Parameters live in the adapted module's scope: `adapter_down` [embed,
adapter], `adapter_down_bias` [adapter], `adapter_up` [adapter, embed] and
`adapter_up_bias` [embed] ('adapter' is an unsharded logical axis). down is
N(0, 0.01^2) (Houlsby's near-identity initialisation), up and the biases are
zeros, so a fresh adapter model computes exactly what the base model does.
`ADAPTER_PARAMS` matches exactly these paths, for `train.trainable`. Houlsby
also trained the layer norms; add their paths to `train.trainable` for that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.interception import adapted
from ptmjax.layers import precision
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.mlp import ACTIVATIONS, MlpBlock
from ptmjax.layers.moe import MoeBlock
from ptmjax.models.config import check_positive_ints

Array = jax.Array

ADAPTER_PARAMS = r"^(.*/)?adapter_(down|up)(_bias)?$"  # unboxed paths, e.g. 'layers_0/mlp/adapter_down'
PLACEMENTS = ("houlsby", "pfeiffer")
DOWN_INIT_STDDEV = 1e-2


@dataclasses.dataclass(frozen=True)
class AdapterSettings:
    """placement ('houlsby' or 'pfeiffer'), bottleneck width, activation (a name of layers.mlp.ACTIVATIONS)."""

    field: ClassVar[str] = "adapters"
    class_prefix: ClassVar[str] = "Adapted"
    title: ClassVar[str] = "adapters"

    placement: str = "houlsby"
    bottleneck: int = 64
    activation: str = "relu"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"adapters placement={self.placement!r} is unknown; use one of {PLACEMENTS}.")
        check_positive_ints(self, "bottleneck")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"adapters activation={self.activation!r} is unknown; use one of {sorted(ACTIVATIONS)}.")

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> _Call:
        return _Call(self)


@dataclasses.dataclass
class _Call:
    """An adapter model call in progress: adds an adapter after each chosen sublayer."""

    settings: AdapterSettings
    adapted: int = 0

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        if context.method_name != "__call__" or not self._adapts(context.module):
            return out
        self.adapted += 1
        return out + _bottleneck(context.module, out, self.settings).astype(out.dtype)

    def _adapts(self, module: nn.Module) -> bool:
        if isinstance(module, (MlpBlock, MoeBlock)):
            return True
        houlsby = self.settings.placement == "houlsby"
        return houlsby and isinstance(module, MultiHeadAttention) and not module.cross_attention

    def finish(self, model: nn.Module) -> None:
        if model.is_initializing() and not self.adapted:
            raise ValueError(
                f"adapters found no attention or feed-forward block in {type(model).__name__}; they adapt models "
                "built from ptmjax.layers (T5, BART, GPT-2, the BERT family)."
            )


def adapters(model: nn.Module, placement: str = "houlsby", bottleneck: int = 64, activation: str = "relu") -> nn.Module:
    """`model` with bottleneck adapters (see the module docstring)."""
    return adapted(model, AdapterSettings(placement, bottleneck, activation))


def _bottleneck(module: nn.Module, h: Array, settings: AdapterSettings) -> Array:
    """up(act(down(h))) [b, l, embed], its parameters created in `module`'s scope."""
    embed, width, dtype = h.shape[-1], settings.bottleneck, module.param_dtype
    param = lambda name, init, shape, axes: jnp.asarray(  # noqa: E731
        module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype), module.dtype
    )
    zeros = nn.initializers.zeros
    down = param("adapter_down", nn.initializers.normal(DOWN_INIT_STDDEV), (embed, width), ("embed", "adapter"))
    down_bias = param("adapter_down_bias", zeros, (width,), ("adapter",))
    up = param("adapter_up", zeros, (width, embed), ("adapter", "embed"))
    up_bias = param("adapter_up_bias", zeros, (embed,), ("embed",))
    hidden = ACTIVATIONS[settings.activation](precision.matmul(jnp.asarray(h, module.dtype), down) + down_bias)
    return precision.matmul(hidden, up) + up_bias
