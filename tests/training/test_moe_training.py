"""MoE training: the aux-loss normalisation, and expert parallelism equal to one device.

The step's gradient is checked against a hand-written objective (mean token
cross-entropy plus the sum of the sown aux losses, added once per batch), with
and without microbatches. A Switch T5 with 8 experts then trains on 8 emulated
devices laid out by the presets gin_configs/mesh/ep.gin (expert=8) and
fsdp_tp_ep.gin (fsdp=2, tensor=2, expert=2), and as (data=2, expert=4) with
microbatches; a GPT-2 with GShard top-2 MoE in every layer trains with remat
and scanned layers on fsdp_tp_ep.gin. Losses and parameters must equal the
plain model's single-device run, every parameter must be laid out as the rules
say (the expert weights really split over 'expert'), and tokens must reach
their experts by all-to-all.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from sharding_helpers import assert_laid_out_by_rules, mesh_preset

from ptmjax import partitioning
from ptmjax.families.registry import SEQUENCE_TO_SEQUENCE
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=128, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
    num_experts=8, moe_every=1, moe_top_k=1, moe_load_balancing_loss_weight=0.1, moe_router_z_loss_weight=0.01,
)
STEPS, BATCH, INPUTS, TARGETS, LR = 3, 16, 16, 8, 0.5
GPT2_CONFIG = GPT2Config(
    vocab_size=128, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=TARGETS, dropout_rate=0.0,
    attention_dropout_rate=0.0, num_experts=8, moe_every=1, moe_top_k=2, moe_load_balancing_loss_weight=0.1,
    moe_router_z_loss_weight=0.01,
)


def batch_of_tokens(seed: int = 0) -> dict[str, np.ndarray]:
    """Unpacked random rows with some padding in the targets."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, CONFIG.vocab_size, (BATCH, INPUTS)).astype(np.int32)
    targets = rng.integers(2, CONFIG.vocab_size, (BATCH, TARGETS)).astype(np.int32)
    targets[::2, -3:] = 0
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": np.roll(targets, 1, axis=1) * (np.arange(TARGETS) > 0),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }


def hand_objective(params, batch) -> jax.Array:
    """mean cross-entropy over real target tokens + sum of the sown aux losses (train mode)."""
    inputs = {k: jnp.asarray(v) for k, v in batch.items() if k not in SEQUENCE_TO_SEQUENCE.target_fields}
    logits, sown = EncoderDecoder(CONFIG).apply(
        {"params": params}, **inputs, enable_dropout=True, rngs={"dropout": jax.random.key(0)}, mutable=["losses"]
    )
    log_probs = jax.nn.log_softmax(logits)
    targets = jnp.asarray(batch["decoder_target_tokens"])
    nll = -jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    weights = jnp.asarray(batch["decoder_loss_weights"], jnp.float32)
    aux = sum(jax.tree.leaves(sown["losses"]))
    assert len(jax.tree.leaves(sown["losses"])) == 4  # 2 MoE layers x (balance, z)
    return jnp.sum(nll * weights) / jnp.sum(weights) + aux, aux


class Run(NamedTuple):
    trainer: Trainer
    initial: Any  # host params before, after the first and after the last step
    first: Any
    final: Any
    losses: np.ndarray
    aux: np.ndarray  # the 'moe_aux_loss' metric per step
    state: Any
    batch: dict


def model_of(config: T5Config | GPT2Config) -> nn.Module:
    return EncoderDecoder(config) if isinstance(config, T5Config) else GPT2(config)


