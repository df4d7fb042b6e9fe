"""T5Config validation, gin loading, dropout determinism, dtypes and sown intermediates."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.models import EncoderDecoder


def batch(vocab: int) -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    enc = rng.integers(1, vocab, (2, 12)).astype(np.int32)
    enc[1, 8:] = 0
    dec = rng.integers(1, vocab, (2, 6)).astype(np.int32)
    dec[:, 0] = 0
    return {"encoder_input_tokens": jnp.asarray(enc), "decoder_input_tokens": jnp.asarray(dec)}


def test_gin_files_build_published_shapes(t5_config):
    tiny = t5_config("t5_1_1_tiny")
    assert (tiny.vocab_size, tiny.d_model, tiny.num_heads, tiny.head_dim, tiny.d_ff) == (2176, 64, 4, 16, 128)
    assert tiny.ffn_activations == ("gelu", "linear") and not tiny.tie_embeddings and tiny.dropout_rate == 0.0
    v10 = t5_config("t5_1_0_tiny")
    assert v10.ffn_activations == ("relu",) and v10.tie_embeddings and v10.dropout_rate == 0.1
    for size in ("small", "base", "large", "3B", "11B"):
        assert t5_config(f"t5_1_1_{size}").dropout_rate == 0.0
        assert t5_config(f"t5_1_0_{size}").vocab_size == 32128


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("d_model", 0, "d_model must be a positive int"),
        ("num_heads", -2, "num_heads must be a positive int"),
        ("ffn_activations", ("gelu", "tanhh"), "unknown ffn activation"),
        ("dtype", "float64", "dtype='float64' is not supported"),
        ("dropout_rate", 1.5, "dropout_rate must be in"),
    ],
)
def test_config_rejects_bad_values(field, value, message, t5_config):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(t5_config("t5_1_1_tiny"), **{field: value})


def test_dropout_off_is_deterministic_and_on_is_random(t5_config, t5_variables):
    config = t5_config("t5_1_0_tiny")
    model = EncoderDecoder(config)
    inputs = batch(config.vocab_size)
    variables = t5_variables(config)
    apply = jax.jit(model.apply, static_argnames="enable_dropout")  # eager dropout compiles op by op: slower

    def run(seed: int, enable: bool) -> np.ndarray:
        rngs = {"dropout": jax.random.PRNGKey(seed)}
        return np.asarray(apply(variables, **inputs, enable_dropout=enable, rngs=rngs))

    np.testing.assert_array_equal(run(1, False), run(2, False))
    np.testing.assert_array_equal(run(3, True), run(3, True))
    assert np.abs(run(3, True) - run(4, True)).max() > 1e-3
    assert np.abs(run(3, True) - run(3, False)).max() > 1e-3


def test_v1_1_has_no_dropout(t5_config, t5_variables):
    config = t5_config("t5_1_1_tiny")
    model = EncoderDecoder(config)
    inputs = batch(config.vocab_size)
    variables = t5_variables(config)
    on = model.apply(variables, **inputs, enable_dropout=True, rngs={"dropout": jax.random.PRNGKey(5)})
    np.testing.assert_array_equal(np.asarray(on), np.asarray(model.apply(variables, **inputs)))


def test_bfloat16_compute_stays_close_to_float32(t5_config, t5_variables):
    config = t5_config("t5_1_1_tiny")
    inputs = batch(config.vocab_size)
    variables = t5_variables(config)
    full = np.asarray(EncoderDecoder(config).apply(variables, **inputs))
    half = EncoderDecoder(dataclasses.replace(config, dtype="bfloat16")).apply(variables, **inputs)
    assert half.dtype == jnp.float32
    relative_rms = np.sqrt(np.mean((np.asarray(half) - full) ** 2)) / full.std()
    assert relative_rms < 0.08  # measured ~0.04: 8-bit mantissas through 4 random layers


def test_sown_attention_weights_respect_padding(t5_config, t5_variables):
    config = t5_config("t5_1_1_tiny")
    model = EncoderDecoder(config)
    inputs = batch(config.vocab_size)
    variables = t5_variables(config)
    _, state = model.apply(variables, **inputs, mutable=["intermediates"])
    inter = state["intermediates"]
    (enc_weights,) = inter["encoder"]["layers_0"]["attention"]["attention_weights"]  # [b, h, s, s]
    (dec_weights,) = inter["decoder"]["layers_1"]["self_attention"]["attention_weights"]  # [b, h, t, t]
    np.testing.assert_allclose(np.asarray(enc_weights).sum(-1), 1.0, rtol=1e-5)
    assert np.asarray(enc_weights)[1, :, :8, 8:].max() == 0.0  # real queries ignore padded keys
    assert np.asarray(jnp.triu(dec_weights, k=1)).max() == 0.0  # no attention to the future
    (hidden,) = inter["encoder"]["layers_1"]["hidden_states"]
    assert hidden.shape == (2, 12, config.d_model)


def test_bad_inputs_are_named(t5_config, t5_variables):
    config = t5_config("t5_1_1_tiny")
    model = EncoderDecoder(config)
    inputs = batch(config.vocab_size)
    variables = t5_variables(config)
    with pytest.raises(ValueError, match="encoder_segment_ids has shape"):
        model.apply(variables, **inputs, encoder_segment_ids=jnp.ones((2, 5), jnp.int32))
    with pytest.raises(ValueError, match="decoder_input_tokens must be int"):
        model.apply(variables, inputs["encoder_input_tokens"], inputs["decoder_input_tokens"].astype(jnp.float32))
