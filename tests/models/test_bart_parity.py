"""BART / mBART parity with Hugging Face transformers (random tiny models), lossless conversion, packing.

Encoder inputs are padded with the config's pad id (1 as in HF, or 0 as in ptmjax's
tasks); padded encoder and decoder positions are not compared. Packed rows come from
seqio's EncDecFeatureConverter, as in training.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf
from conftest import assert_same_state_dict, load_gin_config

from ptmjax.models.bart import Bart, BartConfig, BartStack

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_bart  # noqa: E402

BART = BartConfig(
    vocab_size=101, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=3, d_ff=64, max_length=24,
    dropout_rate=0.0,
)
MBART = dataclasses.replace(BART, pre_layer_norm=True, scale_embedding=True)
CONFIGS = {
    "bart": BART,
    "bart_odd_heads_3_scaled_tanh_gelu": dataclasses.replace(
        BART, d_model=24, num_heads=3, d_ff=40, scale_embedding=True, activation="gelu"
    ),
    "mbart": MBART,
    "mbart_odd_heads_5_pad_0": dataclasses.replace(
        MBART, d_model=40, num_heads=5, num_encoder_layers=3, num_decoder_layers=2, pad_token_id=0
    ),
}


def random_hf_model(config: BartConfig):
    torch.manual_seed(0)
    model = hf_bart.build_hf_model(config).eval()
    with torch.no_grad():  # HF inits LayerNorms to (1, 0), biases to 0: perturb so a wrong mapping shows
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in name or name.endswith("bias"):
                tensor.add_(0.2 * torch.randn_like(tensor))
            elif "shared" in name or "embed_positions" in name:  # N(0, 1), not 0.02: logits of order 10
                tensor.normal_()
    return model


def padded_batch(config: BartConfig):
    """Encoder tokens [3, 20] padded with pad_token_id; decoder tokens [3, 12] starting with </s> (id 2)."""
    rng = np.random.default_rng(0)
    enc = rng.integers(3, config.vocab_size, (3, 20))
    enc[1, 13:] = config.pad_token_id
    enc[2, 5:] = config.pad_token_id
    dec = rng.integers(3, config.vocab_size, (3, 12))
    dec[:, 0] = 2
    dec_valid = np.ones_like(dec)
    dec_valid[1, 9:] = 0
    dec_valid[2, 4:] = 0
    dec[dec_valid == 0] = config.pad_token_id
    return enc, dec, dec_valid


def run_ours(config: BartConfig, params, enc: np.ndarray, dec: np.ndarray):
    """-> (logits, encoder final hidden states, decoder final hidden states), as numpy."""

    def fn(p, e, d):
        logits, state = Bart(config).apply(
            p, e, d, capture_intermediates=lambda m, _: isinstance(m, BartStack), mutable=["intermediates"]
        )
        stacks = state["intermediates"]
        return logits, stacks["encoder"]["__call__"][0], stacks["decoder"]["__call__"][0]

    return [np.asarray(x) for x in jax.jit(fn)(params, jnp.asarray(enc), jnp.asarray(dec))]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_hidden_match_transformers_with_padding(name):
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert hf_bart.from_hf_config(model.config) == config
    params = hf_bart.hf_to_params(model.state_dict(), config)
    enc, dec, dec_valid = padded_batch(config)
    enc_valid = enc != config.pad_token_id
    inputs = dict(
        input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc_valid.astype(np.int64)),
        decoder_input_ids=torch.tensor(dec), decoder_attention_mask=torch.tensor(dec_valid),
    )
    with torch.no_grad():
        ref_logits = model(**inputs).logits.numpy()
        ref = model.model(**inputs)
    logits, encoded, decoded = run_ours(config, params, enc, dec)
    assert logits.dtype == np.float32 and logits.shape == ref_logits.shape
    valid = dec_valid.astype(bool)
    diffs = {
        "logit": np.abs(logits - ref_logits)[valid].max(),
        "encoder hidden": np.abs(encoded - ref.encoder_last_hidden_state.numpy())[enc_valid].max(),
        "decoder hidden": np.abs(decoded - ref.last_hidden_state.numpy())[valid].max(),
    }
    print(f"{name}: " + ", ".join(f"max |{k} diff| {v:.2e}" for k, v in diffs.items()), end=" ")
    print(f"(max |logit| {np.abs(ref_logits).max():.1f})")
    assert max(diffs.values()) < 1e-4, diffs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    back = hf_bart.params_to_hf(hf_bart.hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def random_variables(config: BartConfig, seed: int = 0) -> dict:
    """Boxed variables of Bart's tree (eval_shape, never run), each leaf ~ N(0, 0.2^2) drawn in numpy."""
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: Bart(config).init(jax.random.PRNGKey(0), tokens, tokens))
    rng = np.random.default_rng(seed)

    def draw(box: nn.Partitioned) -> nn.Partitioned:
        return box.replace_boxed(0.2 * rng.standard_normal(box.value.shape).astype(np.float32))

    return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def test_boxed_params_export_and_reimport():
    config = CONFIGS["mbart"]
    variables = random_variables(config)
    reloaded = hf_bart.hf_to_params(hf_bart.params_to_hf(variables, config), config)
    jax.tree.map(np.testing.assert_array_equal, reloaded, nn.meta.unbox(variables))


