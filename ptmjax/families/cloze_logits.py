"""The logits a model ranks at a cloze's blank (LAMA-style probing, ptmjax/adapt/probing/cloze_probe.py).

A masked LM reads the cloze with its mask id at the blank and ranks its MLM logits there; T5 reads it with
`<extra_id_0>` at the blank and ranks the decoder's logits for the token after `<extra_id_0>` (decoder inputs:
the start id 0, then the sentinel), as span corruption taught it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

T5_DECODER_START = 0


def masked_lm_logits(module: nn.Module, params: Any, tokens: jax.Array, blanks: jax.Array, mask_id: int) -> jax.Array:
    """The MLM logits at each row's blank: [b, vocab] (`mask_id` is already in `tokens`)."""
    logits = module.apply({"params": params}, tokens, method=lambda m, t: m.mlm_logits(m.encode(t)))
    return jnp.take_along_axis(logits, blanks[:, None, None], axis=1)[:, 0]  # [b, vocab]


def t5_sentinel_logits(
    module: nn.Module, params: Any, tokens: jax.Array, blanks: jax.Array, mask_id: int
) -> jax.Array:
    """The decoder's logits after the sentinel `mask_id`: [b, vocab] (the sentinel marks the blank: `blanks`
    unread)."""
    start = jnp.full((tokens.shape[0], 1), T5_DECODER_START, tokens.dtype)
    decoder_inputs = jnp.concatenate([start, jnp.full_like(start, mask_id)], axis=1)
    logits = module.apply({"params": params}, tokens, decoder_inputs)  # [b, 2, vocab]
    return logits[:, 1]
