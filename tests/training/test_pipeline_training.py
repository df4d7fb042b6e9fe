"""GPT-2 trained with pipeline stages equals the single-device run (ptmjax/layers/pipeline.py).

The same tiny scanned GPT-2 (4 layers) takes three SGD steps on the same batch on one device and on
8 emulated devices with a stage axis: GPipe on (stage=4, data=2) and on (stage=2, fsdp=2, tensor=2)
with full remat, and the circular schedule (2 rounds) on (stage=2, data=4) with gradient
accumulation; with MoE layers, their auxiliary losses included, GPipe on (stage=2, expert=2, data=2)
and circular on (stage=2, expert=2, fsdp=2). Losses, gradient norms, the first step's gradients and
the parameters after the steps must agree to float32 tolerance. A checkpoint saved with stages
restores on a mesh without them and the reverse, and goes on training there as the run it left would
have. Families and options the pipeline does not run are refused by name.
"""

import functools

import jax
import numpy as np
import optax
import pytest

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig, pipeline_rules
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.training.trainer import Trainer

LR, STEPS, BATCH, LENGTH = 0.1, 3, 16, 16
BASE = dict(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=LENGTH, dropout_rate=0.0,
            attention_dropout_rate=0.0, scan_layers=True)
SINGLE = MeshConfig()


def staged(**sizes) -> MeshConfig:
    axes = {"stage": 1, "data": 1, "fsdp": 1, "tensor": 1, "expert": 1, **sizes}
    return MeshConfig(axes=tuple(axes.items()), rules=pipeline_rules())


def host_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    segments = np.zeros((BATCH, LENGTH), np.int32)
    segments[:, :9], segments[:, 9:14] = 1, 2  # two packed examples, a padded tail
    tokens = rng.integers(2, 64, (BATCH, LENGTH)).astype(np.int32) * (segments > 0)
    positions = np.where(segments == 2, np.arange(LENGTH) - 9, np.arange(LENGTH)) * (segments > 0)
    return {"decoder_input_tokens": np.roll(tokens, 1, 1) * (segments > 0), "decoder_target_tokens": tokens,
            "decoder_loss_weights": (tokens > 0).astype(np.int32), "decoder_segment_ids": segments,
            "decoder_positions": positions.astype(np.int32)}


def make_trainer(mesh_config: MeshConfig, single_device: bool = False, num_microbatches: int = 1, **fields):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    return Trainer(GPT2(GPT2Config(**BASE, **fields)), optax.sgd(LR), lambda _: LR, mesh, mesh_config.rules,
                   LossConfig(z_loss=0.0), num_microbatches=num_microbatches)


@functools.lru_cache(maxsize=None)
def train(mesh_config: MeshConfig, single_device: bool = False, num_microbatches: int = 1, **fields):
    trainer = make_trainer(mesh_config, single_device, num_microbatches, **dict(fields))
    state = trainer.init_state(jax.random.key(0))
    params = [jax.device_get(state.params)]
    batch = partitioning.global_batch(host_batch(), trainer.mesh)
    metrics = []
    for _ in range(STEPS):
        state, step_metrics = trainer.train_step(state, batch, jax.random.key(1))
        metrics.append(jax.device_get(step_metrics))
        params.append(jax.device_get(state.params))
    return params, metrics


def max_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)))


def assert_trains_as_one_device(got, want, metric_names=("loss", "grad_norm")):
    """Metrics per step (rtol 2e-6), first-step gradients (2e-5) and final parameters (2e-6) of two `train` runs."""
    (got_params, got_metrics), (want_params, want_metrics) = got, want
    for got_step, want_step in zip(got_metrics, want_metrics, strict=True):
        for name in metric_names:
            np.testing.assert_allclose(got_step[name], want_step[name], rtol=2e-6, err_msg=name)
    grads = lambda params: jax.tree.map(lambda a, b: (a - b) / LR, params[0], params[1])  # noqa: E731  (SGD)
    assert max_diff(grads(got_params), grads(want_params)) < 2e-5
    assert max_diff(got_params[-1], want_params[-1]) < 2e-6


@pytest.mark.slow
@pytest.mark.parametrize("mesh_config, num_microbatches, fields", [
    (staged(stage=4, data=2), 1, {"pipeline_microbatches": 4}),
    (staged(stage=2, fsdp=2, tensor=2), 1, {"pipeline_microbatches": 2, "remat_policy": "full"}),
    (staged(stage=2, data=4), 2, {"pipeline_microbatches": 2, "pipeline_schedule": "circular",
                                  "pipeline_repeats": 2}),
    (staged(stage=2, data=4), 1, {"pipeline_microbatches": 4, "pipeline_schedule": "circular",
                                  "pipeline_repeats": 2}),
], ids=["gpipe-stage4-data2", "gpipe-stage2-fsdp2-tensor2-remat", "circular-M2-accumulated", "circular-M4"])
def test_pipelined_training_equals_one_device(mesh_config, num_microbatches, fields):
    assert_trains_as_one_device(train(mesh_config, False, num_microbatches, **fields), train(SINGLE, True))


