"""Transformer-XL's cached decoding (ptmjax/decoding/segment_memory_prefill.py) against reading the prompt and
the tokens generated so far segment by segment with `with_memory`, uncached, from the same memory: greedy tokens
and every step's logits, beam scores, the bounded cache, and 8 devices against one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_helpers import IDS, VOCAB, peaked_params, sharded_equals_one_device

from ptmjax.decoding import DecodeConfig, segment_memory_prefill
from ptmjax.families.model_api import model_api
from ptmjax.models.transformer_xl import TransformerXL, TransformerXLConfig, empty_memory

PROMPTS = np.array([[3, 4, 5, 6, 7, 8, 9], [7, 8, 9, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0]], np.int32)
LENGTH = 10
# memory shorter than a segment, one-token segments, memory reaching two segments back
CASES = {"memory3_segment4": (3, 4), "memory5_segment1": (5, 1), "memory6_segment3": (6, 3)}


def model(memory_length: int, segment_length: int) -> TransformerXL:
    return TransformerXL(TransformerXLConfig(
        vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, memory_length=memory_length,
        dropout_rate=0.0, attention_dropout_rate=0.0, decode_segment_length=segment_length))


def prompt_batch(module: TransformerXL, params: dict, with_memory: bool, rows: list[int] | None = None) -> dict:
    """The prompts (right-padded), and with_memory: the memory that reading a 2-token text (row 0) or a
    9-token text in segments of 3 (the others) leaves, so one memory is part filled and the others full."""
    rows = list(range(len(PROMPTS))) if rows is None else rows
    prompts = PROMPTS[rows]
    batch = {"decoder_input_tokens": jnp.asarray(prompts), "decoder_segment_ids": jnp.asarray(prompts > 0, jnp.int32)}
    if with_memory:
        memories = [reference_memory(module, params, text) for text in ([11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21])]
        picked = [memories[min(r, 1)] for r in rows]
        batch["memory_hidden"] = jnp.concatenate([jnp.swapaxes(m["hidden"], 0, 1) for m in picked])
        batch["memory_filled"] = jnp.concatenate([m["filled"] for m in picked])
    return batch


def reference_memory(module: TransformerXL, params: dict, text: list[int], memory: dict | None = None) -> dict:
    """The memory after reading `text` (one row) in segments of 3 after `memory` (default: empty)."""
    memory = empty_memory(module.config, 1) if memory is None else memory
    for start in range(0, len(text), 3):
        _, memory = read(module, params, text[start:start + 3], memory)
    return memory


def read(module: TransformerXL, params: dict, segment: list[int], memory: dict) -> tuple:
    """(logits [1, t, vocab], memory) of one row's segment read after `memory`."""
    return _read(module, params, jnp.asarray([segment], jnp.int32), memory)


@functools.partial(jax.jit, static_argnums=(0,))
def _read(module: TransformerXL, params: dict, segment: jax.Array, memory: dict) -> tuple:
    return module.apply({"params": params}, segment, memory, method="with_memory")


def reference_logits(module: TransformerXL, params: dict, stream: list[int], memory: dict) -> np.ndarray:
    """Logits [vocab] after the last token of `stream` (one row), read from its start in segments of
    decode_segment_length after `memory`, without a cache."""
    segment = module.config.decode_segment_length
    for start in range(0, len(stream), segment):
        logits, memory = read(module, params, stream[start:start + segment], memory)
    return np.asarray(logits[0, -1])


def row_memory(module: TransformerXL, batch: dict, row: int) -> dict:
    if "memory_hidden" not in batch:
        return empty_memory(module.config, 1)
    return {"hidden": jnp.swapaxes(batch["memory_hidden"][row:row + 1], 0, 1),
            "filled": batch["memory_filled"][row:row + 1]}


def reference_greedy(module: TransformerXL, params: dict, batch: dict) -> tuple[np.ndarray, list[np.ndarray]]:
    """Argmax tokens [b, LENGTH] (continued past EOS) and each step's logits [b, vocab], from `reference_logits`
    over the growing rows."""
    tokens, logits = np.zeros((len(PROMPTS), LENGTH), np.int32), []
    streams = [list(p[p > 0]) for p in np.asarray(batch["decoder_input_tokens"])]
    for i in range(LENGTH):
        step = np.stack([reference_logits(module, params, s, row_memory(module, batch, r))
                         for r, s in enumerate(streams)])
        logits.append(step)
        tokens[:, i] = step.argmax(-1)
        for stream, token in zip(streams, tokens[:, i], strict=True):
            stream.append(int(token))
    return tokens, logits


