"""mT5, XLM-R and mBERT train on (data=2, fsdp=2, tensor=2) as on one device.

Tiny models of each gin shape's kind, their vocabularies as divisible as the published ones: mT5's 250,112
by 128, XLM-R's 250,002 by 2 (not 4), mBERT's 119,547 by nothing, so that its vocabulary stays whole on the
tensor axis (the rules map 'vocab' and 'activation_vocab' to no mesh axis; the default rules refuse it in one
line). Two SGD steps on one batch give the single-device losses, parameters and (relatively) each parameter's
update. They run with -m slow (each compiles two trainers, 25-50 s on two shared cores): their layers are T5
v1.1's, RoBERTa's and BERT's, which the default run covers sharded.
"""

import functools

import jax
import numpy as np
import optax
import pytest
from sharding_helpers import assert_updates_match, parameter_update

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

BATCH, LENGTH, STEPS, LR = 8, 16, 2, 0.05
MT5 = T5Config(vocab_size=400, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
               num_decoder_layers=2, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
               hf_model_type="mt5")
ENCODER = dict(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout_rate=0.0, attention_dropout_rate=0.0)
XLMR = BertConfig(vocab_size=302, max_length=20, type_vocab_size=1, pad_token_id=1, positions_after_padding=True,
                  nsp_head=False, layer_norm_epsilon=1e-5, hf_model_type="xlm-roberta", **ENCODER)
MBERT = BertConfig(vocab_size=301, max_length=16, **ENCODER)
MODELS = {"mt5": EncoderDecoder(MT5), "xlm_roberta": Bert(XLMR), "mbert": Bert(MBERT)}
WHOLE_VOCABULARY = tuple((name, None if name in ("vocab", "activation_vocab") else axes)
                         for name, axes in partitioning.DEFAULT_RULES)


def batch(name: str) -> dict[str, np.ndarray]:
    """Random rows with padded tails: span-corruption-like pairs for mT5, MLM (and NSP for mBERT) rows."""
    rng = np.random.default_rng(0)
    config = MODELS[name].config
    real = np.arange(LENGTH)[None] < rng.integers(LENGTH // 2, LENGTH + 1, (BATCH, 1))
    tokens = rng.integers(4, config.vocab_size, (BATCH, LENGTH))
    if name == "mt5":
        targets = (tokens * real).astype(np.int32)
        return {"encoder_input_tokens": np.roll(targets, 3, axis=1), "decoder_target_tokens": targets,
                "decoder_input_tokens": np.roll(targets, 1, axis=1) * real,
                "decoder_loss_weights": real.astype(np.int32)}
    pad = config.pad_token_id
    targets = np.where(real, tokens, pad).astype(np.int32)
    selected = (rng.random((BATCH, LENGTH)) < 0.3) & real
    rows = {"input_tokens": np.where(selected, config.vocab_size - 1, targets).astype(np.int32),
            "target_tokens": targets, "loss_mask": selected.astype(np.int32),
            "token_type_ids": np.zeros((BATCH, LENGTH), np.int32)}
    if config.nsp_head:
        rows["sentence_label"] = rng.integers(0, 2, BATCH).astype(np.int32)
    return rows


@functools.lru_cache(maxsize=None)
def train(name: str, mesh_config: MeshConfig, single_device: bool = False):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(MODELS[name], optax.sgd(LR), lambda _: LR, mesh, mesh_config.rules, LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(0))
    initial = jax.device_get(state.params)
    rows = partitioning.global_batch(batch(name), mesh)
    losses = []
    for _ in range(STEPS):
        state, metrics = trainer.train_step(state, rows, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    return jax.device_get(state.params), np.array(losses), parameter_update(initial, jax.device_get(state.params))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_sharded_steps_equal_one_device(name):
    rules = WHOLE_VOCABULARY if name == "mbert" else partitioning.DEFAULT_RULES
    want_params, want_losses, want_update = train(name, MeshConfig(), single_device=True)
    got_params, got_losses, got_update = train(name, MeshConfig(data=2, fsdp=2, tensor=2, rules=rules))
    print(f"{name}: losses {got_losses} (one device {want_losses})")
    assert want_losses[1] < want_losses[0]
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5), got_params, want_params)
    assert_updates_match(want_update, got_update, context=name)  # what the atol cannot see (sharding_helpers)


def test_an_odd_vocabulary_on_the_tensor_axis_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"embedding'\] dimension 0 has size 301, which does not divide over mesh"):
        train("mbert", MeshConfig(data=2, fsdp=2, tensor=2))
