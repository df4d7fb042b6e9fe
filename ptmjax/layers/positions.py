"""Learned absolute position embeddings (BERT, RoBERTa, GPT-2) and the position ids they read.

The table is an `Embed` named ('position', 'embed'). A gather past its end
would silently clamp under jit, so models call `check_length` on the static
sequence length first.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.embed import Embed

Array = jax.Array


def sequential_positions(tokens: Array) -> Array:
    """tokens [b, l] -> positions [1, l] = 0, 1, ..., l-1 (broadcasts over the batch)."""
    return jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]


def positions_after_padding(tokens: Array, pad_token_id: int) -> Array:
    """RoBERTa's position ids [b, l]: pad_token_id + 1, + 2, ... over non-padding tokens; padding gets pad_token_id.

    Matches Hugging Face `create_position_ids_from_input_ids` (past length 0).
    """
    valid = (tokens != pad_token_id).astype(jnp.int32)
    return jnp.cumsum(valid, axis=1) * valid + pad_token_id


def check_length(length: int, max_length: int, owner: str) -> None:
    """Raise if a sequence of `length` positions does not fit a table of `max_length`."""
    if length > max_length:
        raise ValueError(
            f"{owner}: sequence length {length} exceeds the learned position table ({max_length} positions); "
            "truncate the inputs or build the model with a larger max_length."
        )


def position_embedder(
    max_length: int, features: int, init_stddev: float, dtype: DType, param_dtype: DType, name: str | None = None
) -> Embed:
    """A learned position table [position, embed] initialised N(0, init_stddev^2)."""
    return Embed(
        max_length, features, axes=("position", "embed"), dtype=dtype, param_dtype=param_dtype,
        embedding_init=nn.initializers.normal(stddev=init_stddev), name=name,
    )
