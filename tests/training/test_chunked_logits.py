"""The chunked loss (LossConfig.logits_chunk_size) equals the plain loss, its metrics and its gradients:
T5 tied and untied, BART (packed), GPT-2 (packed, prefix LM), with z-loss, label smoothing and dropout, and
sharded on (data=2, fsdp=2, tensor=2) against the plain loss on one device; chunked scoring equals plain scoring."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sharding_helpers import assert_updates_match, parameter_update

from ptmjax import partitioning
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, Bart, BartConfig, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

VOCAB, ROWS, LENGTH = 48, 4, 6
T5_UNTIED = T5Config(
    vocab_size=VOCAB, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
)
T5_TIED = dataclasses.replace(T5_UNTIED, ffn_activations=("relu",), tie_embeddings=True)
GPT = GPT2Config(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.1)
BART = BartConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
                  max_length=16, pad_token_id=0, dropout_rate=0.1)
PLAIN = LossConfig(z_loss=1e-2, label_smoothing=0.1)


def packed_batch(model, seed: int = 0) -> dict[str, jax.Array]:
    """Two segments per row, the last row half padding; GPT-2 rows also carry a bidirectional prefix."""
    rng = np.random.default_rng(seed)
    segments = np.array([[1, 1, 1, 2, 2, 2]] * (ROWS - 1) + [[1, 1, 1, 0, 0, 0]])
    positions = np.array([[0, 1, 2, 0, 1, 2]] * ROWS)
    targets = rng.integers(1, VOCAB, (ROWS, LENGTH)) * (segments > 0)
    inputs = np.where(positions == 0, 0, np.roll(targets, 1, axis=1)) * (segments > 0)
    batch = {
        "decoder_input_tokens": inputs, "decoder_target_tokens": targets, "decoder_loss_weights": segments > 0,
        "decoder_segment_ids": segments, "decoder_positions": positions,
    }
    if isinstance(model, GPT2):
        batch["decoder_causal_attention"] = (positions < 2) * (segments > 0)
    else:
        batch.update(
            encoder_input_tokens=rng.integers(1, VOCAB, (ROWS, LENGTH)) * (segments > 0),
            encoder_segment_ids=segments, encoder_positions=positions,
        )
    return {name: jnp.asarray(value, jnp.int32) for name, value in batch.items()}


@functools.lru_cache(maxsize=None)
def loss_and_grads(model, loss_config: LossConfig, seed: int = 0):
    api = model_api(model)
    params = api.init(jax.random.key(seed))
    params = jax.tree.map(lambda box: box.value, params, is_leaf=lambda x: hasattr(x, "value"))
    batch = packed_batch(model, seed)

    def objective(params):
        token_loss, batch_loss, stats = api.loss(params, batch, loss_config, jax.random.key(7))
        return token_loss + batch_loss, stats.metrics()

    return jax.jit(jax.value_and_grad(objective, has_aux=True))(params)


@pytest.mark.parametrize("model", [EncoderDecoder(T5_UNTIED), EncoderDecoder(T5_TIED), Bart(BART), GPT2(GPT)],
                         ids=["t5_untied", "t5_tied", "bart", "gpt2_prefix_lm"])
@pytest.mark.parametrize("chunk_size", [1, 4])  # 4 pads the length 6 to 8
def test_chunked_loss_and_gradients_equal_the_plain_ones(model, chunk_size):
    (want, want_metrics), want_grads = loss_and_grads(model, PLAIN)
    (got, got_metrics), got_grads = loss_and_grads(model, dataclasses.replace(PLAIN, logits_chunk_size=chunk_size))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name in ("token_loss", "z_loss", "accuracy", "num_tokens"):
        np.testing.assert_allclose(got_metrics[name], want_metrics[name], rtol=1e-6, err_msg=name)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6 * scale), got_grads, want_grads)


@pytest.mark.parametrize("model", [EncoderDecoder(T5_UNTIED), Bart(BART), GPT2(GPT)], ids=["t5", "bart", "gpt2"])
def test_chunked_scores_equal_the_plain_scores(model):
    api = model_api(model)
    params = jax.tree.map(lambda box: box.value, api.init(jax.random.key(0)), is_leaf=lambda x: hasattr(x, "value"))
    batch = packed_batch(model)
    want = jax.jit(api.score)(params, batch)
    assert float(jnp.min(want)) < -1.0  # log-likelihoods of several tokens
    for chunk_size in (1, 4):
        got = jax.jit(functools.partial(api.score, logits_chunk_size=chunk_size))(params, batch)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_model_without_hidden_states_refuses_chunking():
    bert = Bert(BertConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=16))
    with pytest.raises(ValueError, match="logits_chunk_size needs T5, BART or GPT-2, got Bert"):
        model_api(bert).loss({}, {}, LossConfig(logits_chunk_size=4))
    with pytest.raises(ValueError, match="logits_chunk_size needs T5, BART or GPT-2, got Bert"):
        model_api(bert).score({}, {"target_tokens": jnp.zeros((1, 2), jnp.int32)}, logits_chunk_size=4)
    with pytest.raises(ValueError, match="logits_chunk_size must be a positive number of positions, got 0"):
        LossConfig(logits_chunk_size=0)


def one_sgd_step(model, loss_config: LossConfig, mesh_config: MeshConfig, single_device: bool):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(model, optax.sgd(1.0), lambda _: 1.0, mesh, mesh_config.rules, loss_config)
    state = trainer.init_state(jax.random.key(0))
    initial = jax.device_get(state.params)
    batch = {name: np.asarray(value) for name, value in packed_batch(model).items()}
    state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
    params = jax.device_get(state.params)
    return params, jax.device_get(metrics), parameter_update(initial, params)


# -m slow: GPT-2's chunked loss is the same function; its unsharded gradients are compared above
@pytest.mark.parametrize("model", [EncoderDecoder(T5_UNTIED), pytest.param(GPT2(GPT), marks=pytest.mark.slow)],
                         ids=["t5", "gpt2"])
@pytest.mark.slow
def test_sharded_chunked_step_equals_the_plain_step_on_one_device(model):
    want_params, want_metrics, want_update = one_sgd_step(model, PLAIN, MeshConfig(), single_device=True)
    chunked = dataclasses.replace(PLAIN, logits_chunk_size=4)
    got_params, got_metrics, got_update = one_sgd_step(model, chunked, MeshConfig(data=2, fsdp=2, tensor=2), False)
    for name in ("loss", "z_loss", "accuracy"):
        np.testing.assert_allclose(got_metrics[name], want_metrics[name], rtol=2e-6, err_msg=name)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got_params, want_params)
    assert_updates_match(want_update, got_update)  # what the atol cannot see (sharding_helpers)
