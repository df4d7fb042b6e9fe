"""Packing: a row holding two examples (segment ids 1, 2) gives each example's unpacked logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.models import EncoderDecoder

ENC_LEN, DEC_LEN = 24, 16


def example(rng: np.random.Generator, vocab: int, enc_len: int, dec_len: int) -> tuple[np.ndarray, np.ndarray]:
    enc = rng.integers(1, vocab, enc_len)
    dec = np.concatenate([[0], rng.integers(1, vocab, dec_len - 1)])  # starts with id 0 (BOS)
    return enc, dec


def pack(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """One row: a then b, then padding; segment ids 1, 2, 0 and per-segment positions."""
    out = {}
    for side, length, parts in (("encoder", ENC_LEN, (a[0], b[0])), ("decoder", DEC_LEN, (a[1], b[1]))):
        tokens = np.zeros(length, np.int32)
        segments = np.zeros(length, np.int32)
        positions = np.zeros(length, np.int32)
        start = 0
        for seg, part in enumerate(parts, start=1):
            tokens[start : start + len(part)] = part
            segments[start : start + len(part)] = seg
            positions[start : start + len(part)] = np.arange(len(part))
            start += len(part)
        out[f"{side}_input_tokens"] = tokens[None]
        out[f"{side}_segment_ids"] = segments[None]
        out[f"{side}_positions"] = positions[None]
    return out


def alone(ex: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """The example by itself, right-padded, no segment ids."""
    enc = np.zeros((1, ENC_LEN), np.int32)
    dec = np.zeros((1, DEC_LEN), np.int32)
    enc[0, : len(ex[0])] = ex[0]
    dec[0, : len(ex[1])] = ex[1]
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec}


@pytest.mark.parametrize(
    "name, with_positions", [("t5_1_0_tiny", False), ("t5_1_1_tiny", False), ("t5_1_1_tiny", True)]
)
def test_packed_row_equals_examples_run_alone(name, with_positions, t5_config, t5_variables):
    config = t5_config(name)
    model = EncoderDecoder(config)
    rng = np.random.default_rng(0)
    a = example(rng, config.vocab_size, 9, 6)
    b = example(rng, config.vocab_size, 11, 7)
    b_changed = example(rng, config.vocab_size, 11, 7)
    packed = pack(a, b)
    if not with_positions:
        packed = {k: v for k, v in packed.items() if not k.endswith("positions")}
    variables = t5_variables(config)

    def run(batch: dict[str, np.ndarray]) -> jax.Array:
        return model.apply(variables, **{k: jnp.asarray(v) for k, v in batch.items()})

    logits = np.asarray(run(packed))[0]  # [DEC_LEN, vocab]
    logits_a = np.asarray(run(alone(a)))[0, :6]
    logits_b = np.asarray(run(alone(b)))[0, :7]
    np.testing.assert_allclose(logits[:6], logits_a, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(logits[6:13], logits_b, atol=1e-5, rtol=1e-5)

    # Example 2's tokens (encoder and decoder) cannot reach example 1.
    changed = dict(packed, **{k: v for k, v in pack(a, b_changed).items() if k in packed})
    logits_changed = np.asarray(run(changed))[0]
    np.testing.assert_array_equal(logits_changed[:6], logits[:6])
    assert np.abs(logits_changed[6:13] - logits[6:13]).max() > 1e-3


def test_encoder_packing_alone(t5_config, t5_variables):
    """The encoder output of segment 1 ignores segment 2 and padding entirely."""
    config = t5_config("t5_1_1_tiny")
    model = EncoderDecoder(config)
    rng = np.random.default_rng(1)
    a, b = example(rng, config.vocab_size, 9, 2), example(rng, config.vocab_size, 11, 2)
    packed = pack(a, b)
    variables = t5_variables(config)
    encoded = model.apply(
        variables, jnp.asarray(packed["encoder_input_tokens"]), jnp.asarray(packed["encoder_segment_ids"]),
        method=EncoderDecoder.encode,
    )
    encoded_b = model.apply(variables, jnp.asarray(alone(b)["encoder_input_tokens"]), method=EncoderDecoder.encode)
    np.testing.assert_allclose(np.asarray(encoded)[0, 9:20], np.asarray(encoded_b)[0, :11], atol=1e-5, rtol=1e-5)
