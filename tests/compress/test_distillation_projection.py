"""TinyBERT's learned projection for a student narrower than its teacher (`hidden_projection`), and the
distillation weights' schedules: the projected squared-error term and its gradient against float64 NumPy, the
student computing what its base model computes, export leaving the projection out, one-line errors, and a
scheduled weight read at the run's step count."""

import dataclasses

import gin
import jax
import numpy as np
import optax
import pytest
from compress.test_distillation import (
    TEACHER,
    check_two_sharded_steps_equal_one_device,
    sown,
    t5_batch,
    teacher_folder,
    trainer_of,
)
from flax import linen as nn

from ptmjax.compress.distillation import Distillation
from ptmjax.compress.distillation_weights import STEP
from ptmjax.compress.float_model import float_model
from ptmjax.compress.hidden_projection import PROJECTION, hidden_projection
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import EncoderDecoder

NARROW = dataclasses.replace(TEACHER, d_model=8, head_dim=4, d_ff=16, num_encoder_layers=1, num_decoder_layers=1)


def narrow_student():
    return hidden_projection(EncoderDecoder(NARROW), teacher_width=TEACHER.d_model)


def projected_term(batch, student, teacher, w):
    """float64: (the per-token squared error through W of student layer 0 against teacher layer 1, weighted as
    the objective weights it; d term / dW)."""
    hs, ht = student["layers_0"]["hidden_states"][0], teacher["layers_1"]["hidden_states"][0]
    weights = batch["decoder_loss_weights"].astype(np.float64)
    real = (batch["encoder_input_tokens"] != 0).astype(np.float64)
    per_token = real * (weights.sum(-1) / real.sum(-1))[:, None]
    error = hs @ w - ht  # [b, s, teacher width]
    term = np.sum(np.mean(error**2, -1) * per_token)
    gradient = np.einsum("bsi,bsj->ij", hs * per_token[..., None], error) * 2 / ht.shape[-1]
    return term, gradient, weights.sum()


@pytest.mark.slow
def test_the_projected_hidden_loss_and_its_gradient_equal_float64(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), hard_weight=0.0, soft_weight=0.0,
                             hidden_weight=0.3, hidden_loss="mse")
    trainer, spec = trainer_of(narrow_student(), objective)
    state = trainer.init_state(jax.random.key(1))
    params, teacher_params = jax.device_get((state.params, state.extra["teacher"]))
    w = np.asarray(params["encoder"][PROJECTION], np.float64)
    assert w.shape == (NARROW.d_model, TEACHER.d_model)
    batch, device_batch = t5_batch(spec, trainer)
    api = model_api(trainer.api.module)
    loss = lambda p: objective(api, p, batch, LossConfig(z_loss=0.0), None, state.extra)[0]  # noqa: E731
    grads = jax.device_get(jax.jit(jax.grad(loss))(state.params))
    new_state, metrics = trainer.train_step(state, device_batch, jax.random.key(2))  # donates `state`

    _, student = sown(EncoderDecoder(NARROW), params, batch)
    _, teacher = sown(EncoderDecoder(TEACHER), teacher_params, batch)
    term, gradient, tokens = projected_term(batch, student, teacher, w)
    np.testing.assert_allclose(float(metrics["distill_hidden"]), 0.3 * term / tokens, rtol=2e-5)
    assert term > 1e-3

    np.testing.assert_allclose(np.asarray(grads["encoder"][PROJECTION]), 0.3 * gradient, rtol=2e-4, atol=1e-7)
    assert not np.array_equal(jax.device_get(new_state.params["encoder"][PROJECTION]), w)  # trained with the student


def test_the_student_computes_its_base_model_and_exports_without_the_projection(tmp_path):
    student = narrow_student()
    params = jax.device_get(nn.unbox(model_api(student).init(jax.random.key(0))))
    model, float_params, notes = float_model(student, params)
    assert model == EncoderDecoder(NARROW) and PROJECTION not in float_params["encoder"]
    assert notes == ["the distillation's hidden-state projection left out (only training reads it)"]
    rng = np.random.default_rng(0)
    tokens = {"encoder_input_tokens": rng.integers(1, 64, (2, 7)), "decoder_input_tokens": rng.integers(1, 64, (2, 5))}
    np.testing.assert_array_equal(np.asarray(student.apply({"params": params}, **tokens)),
                                  np.asarray(model.apply({"params": float_params}, **tokens)))


