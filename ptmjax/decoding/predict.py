"""`predict`: a family's prefill, then greedy, beam search or sampling, as a DecodeConfig says."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.decoding.beam_search import beam_search
from ptmjax.decoding.cache import repeat_rows
from ptmjax.decoding.config import DecodeConfig, DecodeOutput
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.prefill import Prefill
from ptmjax.decoding.sampling import sample

Array = jax.Array
PrefillFn = Callable[[nn.Module, Any, Mapping[str, Array], int, GenerationIds], Prefill]


def predict(
    prefill_fn: PrefillFn, module: nn.Module, params: Any, batch: Mapping[str, Array], config: DecodeConfig,
    ids: GenerationIds, rng: Array | None = None,
) -> DecodeOutput:
    """Decodes every row of `batch` (the fields `prefill_fn` reads). Pure: jit it with `config` and `ids` static.

    method='sample' needs `rng`. `ids` needs EOS; pad defaults to EOS.
    """
    length, ids = config.max_decode_length, ids.for_decoding()
    prefill = prefill_fn(module, params, batch, length, ids)
    rows = prefill.first_logits.shape[0]
    if config.method == "beam":
        style, alpha = config.length_penalty(ids)
        tokens, scores = beam_search(prefill, config.num_beams, length, ids, alpha, style)
        return DecodeOutput(tokens[:, : config.num_decodes], scores[:, : config.num_decodes])
    if config.method == "sample" and rng is None:
        raise ValueError("DecodeConfig.method='sample' needs an rng (jax.random.key); greedy needs none.")
    n = config.num_decodes
    if n > 1:
        prefill = Prefill(
            jnp.repeat(prefill.first_logits, n, axis=0), repeat_rows(prefill.state, n), prefill.step
        )
    tokens, scores = sample(
        prefill, length, ids, rng if config.method == "sample" else None, config.temperature, config.top_k,
        config.top_p,
    )
    return DecodeOutput(tokens.reshape(rows, n, length), scores.reshape(rows, n))