def test_dropout_is_drawn_from_the_dropout_rng():
    config = dataclasses.replace(
        BART, num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.1, attention_dropout_rate=0.1,
        activation_dropout_rate=0.1,
    )
    variables, tokens = random_variables(config), jnp.full((2, 8), 5, jnp.int32)

    @jax.jit
    def run(v: dict, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """-> (logits with dropout drawn from `key`, logits without dropout)."""
        dropped = Bart(config).apply(v, tokens, tokens, enable_dropout=True, rngs={"dropout": key})
        return dropped, Bart(config).apply(v, tokens, tokens)

    # RngBitGenerator keys compile faster than threefry's on CPU; the dropout wiring is the same.
    keys = [jax.random.key(seed, impl="rbg") for seed in (0, 0, 1)]
    (first, plain), (again, _), (other, _) = (run(variables, key) for key in keys)
    np.testing.assert_array_equal(first, again)
    assert np.isfinite(first).all() and np.abs(first - plain).max() > 1e-3 and np.abs(first - other).max() > 1e-3


def test_config_round_trip_and_unsupported_values_are_named():
    for config in CONFIGS.values():
        assert hf_bart.from_hf_config(hf_bart.to_hf_config(config)) == config
    bart = hf_bart.to_hf_config(BART).to_dict()
    for name, value in (
        ("add_bias_logits", True), ("normalize_before", True), ("add_final_layer_norm", True),
        ("activation_function", "quick_gelu"), ("tie_word_embeddings", False),
        ("decoder_attention_heads", 8), ("decoder_ffn_dim", 48), ("model_type", "marian"),
        ("is_encoder_decoder", False), ("static_position_embeddings", True), ("extra_pos_embeddings", 0),
    ):
        with pytest.raises(ValueError, match=name):
            hf_bart.from_hf_config(dict(bart, **{name: value}))
    mbart = hf_bart.to_hf_config(MBART).to_dict()
    assert hf_bart.from_hf_config(dict(mbart, normalize_before=True, add_final_layer_norm=True)) == MBART
    with pytest.raises(ValueError, match="normalize_before"):
        hf_bart.from_hf_config(dict(mbart, normalize_before=False))
    with pytest.raises(ValueError, match="layer_norm_epsilon"):
        hf_bart.to_hf_config(dataclasses.replace(BART, layer_norm_epsilon=1e-6))
    with pytest.raises(ValueError, match="activation"):
        hf_bart.to_hf_config(dataclasses.replace(BART, activation="linear"))
    with pytest.raises(KeyError, match="layer_norm"):
        hf_bart.hf_to_params(random_hf_model(BART).state_dict(), dataclasses.replace(BART, pre_layer_norm=True))
    for field, value in (("pad_token_id", 101), ("num_heads", 5), ("dropout_rate", 1.0), ("pre_layer_norm", 1)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(BART, **{field: value})
    with pytest.raises(ValueError, match="max_length"):
        Bart(BART).init(jax.random.PRNGKey(0), jnp.full((1, 25), 5, jnp.int32), jnp.full((1, 4), 5, jnp.int32))


ENC_LEN, DEC_LEN = 24, 16


def packed_row(examples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """(inputs, targets) pairs through seqio's EncDecFeatureConverter with packing, as the trainer builds batches.

    -> the model's fields of the one packed row, [1, length] each (the train step passes exactly these).
    """
    spec = tf.TensorSpec([None], tf.int32)
    dataset = tf.data.Dataset.from_generator(
        lambda: ({"inputs": i, "targets": t} for i, t in examples), output_signature={"inputs": spec, "targets": spec}
    )
    converted = seqio.EncDecFeatureConverter(pack=True)(dataset, {"inputs": ENC_LEN, "targets": DEC_LEN})
    (row,) = list(converted.as_numpy_iterator())
    return {k: v[None] for k, v in row.items() if k not in ("decoder_target_tokens", "decoder_loss_weights")}


def alone(example: tuple[np.ndarray, np.ndarray], pad_token_id: int) -> dict[str, np.ndarray]:
    """The example by itself: encoder padded with pad_token_id, decoder = 0 + targets shifted; no segments."""
    enc = np.full((1, ENC_LEN), pad_token_id, np.int32)
    dec = np.full((1, DEC_LEN), pad_token_id, np.int32)
    enc[0, : len(example[0])] = example[0]
    dec[0, : len(example[1])] = np.concatenate([[0], example[1][:-1]])
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec}


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_packed_row_equals_examples_run_alone(pre_layer_norm):
    """bart_tiny (pad 0, as ptmjax's tasks) and its mBART variant with HF's pad id 1.

    seqio's packing takes id 0 for padding whatever the model's pad id (a 0 inside an example is lost), so the
    examples hold no 0; the row's padding is then masked by segment ids, the lone examples' by pad_token_id.
    """
    config = load_gin_config("bart_tiny", BartConfig)
    if pre_layer_norm:
        config = dataclasses.replace(config, pre_layer_norm=True, scale_embedding=True, pad_token_id=1)
    rng = np.random.default_rng(0)

    def example(inputs_len: int, targets_len: int) -> tuple[np.ndarray, np.ndarray]:
        return tuple(rng.integers(2, config.vocab_size, n).astype(np.int32) for n in (inputs_len, targets_len))

    a, b, b_changed = example(10, 6), example(12, 7), example(12, 7)
    variables = random_variables(config)
    apply = jax.jit(lambda v, batch: Bart(config).apply(v, **batch))

    def run(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(apply(variables, {k: np.concatenate([v, second[k]]) for k, v in first.items()}))

    packed, changed = run(packed_row([a, b]), packed_row([a, b_changed]))  # [DEC_LEN, vocab] each
    alone_a, alone_b = run(alone(a, config.pad_token_id), alone(b, config.pad_token_id))
    np.testing.assert_allclose(packed[:6], alone_a[:6], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(packed[6:13], alone_b[:7], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(changed[:6], packed[:6])  # example 2 cannot reach example 1
    assert np.abs(changed[6:13] - packed[6:13]).max() > 1e-3