def test_unequal_widths_and_unread_projections_are_one_line_errors_naming_the_fix(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    teacher = EncoderDecoder(TEACHER)
    with pytest.raises(ValueError, match=r"hidden_loss='mse' compares hidden states of equal widths; the student's "
                                         r"are 8 wide, the teacher's 16: give the student TinyBERT's learned "
                                         r"projection: train.model = @hidden_projection\(\), "
                                         r"hidden_projection.teacher_width = 16"):
        trainer_of(EncoderDecoder(NARROW), Distillation(teacher_dir, teacher=teacher, hidden_weight=1.0,
                                                        hidden_loss="mse"))
    with pytest.raises(ValueError, match=r"is read only by Distillation.hidden_loss = 'mse' with hidden_weight > 0 "
                                         r"\(it has 'cosine', 1.0\)"):
        trainer_of(narrow_student(), Distillation(teacher_dir, teacher=teacher, hidden_weight=1.0))
    with pytest.raises(ValueError, match=r"hidden_projection.teacher_width=12 but the teacher's hidden states are 16 "
                                         r"wide; set it to 16"):
        trainer_of(hidden_projection(EncoderDecoder(NARROW), 12),
                   Distillation(teacher_dir, teacher=teacher, hidden_weight=1.0, hidden_loss="mse"))


@pytest.mark.slow
def test_a_scheduled_weight_is_read_at_the_runs_step_count(tmp_path):
    """The soft term's weight from a linear schedule at the stored step count equals a constant weight of that
    value on the same state; the count advances with each finite step."""
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    student = EncoderDecoder(dataclasses.replace(TEACHER, num_encoder_layers=1))
    schedule = optax.linear_schedule(init_value=2.0, end_value=0.0, transition_steps=8)
    scheduled, spec = trainer_of(student, Distillation(teacher_dir, soft_weight=schedule, teacher=EncoderDecoder(
        TEACHER)))
    constant, _ = trainer_of(student, Distillation(teacher_dir, soft_weight=1.5, teacher=EncoderDecoder(TEACHER)))
    state = scheduled.init_state(jax.random.key(1))
    assert int(state.extra[STEP]) == 0
    state = state.replace(extra={**state.extra, STEP: state.extra[STEP] + 2})  # schedule(2) = 1.5
    plain_state = constant.init_state(jax.random.key(1))
    _, device_batch = t5_batch(spec, scheduled)
    state, metrics = scheduled.train_step(state, device_batch, jax.random.key(2))
    _, plain_metrics = constant.train_step(plain_state, device_batch, jax.random.key(2))
    np.testing.assert_allclose(float(metrics["distill_soft"]), float(plain_metrics["distill_soft"]), rtol=1e-6)
    assert float(metrics["distill_soft"]) > 1e-3 and int(state.extra[STEP]) == 3


def test_gin_binds_a_schedule_to_a_weight():
    import ptmjax.configurables  # noqa: F401  (registers the schedules)

    with gin.unlock_config():
        gin.parse_config("""
            Distillation.teacher_dir = 'runs/teacher'
            Distillation.hidden_weight = @hidden/optax.linear_schedule()
            hidden/optax.linear_schedule.init_value = 1.0
            hidden/optax.linear_schedule.end_value = 0.0
            hidden/optax.linear_schedule.transition_steps = 10
        """)
    try:
        objective = gin.get_configurable("ptmjax.compress.Distillation")()
    finally:
        gin.clear_config()
    assert float(objective.hidden_weight(5)) == 0.5
    with pytest.raises(ValueError, match=r"Distillation.value_weight='x': each weight must be a number >= 0 \(0 "
                                         r"leaves its term out\) or an optax schedule"):
        Distillation("runs/teacher", value_weight="x")


def test_the_tinybert_demo_trains_the_layers_first_then_the_logits_of_a_narrower_student():
    from ptmjax import gin_files

    try:
        gin_files.parse_gin(["runs/tinybert_demo.gin"])
        objective = gin.query_parameter("train.objective").scoped_configurable_fn()
        student = gin.query_parameter("train.model").scoped_configurable_fn()
    finally:
        gin.clear_config()
    assert student.config.d_model == 32 and student.hidden_projection.teacher_width == 64
    assert objective.teacher.config.d_model == 64 and objective.hidden_loss == "mse"
    weights = {name: [float(getattr(objective, name)(step)) for step in (0, 99, 100, 199)]
               for name in ("hidden_weight", "attention_weight", "hard_weight", "soft_weight")}
    assert weights == {"hidden_weight": [1, 1, 0, 0], "attention_weight": [1, 1, 0, 0],
                       "hard_weight": [0, 0, 1, 1], "soft_weight": [0, 0, 1, 1]}


@pytest.mark.slow
def test_a_sharded_projected_student_with_a_scheduled_weight_equals_one_device(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), hidden_loss="mse", attention_weight=0.5,
                             hidden_weight=optax.linear_schedule(1.0, 0.5, transition_steps=2))
    check_two_sharded_steps_equal_one_device(narrow_student(), objective, "distill_hidden")