MOE = {"num_experts": 4, "moe_top_k": 2, "moe_load_balancing_loss_weight": 0.1, "moe_router_z_loss_weight": 0.01}


@pytest.mark.slow
@pytest.mark.parametrize("mesh_config, num_microbatches, moe, fields", [
    (staged(stage=2, expert=2, data=2), 1, {"moe_every": 2}, {"pipeline_microbatches": 4}),
    (staged(stage=2, expert=2, fsdp=2), 2, {"moe_every": 1}, {"pipeline_microbatches": 2,
                                                              "pipeline_schedule": "circular", "pipeline_repeats": 2}),
], ids=["gpipe-stage2-expert2-data2", "circular-stage2-expert2-fsdp2-accumulated"])
def test_pipelined_moe_training_equals_one_device(mesh_config, num_microbatches, moe, fields):
    """MoE layers' auxiliary losses, summed over stages and averaged over micro-batches, train as one device's."""
    want = train(SINGLE, True, num_microbatches, **MOE, **moe)
    assert_trains_as_one_device(train(mesh_config, False, num_microbatches, **MOE, **moe, **fields), want,
                                ("loss", "grad_norm", "moe_aux_loss"))
    assert want[1][0]["moe_aux_loss"] > 0.1  # the losses are there: balance is >= 1 per MoE layer, weighted 0.1


@pytest.mark.slow
@pytest.mark.parametrize("saved_on, restored_on", [(staged(stage=4, data=2), SINGLE),
                                                   (SINGLE, staged(stage=4, data=2))], ids=["staged-to-plain",
                                                                                            "plain-to-staged"])
def test_checkpoint_moves_between_meshes_with_and_without_stages(tmp_path, saved_on, restored_on):
    fields = {"pipeline_microbatches": 4}
    saver = make_trainer(saved_on, saved_on is SINGLE, **fields)
    state = saver.init_state(jax.random.key(0))
    batch = host_batch()
    state, _ = saver.train_step(state, partitioning.global_batch(batch, saver.mesh), jax.random.key(1))
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=1)
    checkpointer.save(1, state, {"batches_consumed": 1})
    checkpointer.wait()
    restorer = make_trainer(restored_on, restored_on is SINGLE, **fields)
    restored, _ = checkpointer.restore(restorer.abstract_state, restorer.state_shardings)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), jax.device_get(state.params))
    want_params = train(SINGLE, single_device=True)[0][2]  # two steps on one device
    restored, _ = restorer.train_step(restored, partitioning.global_batch(batch, restorer.mesh), jax.random.key(1))
    assert max_diff(jax.device_get(restored.params), want_params) < 2e-6


def refused(model, mesh_config=None):
    mesh_config = mesh_config or staged(stage=4, data=2)
    mesh = partitioning.make_mesh(mesh_config)
    return Trainer(model, optax.sgd(LR), lambda _: LR, mesh, mesh_config.rules).init_state(jax.random.key(0))


def test_what_the_pipeline_does_not_run_is_refused_by_name():
    with pytest.raises(ValueError, match="pipeline stages run GPT-2 .* not T5Config's; map the logical axis"):
        refused(EncoderDecoder(T5Config(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                                        num_encoder_layers=4, num_decoder_layers=4, scan_layers=True,
                                        ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)))
    with pytest.raises(ValueError, match=r"4 layers \(scan steps of moe_every=2 layers\) do not split into 2 stages "
                                         "x pipeline_repeats=2"):
        refused(GPT2(GPT2Config(**BASE, num_experts=4, pipeline_schedule="circular", pipeline_repeats=2)),
                staged(stage=2, data=4))
    with pytest.raises(ValueError, match="set GPT2Config.scan_layers=True"):
        refused(GPT2(GPT2Config(**{**BASE, "scan_layers": False})))
    with pytest.raises(ValueError, match="4 layers do not split into 4 stages x pipeline_repeats=2"):
        refused(GPT2(GPT2Config(**BASE, pipeline_schedule="circular", pipeline_repeats=2, pipeline_microbatches=4)))
    with pytest.raises(ValueError, match="circular schedule needs pipeline_microbatches >= stages"):
        refused(GPT2(GPT2Config(**BASE, pipeline_schedule="circular", pipeline_microbatches=2)))
