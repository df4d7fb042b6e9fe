"""The jitted train step keeps the old state, bit for bit, in a step whose loss and gradient are not finite,
reports it as metrics['finite'] = False, and trains on in the steps around it."""

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, GPT2Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.nonfinite import FINITE
from ptmjax.training.optimizers import adamw
from ptmjax.training.trainer import Trainer

CONFIG = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
BAD_STEP = 1


def batch(step: int, poisoned: bool) -> dict[str, np.ndarray]:
    tokens = np.random.default_rng(step).integers(2, 64, (8, 12)).astype(np.int32)
    weights = np.ones(tokens.shape, np.float32)
    if poisoned:
        weights[0, 0] = np.nan  # a NaN loss and gradient
    return {"decoder_input_tokens": np.roll(tokens, 1, axis=1), "decoder_target_tokens": tokens,
            "decoder_loss_weights": weights}


def test_a_non_finite_step_keeps_the_state_and_the_steps_around_it_train():
    def schedule(step):
        return jnp.asarray(1e-2)

    mesh_config = MeshConfig()
    trainer = Trainer(GPT2(CONFIG), adamw(schedule, max_grad_norm=None), schedule,
                      partitioning.make_mesh(mesh_config), mesh_config.rules, LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(0))
    states, finite = [jax.device_get(state)], []
    for step in range(3):
        inputs = partitioning.global_batch(batch(step, step == BAD_STEP), trainer.mesh)
        state, metrics = trainer.train_step(state, inputs, jax.random.key(1))
        states.append(jax.device_get(state))
        finite.append(bool(metrics[FINITE]))
    assert finite == [True, False, True]
    before, skipped = states[BAD_STEP], states[BAD_STEP + 1]
    jax.tree.map(np.testing.assert_array_equal, (skipped.params, skipped.opt_state), (before.params, before.opt_state))
    for older, newer in ((states[0], states[1]), (states[2], states[3])):
        changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), older.params, newer.params)
        assert all(jax.tree.leaves(changed))
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(states[-1].params))
