"""GLM blank infilling decoded with the cache equals an uncached argmax loop over whole rows, token by token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_helpers import GPT, VOCAB, peaked_params

from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.registry import family_of
from ptmjax.models import GPT2
from ptmjax.objectives.blank_infilling import blank_ids

GLM = GPT2(dataclasses.replace(GPT, block_position_embeddings=True))
MASK, START, END = blank_ids(VOCAB)
IDS = GenerationIds(eos_token_id=END, pad_token_id=0, decoder_start_token_id=START)
LENGTH = 7
# Three contexts: two parts A of different lengths, and one whose first blank is already filled by part B.
PART_A = [[3, 4, MASK, 6, 7, 8], [9, 10, 11, 12, MASK], [13, MASK, 15, MASK, 17]]
FILLED = [[], [], [START, 20, 21]]  # row 2: the span of the [MASK] at position 1
BLANKS = [2, 4, 3]
WIDTH = 8 + 1 + LENGTH  # the longest context, [START], the span


def context(row: int) -> dict[str, list[int]]:
    """A row's context as GLM lays it out: part A, then the filled spans with their 2D positions."""
    a, b = PART_A[row], FILLED[row]
    return {
        "tokens": a + b, "positions": list(range(len(a))) + [1] * len(b),
        "block_positions": [0] * len(a) + list(range(1, len(b) + 1)), "part_a": [1] * len(a) + [0] * len(b),
    }


def batch() -> dict[str, jnp.ndarray]:
    width = max(len(context(r)["tokens"]) for r in range(3))
    pad = lambda values: values + [0] * (width - len(values))  # noqa: E731
    fields = {key: np.array([pad(context(r)[key]) for r in range(3)], np.int32) for key in context(0)}
    return {
        "decoder_input_tokens": fields["tokens"], "decoder_positions": fields["positions"],
        "decoder_block_positions": fields["block_positions"], "decoder_causal_attention": fields["part_a"],
        "decoder_segment_ids": np.array([pad([1] * len(context(r)["tokens"])) for r in range(3)], np.int32),
        "blank_positions": np.array(BLANKS, np.int32),
    }


@jax.jit
def forward(params, fields: dict) -> jax.Array:
    return GLM.apply({"params": params}, **fields)


def uncached_infill(params, row: int) -> tuple[list[int], float]:
    """Greedy: the whole row (context, [START], the span so far) through the model for every token."""
    ctx = context(row)
    tokens, blocks = [*ctx["tokens"], START], [*ctx["block_positions"], 1]
    positions, part_a = [*ctx["positions"], BLANKS[row]], [*ctx["part_a"], 0]
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
        tokens, positions, part_a = tokens + [token], positions + [BLANKS[row]], part_a + [0]
        blocks = blocks + [blocks[-1] + 1]
    return generated, score


def test_cached_blank_infilling_equals_uncached_argmax(jit_predict):
    params = peaked_params(GLM, seed=4)
    out = jit_predict(GLM)(params, batch(), DecodeConfig(max_decode_length=LENGTH), IDS)
    tokens, scores = np.asarray(out.tokens[:, 0]), np.asarray(out.scores[:, 0])
    for row in range(3):
        want, score = uncached_infill(params, row)
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
