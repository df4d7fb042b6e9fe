"""GLM blank infilling decoded with the cache equals an uncached argmax loop over whole rows, token by token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_helpers import GPT, VOCAB, peaked_params, sharded_equals_one_device

from ptmjax.decoding import DecodeConfig, GenerationIds, fill_blanks
from ptmjax.families.registry import family_of
from ptmjax.models import GPT2
from ptmjax.objectives.blank_infilling import blank_ids

GLM = GPT2(dataclasses.replace(GPT, block_position_embeddings=True))
MASK, START, END = blank_ids(VOCAB)
IDS = GenerationIds(eos_token_id=END, pad_token_id=0, decoder_start_token_id=START)
LENGTH = 7
# Three contexts: two parts A of different lengths, and one whose first blank is already filled by part B.
PART_A = [[3, 4, MASK, 6, 7, 8], [9, 10, 11, 12, MASK], [13, MASK, 15, MASK, 17]]
FILLED = [[], [], [(1, [20, 21])]]  # row 2: the span of the [MASK] at position 1
BLANKS = [2, 4, 3]
WIDTH = 24  # the longest row of the tests: part A, two spans, [START]s


def context(part_a: list[int], filled: list[tuple[int, list[int]]]) -> dict[str, list[int]]:
    """A context as GLM lays it out: part A, then each filled span ([START] and its tokens) at its 2D positions."""
    out = {"tokens": part_a, "positions": list(range(len(part_a))), "block_positions": [0] * len(part_a),
           "part_a": [1] * len(part_a)}
    for position, span in filled:
        out = {
            "tokens": [*out["tokens"], START, *span], "positions": out["positions"] + [position] * (len(span) + 1),
            "block_positions": out["block_positions"] + list(range(1, len(span) + 2)),
            "part_a": out["part_a"] + [0] * (len(span) + 1),
        }
    return out


def batch() -> dict[str, jnp.ndarray]:
    contexts = [context(a, f) for a, f in zip(PART_A, FILLED, strict=True)]
    width = max(len(c["tokens"]) for c in contexts)
    pad = lambda values: values + [0] * (width - len(values))  # noqa: E731
    fields = {key: np.array([pad(c[key]) for c in contexts], np.int32) for key in contexts[0]}
    return {
        "decoder_input_tokens": fields["tokens"], "decoder_positions": fields["positions"],
        "decoder_block_positions": fields["block_positions"], "decoder_causal_attention": fields["part_a"],
        "decoder_segment_ids": np.array([pad([1] * len(c["tokens"])) for c in contexts], np.int32),
        "blank_positions": np.array(BLANKS, np.int32),
    }


@jax.jit
def forward(params, fields: dict) -> jax.Array:
    return GLM.apply({"params": params}, **fields)


def uncached_infill(params, ctx: dict[str, list[int]], blank: int) -> tuple[list[int], float]:
    """Greedy: the whole row (context, [START], the span so far) through the model for every token."""
    tokens, blocks = [*ctx["tokens"], START], [*ctx["block_positions"], 1]
    positions, part_a = [*ctx["positions"], blank], [*ctx["part_a"], 0]
    generated, score = [], 0.0
    while len(generated) < LENGTH and END not in generated:
        n = len(tokens)
        fields = {
            "decoder_input_tokens": tokens, "decoder_positions": positions, "decoder_block_positions": blocks,
            "decoder_causal_attention": part_a, "decoder_segment_ids": [1] * n,
        }
        fields = {k: jnp.asarray([v + [0] * (WIDTH - n)], jnp.int32) for k, v in fields.items()}
        logits = np.asarray(forward(params, fields), np.float64)[0, n - 1]
        log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        token = int(log_probs.argmax())
        generated.append(token)
        score += log_probs[token]
        tokens, positions, part_a = tokens + [token], positions + [blank], part_a + [0]
        blocks = blocks + [blocks[-1] + 1]
    return generated, score


def test_cached_blank_infilling_equals_uncached_argmax(jit_predict):
    params = peaked_params(GLM, seed=4)
    out = jit_predict(GLM)(params, batch(), DecodeConfig(max_decode_length=LENGTH), IDS)
    tokens, scores = np.asarray(out.tokens[:, 0]), np.asarray(out.scores[:, 0])
    for row in range(3):
        want, score = uncached_infill(params, context(PART_A[row], FILLED[row]), BLANKS[row])
        assert tokens[row, : len(want)].tolist() == want
        assert (tokens[row, len(want) :] == 0).all()
        np.testing.assert_allclose(scores[row], score, rtol=1e-4, atol=1e-4)
        print(f"row {row}: {want}, score {scores[row]:.4f} vs float64 uncached {score:.4f}")
    assert len(set(tokens.ravel().tolist())) >= 6, "degenerate decode: the test would not see a wrong cache"
    assert (tokens == END).any(axis=1).tolist() == [False, False, True]  # [END] stops a span; the others run on


def test_the_blank_and_the_filled_span_matter(jit_predict):
    params = peaked_params(GLM)
    config = DecodeConfig(max_decode_length=LENGTH)
    base = np.asarray(jit_predict(GLM)(params, batch(), config, IDS).tokens)
    moved = {**batch(), "blank_positions": np.array([0, 0, 0], np.int32)}
    assert (np.asarray(jit_predict(GLM)(params, moved, config, IDS).tokens) != base).any()
    assert family_of(GLM).predict.args[0].__name__ == "blank_infilling_prefill"
    with pytest.raises(ValueError, match="decoder_start_token_id is None"):
        jit_predict(GLM)(params, batch(), config, dataclasses.replace(IDS, decoder_start_token_id=None))
    without_blank = {k: v for k, v in batch().items() if k != "blank_positions"}
    with pytest.raises(ValueError, match=r"needs batch fields \['blank_positions'\]"):
        jit_predict(GLM)(params, without_blank, config, IDS)


def test_fill_blanks_fills_each_mask_after_the_spans_before_it():
    """Every [MASK], left to right, each decoded after part A and the earlier spans (uncached reference)."""
    params = peaked_params(GLM, seed=4)
    padded = np.array([a + [0] * (6 - len(a)) for a in PART_A], np.int32)
    got = fill_blanks(GLM, params, padded, MASK, DecodeConfig(max_decode_length=LENGTH), IDS)
    for row, part_a in enumerate(PART_A):
        filled = []
        for blank in [i for i, t in enumerate(part_a) if t == MASK]:
            span = uncached_infill(params, context(part_a, filled), blank)[0]
            filled.append((blank, [t for t in span if t != END]))
        assert got[row] == [span for _, span in filled], row
    assert [len(spans) for spans in got] == [1, 1, 2] and all(got[2])


def test_beam_search_on_eight_devices_equals_one_device():
    """The training layout (data=2, fsdp=2, tensor=2), 8 rows of the three contexts: beams as on one device."""
    rows = {name: value[[0, 1, 2, 0, 1, 2, 2, 1]] for name, value in batch().items()}
    config = DecodeConfig(method="beam", max_decode_length=LENGTH, num_beams=3, num_decodes=2)
    single = sharded_equals_one_device(GLM, peaked_params(GLM, seed=4), rows, config, IDS)
    assert len({tuple(t) for t in np.asarray(single.tokens).reshape(-1, LENGTH).tolist()}) > 3  # beams differ
