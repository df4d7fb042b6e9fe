"""What every layer and model family shares: dtypes by name, activation axis names, input checks, and
the platform that layers compile for."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
DType = jnp.dtype | type

# float16 activations need dynamic loss scaling to train (ptmjax/training/loss_scaling.py).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Logical names of the [batch, length, embed] hidden states and the [batch, length, vocab] logits.
HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")
LOGIT_AXES = ("activation_batch", "activation_length", "activation_vocab")


def dtype_kwargs(config: object) -> dict:
    """Module kwargs {'dtype', 'param_dtype'} from a config's `dtype` and `param_dtype` names (keys of DTYPES)."""
    return {"dtype": jnp.dtype(DTYPES[config.dtype]), "param_dtype": jnp.dtype(DTYPES[config.param_dtype])}


def check_token_inputs(name: str, tokens: Array, **companions: Array | None) -> None:
    """Raise unless `tokens` is int [batch, length] and every given companion has its shape."""
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must be int [batch, length], got {tokens.dtype} {tokens.shape}.")
    for other_name, other in companions.items():
        if other is not None and other.shape != tokens.shape:
            raise ValueError(f"{other_name} has shape {other.shape} but {name} has {tokens.shape}; they must match.")


def target_platform() -> str:
    """The platform layers compile for: that of the mesh's devices (`jax.set_mesh`, as the Trainer and
    `ptmjax compile` set it), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return jax.default_backend() if device is None else device.platform
