"""A dropless MoE model (MoeConfig.moe_dropless) trained under expert parallelism (gin_configs/mesh/ep.gin,
the 8 experts over 8 devices; fsdp_tp_ep.gin, 2 x 2 x 2) equals the same run on one device: T5 top-1 and
GPT-2 top-2."""

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest
from sharding_helpers import mesh_preset

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

ROWS, LENGTH, VOCAB = 8, 8, 64
MOE = dict(num_experts=8, moe_every=1, moe_dropless=True, moe_load_balancing_loss_weight=0.1,
           moe_router_z_loss_weight=0.01, dropout_rate=0.0)
MODELS = {
    "t5_top1": EncoderDecoder(T5Config(
        vocab_size=VOCAB, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
        ffn_activations=("gelu", "linear"), tie_embeddings=False, moe_top_k=1, **MOE,
    )),
    "gpt2_top2": GPT2(GPT2Config(
        vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=LENGTH,
        attention_dropout_rate=0.0, moe_top_k=2, **MOE,
    )),
}
# Capacity = every token of a row (8 tokens x top-2 x 4.0 / 8 experts): the capacity-based layer drops nothing.
MODELS["gpt2_top2_capacity"] = GPT2(dataclasses.replace(MODELS["gpt2_top2"].config, moe_dropless=False,
                                                        moe_train_capacity_factor=4.0))


def batch_for(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    targets = rng.integers(2, VOCAB, (ROWS, LENGTH)).astype(np.int32)
    batch = {
        "decoder_input_tokens": np.roll(targets, 1, axis=1) * (np.arange(LENGTH) > 0),
        "decoder_target_tokens": targets, "decoder_loss_weights": np.ones_like(targets),
    }
    if isinstance(model, EncoderDecoder):
        batch["encoder_input_tokens"] = rng.integers(2, VOCAB, (ROWS, LENGTH)).astype(np.int32)
    return batch


@functools.lru_cache(maxsize=None)
def one_step(name: str, mesh_config: MeshConfig, single_device: bool):
    model = MODELS[name]
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(model, optax.sgd(1.0), lambda _: 1.0, mesh, mesh_config.rules, LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(batch_for(model), mesh)
    state, metrics = trainer.train_step(state, batch, jax.random.key(1))
    return jax.device_get(state.params), jax.device_get(metrics)


# -m slow: top-2 (its dropless routing is tested unsharded in tests/layers/test_moe_dropless.py)
@pytest.mark.parametrize(
    ("name", "mesh"),
    [("t5_top1", "ep"), ("t5_top1", "fsdp_tp_ep"), pytest.param("gpt2_top2", "ep", marks=pytest.mark.slow)],
)
def test_expert_parallel_dropless_step_equals_one_device(name, mesh):
    want_params, want = one_step(name, MeshConfig(), True)
    got_params, got = one_step(name, mesh_preset(mesh), False)
    for metric in ("loss", "moe_aux_loss", "accuracy"):
        np.testing.assert_allclose(got[metric], want[metric], rtol=2e-6, err_msg=metric)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got_params, want_params)


def test_dropless_step_equals_the_capacity_step_that_drops_nothing():
    want_params, want = one_step("gpt2_top2_capacity", MeshConfig(), True)
    got_params, got = one_step("gpt2_top2", MeshConfig(), True)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=2e-6)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got_params, want_params)
