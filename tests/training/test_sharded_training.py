"""Sharded training equals single-device training, and shards are real.

The same tiny T5 takes the same batches on a single device and on 8
emulated devices laid out by the mesh presets gin_configs/mesh/{dp, fsdp,
tp, dp_fsdp_tp}.gin, i.e. (data=8), (fsdp=8), (tensor=8) and
(data=2, fsdp=2, tensor=2); losses and parameters must agree to float
tolerance, and every parameter must be laid out as the rules say.
(The expert-parallel presets are tested with MoE in test_moe_training.py.)
"""

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest
from sharding_helpers import assert_laid_out_by_rules, mesh_preset

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.optimizers import adafactor
from ptmjax.training.schedules import rsqrt_with_warmup
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=128, d_model=32, num_heads=8, head_dim=8, d_ff=64, num_encoder_layers=2,
    num_decoder_layers=2, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
STEPS, BATCH, INPUTS, TARGETS = 3, 16, 24, 8


def packed_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """Random rows each packing two examples, with a padded tail."""
    rng = np.random.default_rng(seed)

    def fields(length, prefix):
        cut, end = length // 2, length - 2
        segment_ids = np.zeros((BATCH, length), np.int32)
        segment_ids[:, :cut], segment_ids[:, cut:end] = 1, 2
        positions = np.where(segment_ids == 2, np.arange(length) - cut, np.arange(length)) * (segment_ids > 0)
        tokens = rng.integers(2, CONFIG.vocab_size, size=(BATCH, length)).astype(np.int32) * (segment_ids > 0)
        return tokens, {f"{prefix}_segment_ids": segment_ids, f"{prefix}_positions": positions.astype(np.int32)}

    inputs, encoder = fields(INPUTS, "encoder")
    targets, decoder = fields(TARGETS, "decoder")
    same_segment = np.roll(decoder["decoder_segment_ids"], 1, axis=1) == decoder["decoder_segment_ids"]
    return {
        "encoder_input_tokens": inputs, **encoder, **decoder,
        "decoder_input_tokens": (np.roll(targets, 1, axis=1) * same_segment).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }


def unpacked_batch(seed: int = 1) -> dict[str, np.ndarray]:
    """Random unpacked rows, each with a padded tail of its own length."""
    rng = np.random.default_rng(seed)

    def tokens(length):
        real = np.arange(length)[None] < rng.integers(length // 4, length + 1, (BATCH, 1))
        return (rng.integers(2, CONFIG.vocab_size, size=(BATCH, length)) * real).astype(np.int32)

    targets = tokens(TARGETS)
    return {
        "encoder_input_tokens": tokens(INPUTS), "decoder_input_tokens": np.roll(targets, 1, axis=1) * (targets > 0),
        "decoder_target_tokens": targets, "decoder_loss_weights": (targets > 0).astype(np.int32),
    }


@functools.lru_cache(maxsize=None)
def train(
    mesh_config: MeshConfig, single_device: bool = False, num_microbatches: int = 1, dtype: str = "float32",
    attention_kernel: str = "einsum", packed: bool = True,
):
    """Runs STEPS steps; cached, since each distinct run costs a compile."""
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    schedule = rsqrt_with_warmup(peak_learning_rate=0.01, warmup_steps=10)
    model = EncoderDecoder(dataclasses.replace(CONFIG, dtype=dtype, attention_kernel=attention_kernel))
    trainer = Trainer(
        model, adafactor(schedule), schedule, mesh, mesh_config.rules, LossConfig(z_loss=1e-4), num_microbatches
    )
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(packed_batch() if packed else unpacked_batch(), mesh)
    losses = []
    for _ in range(STEPS):  # the same batch, so the loss must fall
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    return trainer, state, np.array(losses)


@pytest.fixture(scope="module")
def single_device():
    _, state, losses = train(MeshConfig(), single_device=True)
    return jax.device_get(state.params), losses


MESHES = {name: mesh_preset(name) for name in ("dp", "fsdp", "tp", "dp_fsdp_tp")}


def assert_same_run(state, losses, want_params, want_losses) -> None:
    """The losses agree to 2e-5 relative and the parameters to 1e-4 relative plus 2e-5."""
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5)
    jax.tree.map(
        lambda got, want: np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=2e-5),
        state.params, want_params,
    )


