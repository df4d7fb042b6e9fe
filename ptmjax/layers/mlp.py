"""T5 feed-forward block: ReLU (v1.0) or gated GELU (v1.1), chosen by an activations tuple.

One activation ('relu',) gives `wo(act(wi(x)))`. Several, e.g. ('gelu', 'linear'),
give `wo(act_0(wi_0(x)) * act_1(wi_1(x)) * ...)`.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.dense import Dense

Array = jax.Array

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),  # tanh approximation, as T5X and HF 'gelu_new'
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "linear": lambda x: x,
}


def check_activations(activations: tuple[str, ...]) -> None:
    """Raise ValueError naming any unknown activation."""
    if not activations:
        raise ValueError("ffn_activations is empty; use ('relu',) for T5 v1.0 or ('gelu', 'linear') for v1.1.")
    unknown = [a for a in activations if a not in ACTIVATIONS]
    if unknown:
        raise ValueError(f"unknown ffn activation(s) {unknown}; known: {sorted(ACTIVATIONS)}.")


class MlpBlock(nn.Module):
    """Feed-forward block [b, l, embed] -> [b, l, embed]; bias-free (T5) unless `use_bias` (BERT, GPT-2)."""

    d_ff: int
    activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.0
    use_bias: bool = False
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array, enable_dropout: bool = False) -> Array:
        check_activations(self.activations)
        embed = x.shape[-1]
        dense = {"use_bias": self.use_bias, "dtype": self.dtype, "param_dtype": self.param_dtype}
        hidden = None
        for i, name in enumerate(self.activations):
            layer = "wi" if len(self.activations) == 1 else f"wi_{i}"
            h = ACTIVATIONS[name](Dense((self.d_ff,), ("embed", "mlp"), name=layer, **dense)(x))  # [b, l, mlp]
            hidden = h if hidden is None else hidden * h
        hidden = nn.with_logical_constraint(hidden, ("activation_batch", "activation_length", "activation_mlp"))
        hidden = nn.Dropout(self.dropout_rate)(hidden, deterministic=not enable_dropout)
        out = Dense((embed,), ("mlp", "embed"), name="wo", **dense)(hidden)  # [b, l, embed]
        return nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_embed"))
