"""Orbax checkpoints: round trip, and restore onto a different mesh layout."""

import jax
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.training.optimizers import adamw
from ptmjax.training.schedules import warmup_cosine
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=128, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)


def make_trainer(mesh_config: MeshConfig) -> Trainer:
    schedule = warmup_cosine(peak_learning_rate=1e-3, warmup_steps=1, total_steps=10)
    mesh = partitioning.make_mesh(mesh_config)
    return Trainer(EncoderDecoder(CONFIG), adamw(schedule), schedule, mesh, mesh_config.rules)


def assert_trees_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    trainer = make_trainer(MeshConfig(data=1, fsdp=8))
    state = trainer.init_state(jax.random.key(0))
    checkpointer = Checkpointer(str(tmp_path_factory.mktemp("ckpt")), max_to_keep=2)
    for step in (1, 2, 3):
        checkpointer.save(step, state, {"batches_consumed": 10 * step})
    checkpointer.wait()
    return checkpointer, jax.device_get(state)


def test_keeps_the_last_n(saved):
    checkpointer, _ = saved
    assert checkpointer.all_steps() == [2, 3]
    assert checkpointer.latest_step() == 3


def test_round_trip_on_the_same_mesh(saved):
    checkpointer, want = saved
    trainer = make_trainer(MeshConfig(data=1, fsdp=8))
    state, data = checkpointer.restore(trainer.abstract_state, trainer.state_shardings)
    assert data == {"batches_consumed": 30}
    assert_trees_equal(state, want)


def test_restore_onto_a_different_mesh_reshards(saved):
    checkpointer, want = saved
    trainer = make_trainer(MeshConfig(data=2, fsdp=2, tensor=2))
    state, _ = checkpointer.restore(trainer.abstract_state, trainer.state_shardings, step=2)
    assert_trees_equal(state, want)
    jax.tree.map(lambda leaf, sharding: _assert_same_sharding(leaf, sharding), state, trainer.state_shardings)


def _assert_same_sharding(leaf, sharding):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    trainer = make_trainer(MeshConfig())
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        Checkpointer(str(tmp_path)).restore(trainer.abstract_state, trainer.state_shardings)
