"""`Trainer(trainable=...)`: only matching parameters train; frozen ones keep their values and have no optimizer state.

The reference is an independent single-device computation: the full-tree
gradient of the same loss, then AdamW through `optax.multi_transform` with
the frozen leaves set to zero, applied by hand.
"""

import dataclasses
import re

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import GPT2, GPT2Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import leaves_by_path, path_name

PLAIN = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
MESH = MeshConfig(data=2, fsdp=2, tensor=2)
BIASES = (".*/bias",)
SECOND_LAYER = ("layers_1/.*",)
LR = 1e-2
MOMENTUM_SGD = optax.sgd(0.5, momentum=0.9)


def batch(step: int) -> dict[str, np.ndarray]:
    tokens = np.random.default_rng(step).integers(2, 64, (8, 12)).astype(np.int32)
    return {"decoder_input_tokens": np.roll(tokens, 1, axis=1), "decoder_target_tokens": tokens,
            "decoder_loss_weights": np.ones_like(tokens)}


def train(config: GPT2Config, trainable, initial, tx, steps: int = 3, batches=batch):
    """`steps` steps of `tx` on the (data=2, fsdp=2, tensor=2) mesh from the unscanned `initial` parameters."""
    trainer = Trainer(GPT2(config), tx, lambda _: LR, partitioning.make_mesh(MESH), MESH.rules,
                      LossConfig(z_loss=0.0), trainable=trainable)
    params = scan(initial, config) if config.scan_layers else initial
    state = jax.device_put(TrainState(step=np.zeros((), np.int32), params=params, opt_state=trainer.tx.init(params)),
                           trainer.state_shardings)
    losses = []
    for step in range(steps):
        state, metrics = trainer.train_step(state, partitioning.global_batch(batches(step), trainer.mesh),
                                            jax.random.key(1))
        losses.append(float(metrics["loss"]))
    params = jax.device_get(state.params)
    return (unscan(params, config) if config.scan_layers else params), state.opt_state, losses


def reference(trainable, initial, steps: int = 3):
    """The same steps on one device: the full gradient, then momentum SGD on the trainable leaves only.

    (Not Adam: the key projection's bias has a zero gradient up to rounding, which Adam would scale up.)"""
    api = model_api(GPT2(PLAIN))
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "train" if any(re.fullmatch(p, path_name(path)) for p in trainable) else "freeze", initial
    )
    tx = optax.multi_transform({"train": MOMENTUM_SGD, "freeze": optax.set_to_zero()}, labels)
    params, opt_state = initial, tx.init(initial)

    def loss(p, b):
        token_loss, _, stats = api.loss(p, b, LossConfig(z_loss=0.0))
        return token_loss / stats.counts["token_loss"]

    for step in range(steps):
        updates, opt_state = tx.update(jax.grad(loss)(params, batch(step)), opt_state, params)
        params = optax.apply_updates(params, updates)
    return jax.device_get(params)


@pytest.fixture(scope="module")
def initial():
    return jax.device_get(nn.unbox(model_api(GPT2(PLAIN)).init(jax.random.key(0))))


def test_frozen_parameters_keep_their_bits_and_have_no_optimizer_state(initial):
    params, opt_state, losses = train(PLAIN, BIASES, initial, optax.adamw(LR), steps=5, batches=lambda _: batch(0))
    for path, value in leaves_by_path(params):
        before = dict(leaves_by_path(initial))[path]
        if path.endswith("/bias"):
            assert not np.array_equal(value, before), path
        else:
            np.testing.assert_array_equal(value, before, err_msg=path)
    bias_sizes = sorted(v.size for p, v in leaves_by_path(initial) if p.endswith("/bias"))
    state_sizes = sorted(leaf.size for leaf in jax.tree.leaves(opt_state) if leaf.ndim > 0)
    assert state_sizes == sorted(bias_sizes * 2)  # AdamW's mu and nu of each bias, nothing for the frozen leaves
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("scan_layers", [False, True], ids=["plain", "scanned"])
@pytest.mark.parametrize("trainable", [BIASES, SECOND_LAYER], ids=["biases", "second_layer"])
@pytest.mark.slow
def test_sharded_frozen_training_equals_the_single_device_reference(initial, scan_layers, trainable):
    """Scanned layers hold both layers in one array: the frozen first layer gets a zero update."""
    got, _, _ = train(dataclasses.replace(PLAIN, scan_layers=scan_layers), trainable, initial, MOMENTUM_SGD)
    want = reference(trainable, initial)
    for (path, value), (_, expected) in zip(leaves_by_path(got), leaves_by_path(want), strict=True):
        np.testing.assert_allclose(value, expected, rtol=2e-5, atol=2e-6, err_msg=path)


def test_a_pattern_that_matches_nothing_is_named():
    with pytest.raises(ValueError, match=r"patterns \['.*/lora_a'\] match no parameter path"):
        Trainer(GPT2(PLAIN), optax.adamw(LR), lambda _: LR, partitioning.make_mesh(MESH), MESH.rules,
                trainable=[".*/bias", ".*/lora_a"])
