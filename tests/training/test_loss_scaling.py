"""Dynamic loss scaling (ptmjax/training/loss_scaling.py): in float32 it trains bit for bit as a run without it;
an overflowing step is skipped and halves the scale without tripping the non-finite policy; the scale doubles
after `growth_interval` finite steps; float16 gradients too small for float16 match float32 with it, not without."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reliability.reliability_helpers_a import assert_trees_equal, records, run, saved_checkpoint

from ptmjax import partitioning
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, GPT2Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.loss_scaling import LOSS_SCALE, DynamicLossScale
from ptmjax.training.nonfinite import FINITE
from ptmjax.training.optimizers import adamw
from ptmjax.training.trainer import Trainer

CONFIG = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                    dropout_rate=0.0, attention_dropout_rate=0.0)


def trainer(extra_state=(), config=CONFIG, learning_rate=1e-2, num_microbatches=1):
    def schedule(step):
        return jnp.asarray(learning_rate)

    mesh_config = MeshConfig()
    return Trainer(GPT2(config), adamw(schedule, max_grad_norm=None), schedule,
                   partitioning.make_mesh(mesh_config), mesh_config.rules, LossConfig(z_loss=0.0),
                   num_microbatches=num_microbatches, extra_state=extra_state)


def batch(step: int, mesh, loss_weight: float = 1.0):
    tokens = np.random.default_rng(step).integers(2, 64, (8, 12)).astype(np.int32)
    weights = np.full(tokens.shape, loss_weight, np.float32)
    return partitioning.global_batch({"decoder_input_tokens": np.roll(tokens, 1, axis=1),
                                      "decoder_target_tokens": tokens, "decoder_loss_weights": weights}, mesh)


def train(run: Trainer, steps: int, overflow_at: int | None = None, loss_weight: float = 1.0):
    """States (before, after each step) and metrics; step `overflow_at` weights one token by 1e35, which
    overflows the scaled float32 gradients (2^15 * 1e35 > 3.4e38) but not the loss."""
    state = run.init_state(jax.random.key(0))
    states, metrics = [jax.device_get(state)], []
    for step in range(steps):
        inputs = batch(step, run.mesh, loss_weight)
        if step == overflow_at:
            weights = np.ones((8, 12), np.float32)
            weights[0, 0] = 1e35
            inputs = {**inputs, "decoder_loss_weights": partitioning.global_batch(
                {"w": weights}, run.mesh)["w"]}
        state, step_metrics = run.train_step(state, inputs, jax.random.key(1))
        states.append(jax.device_get(state))
        metrics.append(jax.device_get(step_metrics))
    return states, metrics


@pytest.mark.parametrize("num_microbatches", [1, 2])
@pytest.mark.slow
def test_in_float32_scaled_training_equals_unscaled_bit_for_bit(num_microbatches):
    scaled_states, scaled_metrics = train(trainer((DynamicLossScale(growth_interval=2),),
                                                  num_microbatches=num_microbatches), 4)
    plain_states, plain_metrics = train(trainer(num_microbatches=num_microbatches), 4)
    for scaled, plain in zip(scaled_states, plain_states, strict=True):
        assert_trees_equal((scaled.params, scaled.opt_state), (plain.params, plain.opt_state))
    for scaled, plain in zip(scaled_metrics, plain_metrics, strict=True):
        assert scaled["loss"] == plain["loss"] and scaled["grad_norm"] == plain["grad_norm"]
    # The scale grew twice meanwhile (2 finite steps each), and each step reported the scale it used.
    assert [float(m[LOSS_SCALE]) for m in scaled_metrics] == [2.0**15, 2.0**15, 2.0**16, 2.0**16]
    assert float(scaled_states[-1].extra[LOSS_SCALE]["scale"]) == 2.0**17


def test_an_overflow_skips_exactly_its_step_halves_the_scale_and_training_goes_on():
    bad = 2
    states, metrics = train(trainer((DynamicLossScale(growth_interval=3),)), 5, overflow_at=bad)
    assert not np.isfinite(metrics[bad]["grad_norm"]) and np.isfinite(metrics[bad]["loss"])
    assert [bool(m[FINITE]) for m in metrics] == [True] * 5  # the non-finite policy sees nothing
    before, skipped = states[bad], states[bad + 1]
    assert_trees_equal((skipped.params, skipped.opt_state), (before.params, before.opt_state))
    assert [float(m[LOSS_SCALE]) for m in metrics] == [2.0**15, 2.0**15, 2.0**15, 2.0**14, 2.0**14]
    assert [int(s.extra[LOSS_SCALE]["finite_steps"]) for s in states] == [0, 1, 2, 0, 1, 2]
    for step in set(range(5)) - {bad}:  # every other step trains every parameter
        changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), states[step].params, states[step + 1].params)
        assert all(jax.tree.leaves(changed))


def test_an_overflow_at_the_minimum_scale_goes_to_the_non_finite_policy():
    scaling = DynamicLossScale(initial_scale=2.0**15, minimum_scale=2.0**15)
    states, metrics = train(trainer((scaling,)), 2, overflow_at=1)
    assert [bool(m[FINITE]) for m in metrics] == [True, False]
    assert float(states[-1].extra[LOSS_SCALE]["scale"]) == 2.0**15


def test_the_scale_doubles_after_growth_interval_finite_steps_and_stops_at_its_maximum():
    scaling = DynamicLossScale(initial_scale=4.0, growth_interval=2, maximum_scale=16.0)
    value = scaling.init(None, None)
    scales = []
    for finite in (True, True, True, False, True, True, True, True, True, True):
        value = scaling.after_step(value, jnp.asarray(finite))
        scales.append(float(value["scale"]))
    assert scales == [4.0, 8.0, 8.0, 4.0, 4.0, 8.0, 8.0, 16.0, 16.0, 16.0]


@pytest.mark.parametrize("field, value", [("initial_scale", 3.0), ("minimum_scale", 0.0), ("growth_interval", 0),
                                          ("initial_scale", 2.0**30)])
def test_a_bad_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=f"DynamicLossScale.{field}"):
        DynamicLossScale(**{field: value})


def test_float16_gradients_too_small_for_float16_are_right_with_loss_scaling_and_wrong_without():
    """Loss weights of 1e-6 make per-token gradients of ~1e-8, under float16's smallest subnormal (6e-8)."""
    half = dataclasses.replace(CONFIG, dtype="float16")
    scaling = (DynamicLossScale(initial_scale=2.0**10),)
    runs = {"float32": trainer(config=CONFIG, learning_rate=1e-3),
            "scaled": trainer(scaling, half, learning_rate=1e-3), "unscaled": trainer(config=half, learning_rate=1e-3)}
    metrics = {name: train(run, 4, loss_weight=1e-6)[1] for name, run in runs.items()}
    loss, grad_norm = ({name: np.array([m[key] for m in ms]) for name, ms in metrics.items()}
                       for key in ("loss", "grad_norm"))
    assert [float(m[LOSS_SCALE]) for m in metrics["scaled"]] == [2.0**10] * 4  # no overflow
    np.testing.assert_allclose(grad_norm["scaled"], grad_norm["float32"], rtol=5e-3)  # measured 2.3e-3
    np.testing.assert_allclose(loss["scaled"], loss["float32"], rtol=1e-4)  # measured 3.7e-5
    assert np.max(np.abs(grad_norm["unscaled"] / grad_norm["float32"] - 1)) > 0.2  # measured 1.26


@pytest.mark.slow
def test_a_resumed_run_carries_the_scale_and_its_count_and_equals_an_uninterrupted_one(tmp_path):
    scaling = [DynamicLossScale(initial_scale=2.0**10, growth_interval=3)]
    run(tmp_path / "straight", num_steps=4, extra_state=scaling)
    run(tmp_path / "resumed", num_steps=2, extra_state=scaling)  # 2 of the 3 finite steps before growth
    run(tmp_path / "resumed", num_steps=4, extra_state=scaling)
    want, got = saved_checkpoint(tmp_path / "straight", 4)["state"], saved_checkpoint(tmp_path / "resumed", 4)["state"]
    assert_trees_equal(got, want)
    assert float(got["extra"][LOSS_SCALE]["scale"]) == 2.0**11 and int(got["extra"][LOSS_SCALE]["finite_steps"]) == 1
    assert [r[LOSS_SCALE] for r in records(tmp_path / "resumed") if LOSS_SCALE in r] == [2.0**10] * 3 + [2.0**11]
