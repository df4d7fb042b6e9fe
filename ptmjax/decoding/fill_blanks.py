"""Filling every [MASK] of a part A, one blank after another, as GLM generates (blank_infilling.py decodes one)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from flax import linen as nn

from ptmjax.decoding.blank_infilling import blank_infilling_prefill
from ptmjax.decoding.config import DecodeConfig
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.predict import predict


def fill_blanks(
    module: nn.Module, params: Any, part_a: np.ndarray, mask_id: int, config: DecodeConfig, ids: GenerationIds,
    rng: jax.Array | None = None,
) -> list[list[list[int]]]:
    """The spans of each row's [MASK]s (`mask_id`) in part A [b, P] (right-padded with 0), left to right.

    Each span is decoded (as `config` says; `ids`: eos = [END], decoder start = [START]) after part A and
    the spans filled before it, each of those fed back as [START] and its tokens at their 2D positions.
    Returns, per row, one list of tokens (without [END]) per [MASK], in the order of the text.
    """
    part_a = np.asarray(part_a, np.int32)
    rows, width = part_a.shape
    blanks = [np.flatnonzero(row == mask_id) for row in part_a]
    count = max(len(b) for b in blanks)
    total = width + count * (1 + config.max_decode_length)
    fields = {name: np.zeros((rows, total), np.int32) for name in ("tokens", "positions", "blocks", "segments")}
    fields["tokens"][:, :width], fields["segments"][:, :width] = part_a, part_a != 0
    fields["positions"][:, :width] = np.arange(width)
    part_a_marks = fields["segments"].copy()
    lengths = fields["segments"].sum(axis=1)
    decode = jax.jit(functools.partial(predict, blank_infilling_prefill, module), static_argnums=(2, 3))
    spans: list[list[list[int]]] = [[] for _ in range(rows)]
    for k in range(count):
        blank_positions = np.array([b[k] if len(b) > k else 0 for b in blanks], np.int32)
        batch = {
            "decoder_input_tokens": fields["tokens"], "decoder_positions": fields["positions"],
            "decoder_block_positions": fields["blocks"], "decoder_segment_ids": fields["segments"],
            "decoder_causal_attention": part_a_marks, "blank_positions": blank_positions,
        }
        out = decode(params, batch, config, ids, None if rng is None else jax.random.fold_in(rng, k))
        for row, generated in enumerate(np.asarray(out.tokens[:, 0])):
            if len(blanks[row]) <= k:
                continue
            ends = np.flatnonzero(generated == ids.eos_token_id)
            span = generated[: ends[0] if len(ends) else len(generated)].tolist()
            spans[row].append(span)
            written = slice(lengths[row], lengths[row] + 1 + len(span))
            fields["tokens"][row, written] = [ids.decoder_start_token_id, *span]
            fields["positions"][row, written] = blank_positions[row]
            fields["blocks"][row, written] = np.arange(1, len(span) + 2)
            fields["segments"][row, written] = 1
            lengths[row] += 1 + len(span)
    return spans