def padded_after_eos(tokens: np.ndarray) -> np.ndarray:
    """tokens [b, n] with the pad id after each row's first EOS, as decoding returns them."""
    after = np.cumsum(tokens == IDS.eos_token_id, axis=1) - (tokens == IDS.eos_token_id) > 0
    return np.where(after, IDS.pad_token_id, tokens)


@pytest.mark.parametrize("case, with_memory", [
    ("memory3_segment4", False), ("memory3_segment4", True), ("memory5_segment1", True), ("memory6_segment3", True),
    pytest.param("memory5_segment1", False, marks=pytest.mark.slow),
    pytest.param("memory6_segment3", False, marks=pytest.mark.slow),
])
def test_greedy_tokens_and_step_logits_equal_reading_segment_by_segment(case, with_memory):
    module = model(*CASES[case])
    params = peaked_params(module)
    batch = prompt_batch(module, params, with_memory)
    want_tokens, want_logits = reference_greedy(module, params, batch)
    out = jax.jit(model_api(module).predict, static_argnums=(2, 3))(
        params, batch, DecodeConfig(max_decode_length=LENGTH), IDS)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), padded_after_eos(want_tokens))
    prefill = segment_memory_prefill(module, params, batch, LENGTH, IDS)
    state, logits, step = prefill.state, prefill.first_logits, jax.jit(prefill.step)
    for i in range(LENGTH):  # teacher-forced with the reference's tokens
        np.testing.assert_allclose(np.asarray(logits), want_logits[i], atol=1e-4, rtol=1e-5)
        logits, state = step(state, jnp.asarray(want_tokens[:, i]), jnp.int32(i))


def test_beam_scores_are_the_reference_log_likelihoods_of_the_beams():
    module = model(*CASES["memory3_segment4"])
    params = peaked_params(module, scale=2.0)
    batch = prompt_batch(module, params, True)
    config = DecodeConfig(method="beam", max_decode_length=6, num_beams=3, num_decodes=3, length_penalty_alpha=0.0)
    out = jax.jit(model_api(module).predict, static_argnums=(2, 3))(params, batch, config, IDS)
    for row, prompt in enumerate(PROMPTS):
        for beam, score in zip(np.asarray(out.tokens[row]), np.asarray(out.scores[row]), strict=True):
            stream, total = list(prompt[prompt > 0]), 0.0
            for token in beam[: (list(beam) + [IDS.eos_token_id]).index(IDS.eos_token_id) + 1]:
                logits = reference_logits(module, params, stream, row_memory(module, batch, row)).astype(np.float64)
                total += logits[token] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
                stream.append(int(token))
            np.testing.assert_allclose(score, total, atol=1e-4, rtol=1e-5)
    assert len({tuple(b) for b in np.asarray(out.tokens[0])}) == 3, "the beams of a row are not distinct"


def test_the_cache_holds_memory_plus_segment_minus_one_slots_whatever_the_length():
    module = model(*CASES["memory6_segment3"])
    params = peaked_params(module)
    for max_decode_length in (4, 32):
        state = segment_memory_prefill(module, params, prompt_batch(module, params, False), max_decode_length,
                                       IDS).state
        shapes = {leaf.shape for leaf in jax.tree.leaves(state.kv)}
        assert shapes == {(len(PROMPTS), 4, 6 + 3 - 1, 8)}, shapes


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_sharded_decoding_equals_one_device(method):
    module = model(*CASES["memory3_segment4"])
    params = peaked_params(module)
    batch = prompt_batch(module, params, True, rows=[0, 1, 2, 0, 1, 2, 2, 1])
    config = {"greedy": DecodeConfig(max_decode_length=6),
              "beam": DecodeConfig(method="beam", max_decode_length=6, num_beams=3, num_decodes=3)}[method]
    sharded_equals_one_device(module, params, batch, config)


def test_a_memory_of_the_wrong_shape_is_named():
    module = model(*CASES["memory3_segment4"])
    params = peaked_params(module)
    batch = {"decoder_input_tokens": jnp.asarray(PROMPTS), "memory_hidden": jnp.zeros((3, 2, 5, 32))}
    with pytest.raises(ValueError, match=r"of shape \(3, 2, 5, 32\) does not fit: want \(3, 2, 3, 32\)"):
        segment_memory_prefill(module, params, batch, LENGTH, IDS)
