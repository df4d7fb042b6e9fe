"""BERT pre-training (MLM + NSP) through the core trainer.

The first SGD step's update equals the gradient of a hand-written objective
(mean MLM cross-entropy over the selected tokens + mean NSP cross-entropy over
the real rows); training on (data=2, fsdp=2, tensor=2), and with two
microbatches, equals one device; an all-padding row counts for nothing.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sharding_helpers import assert_updates_match, parameter_update

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import Bert, BertConfig
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

CONFIG = BertConfig(
    vocab_size=96, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
# Wide enough for XLA's SPMD gradient bug that an unpinned head activation met at d_model >= 64 (40-78% off).
WIDE = dataclasses.replace(CONFIG, d_model=128, d_ff=256)
BATCH, LENGTH, STEPS, LR = 8, 16, 3, 0.01


def pair_batch(padding_row: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    targets = rng.integers(3, CONFIG.vocab_size, (BATCH, LENGTH)).astype(np.int32)
    targets[:, -3:] = 0  # padding tail
    selected = (rng.random((BATCH, LENGTH)) < 0.3) & (targets > 0)
    types = (np.arange(LENGTH) >= LENGTH // 2).astype(np.int32) * (targets > 0)
    batch = {
        "input_tokens": np.where(selected, CONFIG.vocab_size - 1, targets).astype(np.int32),
        "target_tokens": targets,
        "loss_mask": selected.astype(np.int32),
        "token_type_ids": np.broadcast_to(types, (BATCH, LENGTH)).astype(np.int32),
        "sentence_label": rng.integers(0, 2, BATCH).astype(np.int32),
    }
    if padding_row:
        for value in batch.values():
            value[-1] = 0
    return batch


def hand_objective(params, batch) -> jax.Array:
    out = Bert(CONFIG).apply({"params": params}, batch["input_tokens"], batch["token_type_ids"])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(out.mlm_logits), batch["target_tokens"][..., None], -1)[..., 0]
    weights = batch["loss_mask"].astype(jnp.float32)
    rows = jnp.any(batch["input_tokens"] != 0, axis=1).astype(jnp.float32)
    nsp = -jnp.take_along_axis(jax.nn.log_softmax(out.sentence_pair_logits), batch["sentence_label"][:, None], -1)[:, 0]
    return jnp.sum(nll * weights) / jnp.sum(weights) + jnp.sum(nsp * rows) / jnp.sum(rows)


@functools.lru_cache(maxsize=None)
def train(mesh_config: MeshConfig, single_device: bool = False, num_microbatches: int = 1, padding_row: bool = False,
          config: BertConfig = CONFIG):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(
        Bert(config), optax.sgd(LR), lambda _: LR, mesh, mesh_config.rules, LossConfig(z_loss=0.0), num_microbatches
    )
    state = trainer.init_state(jax.random.key(0))
    initial = jax.device_get(state.params)
    batch = partitioning.global_batch(pair_batch(padding_row), mesh)
    params, metrics = [], []
    for _ in range(STEPS):
        state, step_metrics = trainer.train_step(state, batch, jax.random.key(1))
        params.append(jax.device_get(state.params))
        metrics.append(jax.device_get(step_metrics))
    return initial, params, metrics


@pytest.mark.parametrize("padding_row", [False, True])
def test_first_step_follows_mlm_plus_nsp_gradient(padding_row):
    initial, params, metrics = train(MeshConfig(), single_device=True, padding_row=padding_row)
    batch = jax.tree.map(jnp.asarray, pair_batch(padding_row))
    loss, want = jax.jit(jax.value_and_grad(hand_objective))(initial, batch)
    got = jax.tree.map(lambda before, after: (before - after) / LR, initial, params[0])
    # atol: (before - after) / LR loses ~1e-7 * |param| / LR to float32 cancellation
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5), got, want)
    first = metrics[0]
    np.testing.assert_allclose(first["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(first["loss"], first["token_loss"] + first["sentence_loss"], rtol=1e-6)
    np.testing.assert_allclose(first["batch_loss"], first["sentence_loss"], rtol=1e-6)  # NSP logs its batch loss
    assert first["num_tokens"] == pair_batch(padding_row)["loss_mask"].sum()
    assert metrics[-1]["loss"] < metrics[0]["loss"]


@pytest.mark.parametrize(
    "mesh_config,num_microbatches",
    [(MeshConfig(data=2, fsdp=2, tensor=2), 1), pytest.param(MeshConfig(data=4, tensor=2), 2, marks=pytest.mark.slow)],
    ids=["data2_fsdp2_tensor2", "data4_tensor2_microbatches2"],
)
def test_sharded_and_accumulated_runs_match_single_device(mesh_config, num_microbatches):
    _, want_params, want_metrics = train(MeshConfig(), single_device=True)
    _, got_params, got_metrics = train(mesh_config, num_microbatches=num_microbatches)
    for got, want in zip(got_metrics, want_metrics, strict=True):
        for name in ("loss", "token_loss", "sentence_loss", "sentence_accuracy"):
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, err_msg=name)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got_params[-1], want_params[-1])


def test_a_wide_sharded_first_update_equals_single_device():
    """Each parameter's first update (moving by more than 1e-6) within 1% of its largest entry, relatively: an atol
    on the parameters cannot see a wrong update of a parameter that barely moves."""
    initial, want, _ = train(MeshConfig(), single_device=True, config=WIDE)
    _, got, _ = train(MeshConfig(data=2, fsdp=2, tensor=2), config=WIDE)
    assert_updates_match(parameter_update(initial, want[0]), parameter_update(initial, got[0]))