def test_mesh_presets_lay_out_eight_devices_as_documented():
    sizes = {name: config.axis_sizes(8) for name, config in MESHES.items()}
    assert sizes["dp"] == {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
    assert sizes["fsdp"] == {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    assert sizes["tp"] == {"data": 1, "fsdp": 1, "tensor": 8, "expert": 1}
    assert sizes["dp_fsdp_tp"] == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert mesh_preset("ep").axis_sizes(8) == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 8}
    assert mesh_preset("fsdp_tp_ep").axis_sizes(8) == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2}


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[] if name == "dp_fsdp_tp" else [pytest.mark.slow]) for name in MESHES]
)  # dp_fsdp_tp uses every axis by default; each axis alone runs with -m slow
@pytest.mark.slow
def test_sharded_run_matches_single_device(name, single_device):
    want_params, want_losses = single_device
    trainer, state, losses = train(MESHES[name])
    assert losses[-1] < losses[0], "training did not reduce the loss"
    assert_same_run(state, losses, want_params, want_losses)
    assert_laid_out_by_rules(trainer, state)


def test_fused_attention_given_sequence_lengths_shards_like_one_device():
    """attention_kernel='xla' takes an unpacked batch's padding as sequence lengths [batch], sharded with its rows:
    the (data=2, fsdp=2, tensor=2) run equals one device's."""
    _, want_state, want_losses = train(MeshConfig(), single_device=True, attention_kernel="xla", packed=False)
    _, state, losses = train(MESHES["dp_fsdp_tp"], attention_kernel="xla", packed=False)
    assert losses[-1] < losses[0]
    assert_same_run(state, losses, jax.device_get(want_state.params), want_losses)


def test_fsdp_shards_the_optimizer_state_too():
    trainer, state, _ = train(MESHES["fsdp"])
    full_size = [
        leaf for leaf in jax.tree.leaves(state.opt_state)
        if leaf.ndim >= 2 and leaf.sharding.shard_shape(leaf.shape) != leaf.shape
    ]
    assert full_size, "ZeRO: the full-size optimizer moments should be sharded over fsdp"


@pytest.mark.slow
def test_gradient_accumulation_equals_one_large_batch(single_device):
    want_params, want_losses = single_device
    _, state, losses = train(MeshConfig(data=4, fsdp=2), num_microbatches=2)
    assert_same_run(state, losses, want_params, want_losses)


@pytest.mark.slow
def test_bfloat16_activations_train_float32_parameters(single_device):
    """bf16 compute keeps float32 master weights and tracks the float32 run."""
    _, want_losses = single_device
    _, state, losses = train(MeshConfig(data=8), dtype="bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {np.dtype("float32")}
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, want_losses, rtol=2e-2)


GPT2_CONFIG = GPT2Config(
    vocab_size=128, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)


def run_gpt2(mesh_config: MeshConfig, single_device: bool = False):
    """GPT-2 through the same Trainer, on the decoder half of the packed batch.

    Plain SGD: GPT-2's attention key biases have an exactly zero gradient (a
    constant added to a softmax row), which Adam-style normalisation would
    turn from float noise into full-size, layout-dependent updates.
    """
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    schedule = optax.constant_schedule(0.5)
    trainer = Trainer(GPT2(GPT2_CONFIG), optax.sgd(schedule), schedule, mesh, mesh_config.rules)
    state = trainer.init_state(jax.random.key(0))
    batch = {k: v for k, v in packed_batch().items() if k.startswith("decoder_")}
    batch = partitioning.global_batch(batch, mesh)
    losses = []
    for _ in range(STEPS):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    return state, np.array(losses)


def test_gpt2_sharded_matches_single_device():
    want_state, want_losses = run_gpt2(MeshConfig(), single_device=True)
    state, losses = run_gpt2(MESHES["dp_fsdp_tp"])
    assert losses[-1] < losses[0]
    assert_same_run(state, losses, jax.device_get(want_state.params), want_losses)


@pytest.mark.slow
def test_a_mesh_with_a_new_axis_and_a_rule_for_it_trains_like_one_device(single_device):
    """A mesh axis that is only data (MeshConfig.axes) and a rule: the mlp dimension split over 'tensor' and a
    new 'stage' axis, on (data=2, fsdp=2, stage=2), equals one device's run."""
    rules = tuple((name, ("tensor", "stage")) if name in ("mlp", "activation_mlp") else (name, axes)
                  for name, axes in partitioning.DEFAULT_RULES)
    config = MeshConfig(axes={"data": 2, "fsdp": 2, "tensor": 1, "expert": 1, "stage": 2}, rules=rules)
    trainer, state, losses = train(config)
    assert_same_run(state, losses, *single_device)
    assert_laid_out_by_rules(trainer, state)
    wi = state.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert wi.sharding.spec[-1] == ("tensor", "stage") and wi.addressable_shards[0].data.shape[-1] == CONFIG.d_ff // 2