@functools.lru_cache(maxsize=None)
def train(mesh_config: MeshConfig, single_device: bool = False, num_microbatches: int = 1, config=CONFIG):
    """STEPS SGD steps on the same batch (GPT-2: its decoder half); cached, each run costs a compile.

    A scanned model starts from the plain single-device run's initial parameters (converted with `scan`),
    and the returned host parameters are unscanned, so every run compares with that run.
    """
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    model = model_of(config)
    trainer = Trainer(
        model, optax.sgd(LR), lambda _: LR, mesh, mesh_config.rules, LossConfig(z_loss=0.0), num_microbatches,
    )
    host = lambda params: unscan(jax.device_get(params), config) if config.scan_layers else jax.device_get(params)  # noqa: E731
    if config.scan_layers:  # the plain single-device run's initial parameters, in the scanned layout
        plain = train(MeshConfig(), True, 1, dataclasses.replace(config, scan_layers=False, remat_policy="none"))
        params = scan(plain.initial, config)
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=trainer.tx.init(params))
        state = jax.device_put(state, trainer.state_shardings)
    else:
        state = trainer.init_state(jax.random.key(0))
    initial = host(state.params)  # before the step donates the state
    batch = batch_of_tokens()
    if isinstance(config, GPT2Config):
        batch = {k: v for k, v in batch.items() if k.startswith("decoder_")}
    batch = partitioning.global_batch(batch, mesh)
    losses, aux, first = [], [], None
    for _ in range(STEPS):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        first = host(state.params) if first is None else first
        losses.append(float(metrics["loss"]))
        aux.append(float(metrics["moe_aux_loss"]))
    return Run(trainer, initial, first, host(state.params), np.array(losses), np.array(aux), state, batch)


def test_first_step_gradient_is_token_mean_plus_aux_once_per_batch():
    """SGD's first update over the learning rate equals the hand objective's gradient."""
    run = train(MeshConfig(), single_device=True)
    (_, aux), want = jax.jit(jax.value_and_grad(hand_objective, has_aux=True))(run.initial, batch_of_tokens())
    got = jax.tree.map(lambda before, after: (before - after) / LR, run.initial, run.first)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6), got, want)
    np.testing.assert_allclose(run.aux[0], float(aux), rtol=1e-5)
    assert float(aux) > 0.1  # the balance term alone is ~0.1 * 1 per layer


GPT2_SCANNED = dataclasses.replace(GPT2_CONFIG, scan_layers=True, remat_policy="full")


@pytest.mark.parametrize(
    "mesh,num_microbatches,config",
    [
        pytest.param("ep", 1, CONFIG, marks=pytest.mark.slow),  # expert parallelism alone: in the others too
        (MeshConfig(data=2, expert=4), 2, CONFIG), ("fsdp_tp_ep", 1, CONFIG),
        ("fsdp_tp_ep", 1, GPT2_SCANNED),
    ],
    ids=["ep", "data2_expert4_microbatches2", "fsdp_tp_ep", "gpt2_scan_remat_fsdp_tp_ep"],
)
def test_expert_parallel_run_matches_single_device(mesh, num_microbatches, config):
    """(data=2, expert=4) also accumulates 2 microbatches: rows are routing groups, so it equals one batch."""
    mesh_config = mesh_preset(mesh) if isinstance(mesh, str) else mesh
    plain = dataclasses.replace(config, scan_layers=False, remat_policy="none")
    want = train(MeshConfig(), single_device=True, config=plain)
    run = train(mesh_config, num_microbatches=num_microbatches, config=config)
    assert run.losses[-1] < run.losses[0]
    np.testing.assert_allclose(run.losses, want.losses, rtol=2e-5)
    if num_microbatches == 1:  # with microbatches the metric is token-weighted over them
        np.testing.assert_allclose(run.aux, want.aux, rtol=2e-5)
    jax.tree.map(lambda got, w: np.testing.assert_allclose(got, w, rtol=1e-4, atol=2e-5), run.final, want.final)
    state, expert_ways = run.state, run.trainer.mesh.shape["expert"]
    assert_laid_out_by_rules(run.trainer, state)
    experts = [p for p in jax.tree.leaves(state.params) if "expert" in p.sharding.spec]
    assert experts, "the expert weights should be split over 'expert'"
    for p in experts:
        dim = p.sharding.spec.index("expert")
        assert (p.shape[dim], p.sharding.shard_shape(p.shape)[dim]) == (8, 8 // expert_ways)
    if mesh == "ep" and config is CONFIG:  # once: the compiled step moves tokens to their experts by all-to-all
        hlo = run.trainer.lower_train_step(state, run.batch, jax.random.key(1)).compile().as_text()
        assert "all-to-all" in hlo
