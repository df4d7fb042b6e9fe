"""Distillation in the train step (`train.objective = @Distillation()`): the objective's terms against float64
NumPy computed from both models' own outputs and sown states; a student that is a copy of its teacher has zero
distillation loss and trains as on the family's loss; the teacher stays bit-identical, with no optimizer state;
the chunked soft loss equals the plain one; (data, fsdp, tensor) equals one device; bad settings are one-line
errors."""

import dataclasses

import jax
import numpy as np
import pytest
from reliability.reliability_helpers_a import assert_trees_equal

from ptmjax import partitioning
from ptmjax.compress.distillation import Distillation
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config
from ptmjax.training.optimizers import adafactor
from ptmjax.training.params_folder import ParamsFolder
from ptmjax.training.run_spec import RunSpec
from ptmjax.tree_paths import leaves_by_path

TEACHER = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
STUDENT = dataclasses.replace(TEACHER, num_encoder_layers=1, num_decoder_layers=1)
LENGTHS = {"inputs": 10, "targets": 6}


def teacher_folder(tmp_path, module, seed=0) -> str:
    """A model folder holding `module`'s parameters initialised from `seed`."""
    spec = RunSpec(model=module, batch_size=8, task_feature_lengths=LENGTHS, optimizer=adafactor, pack=False)
    params = spec.trainer(partitioning.make_mesh(spec.mesh_config)).init_state(jax.random.key(seed)).params
    folder = ParamsFolder(str(tmp_path), "teacher", config="")
    folder.save(1, params)
    folder.close()
    return str(tmp_path / "teacher")


def trainer_of(student, objective=None, mesh_config=None, loss_config=None, devices=None):
    spec = RunSpec(model=student, batch_size=8, task_feature_lengths=LENGTHS, optimizer=adafactor, pack=False,
                   objective=objective, mesh_config=mesh_config, loss_config=loss_config or LossConfig(z_loss=0.0))
    return spec.trainer(partitioning.make_mesh(spec.mesh_config, devices)), spec


def t5_batch(spec, trainer, seed=0):
    """Random rows with encoder padding and target weights that end early in some rows."""
    rng = np.random.default_rng(seed)
    batch = {name: rng.integers(1, TEACHER.vocab_size, s.shape).astype(s.dtype)
             for name, s in spec.abstract_batch(None).items()}
    batch["encoder_input_tokens"][0, 7:] = 0
    batch["encoder_input_tokens"][2, 4:] = 0
    weights = np.ones_like(batch["decoder_loss_weights"])
    weights[1, 4:] = 0
    batch["decoder_loss_weights"] = weights
    return batch, partitioning.global_batch(batch, trainer.mesh)


def softmax64(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sown(module, params, batch):
    """logits and the encoder's sown intermediates, float64."""
    inputs = {k: v for k, v in batch.items() if k != "decoder_target_tokens" and k != "decoder_loss_weights"}
    logits, variables = module.apply({"params": params}, **inputs, mutable=["intermediates"])
    encoder = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["intermediates"]["encoder"])
    return np.asarray(logits, np.float64), encoder


@pytest.mark.slow
def test_the_objective_equals_float64_terms_from_both_models_own_outputs(tmp_path):
    """Teacher 2 + 2 layers, student 1 + 1 (the uniform map: student layer 0 learns from teacher layer 1)."""
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), temperature=2.0, hard_weight=0.5,
                             soft_weight=0.7, hidden_weight=0.3, attention_weight=0.2, value_weight=0.6)
    trainer, spec = trainer_of(EncoderDecoder(STUDENT), objective)
    state = trainer.init_state(jax.random.key(1))
    student_params, teacher_params = jax.device_get((state.params, state.extra["teacher"]))
    batch, device_batch = t5_batch(spec, trainer)
    _, metrics = trainer.train_step(state, device_batch, jax.random.key(2))

    student_logits, student = sown(EncoderDecoder(STUDENT), student_params, batch)
    teacher_logits, teacher = sown(EncoderDecoder(TEACHER), teacher_params, batch)
    w = batch["decoder_loss_weights"].astype(np.float64)
    tokens = w.sum()
    log_q = np.log(softmax64(student_logits))
    hard = -np.take_along_axis(log_q, batch["decoder_target_tokens"][..., None], -1)[..., 0]
    p, q = softmax64(teacher_logits / 2.0), softmax64(student_logits / 2.0)
    soft = 4.0 * np.sum(p * (np.log(p) - np.log(q)), -1)
    real = (batch["encoder_input_tokens"] != 0).astype(np.float64)
    per_token = real * (w.sum(-1) / real.sum(-1))[:, None]
    hs, ht = student["layers_0"]["hidden_states"][0], teacher["layers_1"]["hidden_states"][0]
    cosine = np.sum(hs * ht, -1) / (np.linalg.norm(hs, axis=-1) * np.linalg.norm(ht, axis=-1))
    a_s = student["layers_0"]["attention"]["attention_weights"][0]
    a_t = teacher["layers_1"]["attention"]["attention_weights"][0]
    kept = real[:, None, None, :] > 0
    kl = np.mean(np.sum(np.where(kept, a_t * (np.log(np.where(kept, a_t, 1)) - np.log(np.where(kept, a_s, 1))), 0),
                        -1), 1)
    def relation(values):  # MiniLM: softmax(V Vᵀ / sqrt(d)) over the real keys
        scores = np.einsum("bhqd,bhkd->bhqk", values, values) / np.sqrt(values.shape[-1])
        return softmax64(np.where(kept, scores, -np.inf))

    r_s = relation(student["layers_0"]["attention"]["values"][0])
    r_t = relation(teacher["layers_1"]["attention"]["values"][0])
    value_kl = np.mean(np.sum(np.where(kept, r_t * (np.log(np.where(kept, r_t, 1)) - np.log(np.where(kept, r_s, 1))),
                                       0), -1), 1)
    expected = {
        "distill_value": 0.6 * np.sum(value_kl * per_token) / tokens,
        "distill_hard": 0.5 * np.sum(hard * w) / tokens, "distill_soft": 0.7 * np.sum(soft * w) / tokens,
        "distill_hidden": 0.3 * np.sum((1 - cosine) * per_token) / tokens,
        "distill_attention": 0.2 * np.sum(kl * per_token) / tokens,
    }
    for name, value in expected.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=2e-5, err_msg=name)
        assert value > 1e-3, name  # each term measured something
    np.testing.assert_allclose(float(metrics["loss"]), sum(expected.values()), rtol=2e-5)
    np.testing.assert_allclose(float(metrics["token_loss"]), sum(expected.values()), rtol=2e-5)


def test_the_patient_loss_equals_float64_bert_pkd_on_the_first_positions(tmp_path):
    """BERT-PKD: the unit-normalised first-position states of each mapped layer pair (a 2-layer student of a 2-layer
    teacher, the identity map), squared distances summed over the pairs, weighted by each row's targets."""
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    student_config = dataclasses.replace(TEACHER, num_decoder_layers=1)
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), hard_weight=0.0, soft_weight=0.0,
                             hidden_weight=0.4, hidden_loss="pkd")
    trainer, spec = trainer_of(EncoderDecoder(student_config), objective)
    state = trainer.init_state(jax.random.key(1))
    student_params, teacher_params = jax.device_get((state.params, state.extra["teacher"]))
    batch, device_batch = t5_batch(spec, trainer)
    _, metrics = trainer.train_step(state, device_batch, jax.random.key(2))
    _, student = sown(EncoderDecoder(student_config), student_params, batch)
    _, teacher = sown(EncoderDecoder(TEACHER), teacher_params, batch)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    patient = sum(np.sum((unit(student[f"layers_{i}"]["hidden_states"][0][:, 0])
                          - unit(teacher[f"layers_{i}"]["hidden_states"][0][:, 0])) ** 2, -1) for i in (0, 1))
    w = batch["decoder_loss_weights"].astype(np.float64)
    np.testing.assert_allclose(float(metrics["distill_hidden"]), 0.4 * np.sum(patient * w.sum(-1)) / w.sum(),
                               rtol=2e-5)
    assert float(metrics["distill_hidden"]) > 1e-3


@pytest.mark.slow
def test_a_copy_of_the_teacher_has_zero_distillation_loss_and_trains_as_on_the_family_loss(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, hard_weight=1.0, soft_weight=1.0, hidden_weight=1.0, attention_weight=1.0,
                             init_layers="uniform")
    trainer, spec = trainer_of(EncoderDecoder(TEACHER), objective)
    plain, _ = trainer_of(EncoderDecoder(TEACHER))
    state = trainer.init_state(jax.random.key(5))  # the student starts as a copy of its teacher
    teacher = jax.device_get(state.extra["teacher"])
    assert_trees_equal(jax.device_get(state.params), teacher)
    plain_state = plain.with_params(plain.init_state(jax.random.key(5)), teacher)
    _, device_batch = t5_batch(spec, trainer)
    rng = jax.random.key(2)
    state, metrics = trainer.train_step(state, device_batch, rng)
    plain_state, plain_metrics = plain.train_step(plain_state, device_batch, rng)
    for name in ("distill_soft", "distill_hidden", "distill_attention"):
        assert abs(float(metrics[name])) < 1e-6, (name, float(metrics[name]))
    np.testing.assert_allclose(float(metrics["loss"]), float(plain_metrics["loss"]), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 jax.device_get(state.params), jax.device_get(plain_state.params))


@pytest.mark.parametrize("init_layers, teacher_layer", [("alternate", 0), ("last", 1), ([1], 1)])
def test_a_half_depth_student_starts_from_the_teacher_layers_its_map_names(tmp_path, init_layers, teacher_layer):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), init_layers=init_layers)
    trainer, _ = trainer_of(EncoderDecoder(STUDENT), objective)
    fresh, _ = trainer_of(EncoderDecoder(STUDENT))
    state = trainer.init_state(jax.random.key(3))
    student = dict(leaves_by_path(jax.device_get(state.params)))
    teacher = dict(leaves_by_path(jax.device_get(state.extra["teacher"])))
    untouched = dict(leaves_by_path(jax.device_get(fresh.init_state(jax.random.key(3)).params)))
    taken = 0
    for path, value in student.items():
        source = path.replace("layers_0/", f"layers_{teacher_layer}/")
        if source in teacher:
            np.testing.assert_array_equal(value, teacher[source], err_msg=path)
            taken += 1
        else:  # what the teacher's layer lacks keeps the student's own initialisation
            np.testing.assert_array_equal(value, untouched[path], err_msg=path)
    assert taken >= len(student) - 2 and "encoder/layers_0/attention/query/kernel" in student


def test_the_teacher_stays_bit_identical_and_has_no_optimizer_state(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    trainer, spec = trainer_of(EncoderDecoder(STUDENT), Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER)))
    plain, _ = trainer_of(EncoderDecoder(STUDENT))
    state = trainer.init_state(jax.random.key(1))
    read = jax.device_get(state.extra["teacher"])
    for seed in range(3):
        state, metrics = trainer.train_step(state, t5_batch(spec, trainer, seed)[1], jax.random.key(seed))
        assert bool(metrics["finite"])
    assert_trees_equal(jax.device_get(state.extra["teacher"]), read)
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(plain.init_state(jax.random.key(1)).opt_state)
    assert int(state.step) == 3


@pytest.mark.slow
def test_the_chunked_soft_loss_equals_the_plain_one(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), temperature=3.0)
    results = []
    for chunk in (None, 4):  # 4 pads the 6 targets
        trainer, spec = trainer_of(EncoderDecoder(STUDENT), objective,
                                   loss_config=LossConfig(z_loss=0.0, logits_chunk_size=chunk))
        state, metrics = trainer.train_step(trainer.init_state(jax.random.key(1)), t5_batch(spec, trainer)[1],
                                            jax.random.key(2))
        results.append((jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}))
    (plain_params, plain), (chunked_params, chunked) = results
    for name in ("loss", "distill_soft", "distill_hard"):
        np.testing.assert_allclose(chunked[name], plain[name], rtol=1e-6, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), chunked_params, plain_params)


def check_two_sharded_steps_equal_one_device(student, objective, metric="loss"):
    """Two steps of `student` distilled by `objective` on (data=2, fsdp=2, tensor=2) equal them on one device:
    `metric` and the parameters."""
    runs = []
    for mesh_config, devices in ((partitioning.MeshConfig(data=1), jax.devices()[:1]),
                                 (partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None)):
        trainer, spec = trainer_of(student, objective, mesh_config, devices=devices)
        state = trainer.init_state(jax.random.key(1))
        for seed in range(2):
            state, metrics = trainer.train_step(state, t5_batch(spec, trainer, seed)[1], jax.random.key(seed))
        runs.append((jax.device_get(state.params), float(metrics[metric])))
    (one_params, one_value), (sharded_params, sharded_value) = runs
    np.testing.assert_allclose(sharded_value, one_value, rtol=2e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), sharded_params, one_params)


@pytest.mark.slow
def test_sharded_distillation_equals_one_device(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), hidden_weight=0.5, attention_weight=0.5)
    check_two_sharded_steps_equal_one_device(EncoderDecoder(STUDENT), objective)


def test_an_encoder_student_distils_its_masked_positions_and_layers(tmp_path):
    """BERT: the soft loss on the MLM positions, the hidden loss on the encoder's layers (path ())."""
    config = BertConfig(vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_length=16,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
    teacher_dir = teacher_folder(tmp_path, Bert(config))
    objective = Distillation(teacher_dir, teacher=Bert(config), hidden_weight=1.0, attention_weight=1.0,
                             layers="last")
    student = Bert(dataclasses.replace(config, num_layers=1))
    spec = RunSpec(model=student, batch_size=8, task_feature_lengths={"inputs": 10, "targets": 10},
                   optimizer=adafactor, pack=False, objective=objective)
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config))
    rng = np.random.default_rng(0)
    batch = {name: rng.integers(1, 64, s.shape).astype(s.dtype) for name, s in spec.abstract_batch(None).items()}
    batch["loss_mask"] = (rng.uniform(size=batch["loss_mask"].shape) < 0.3).astype(batch["loss_mask"].dtype)
    for name in ("sentence_label", "token_type_ids"):  # two sentence kinds, two token types
        batch[name] = rng.integers(0, 2, batch[name].shape).astype(batch[name].dtype)
    batch["input_tokens"][0, 6:] = 0  # padding
    _, metrics = trainer.train_step(trainer.init_state(jax.random.key(1)),
                                    partitioning.global_batch(batch, trainer.mesh), jax.random.key(2))
    terms = {name: float(metrics[name]) for name in ("distill_soft", "distill_hidden", "distill_attention")}
    assert all(value > 1e-4 for value in terms.values()), terms
    assert bool(metrics["finite"])


@pytest.mark.parametrize("settings, message", [
    ({"temperature": 0}, r"Distillation.temperature=0 must be a positive number"),
    ({"soft_weight": -1}, r"Distillation.soft_weight=-1: each weight must be a number >= 0"),
    ({"hidden_loss": "l2"}, r"Distillation.hidden_loss='l2': use one of cosine, mse, pkd"),
])
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        Distillation("runs/teacher", **settings)


def test_a_teacher_of_another_shape_or_width_is_refused_naming_the_fix(tmp_path):
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    with pytest.raises(ValueError, match=r"is another model than the EncoderDecoder Distillation.teacher builds: "
                                         r".*bind Distillation.teacher to the model it was trained as"):
        trainer_of(EncoderDecoder(STUDENT), Distillation(teacher_dir))[0].init_state(jax.random.key(0))
    wide = EncoderDecoder(dataclasses.replace(TEACHER, d_model=32))
    with pytest.raises(ValueError, match="compares hidden states of equal widths; the student's are 16 wide, "
                                         "the teacher's 32"):
        trainer_of(EncoderDecoder(STUDENT), Distillation(teacher_dir, teacher=wide, hidden_weight=1.0))


@pytest.mark.slow
def test_a_teacher_of_another_family_with_the_same_vocabulary_distils_its_logits(tmp_path):
    """A T5 teacher and a BART student read the same sequence-to-sequence batches: the soft term equals float64
    KL of the two models' own logits on them."""
    from ptmjax.models import Bart, BartConfig

    student = Bart(BartConfig(vocab_size=TEACHER.vocab_size, d_model=16, num_heads=2, num_encoder_layers=1,
                              num_decoder_layers=1, d_ff=32, max_length=16, dropout_rate=0.0))
    teacher_dir = teacher_folder(tmp_path, EncoderDecoder(TEACHER))
    objective = Distillation(teacher_dir, teacher=EncoderDecoder(TEACHER), hard_weight=0.0, soft_weight=1.0,
                             temperature=2.0)
    trainer, spec = trainer_of(student, objective)
    state = trainer.init_state(jax.random.key(1))
    student_params, teacher_params = jax.device_get((state.params, state.extra["teacher"]))
    batch, device_batch = t5_batch(spec, trainer)
    _, metrics = trainer.train_step(state, device_batch, jax.random.key(2))
    inputs = {k: v for k, v in batch.items() if k.endswith("_tokens") and k != "decoder_target_tokens"}
    q = softmax64(np.asarray(student.apply({"params": student_params}, **inputs), np.float64) / 2.0)
    p = softmax64(sown(EncoderDecoder(TEACHER), teacher_params, batch)[0] / 2.0)
    w = batch["decoder_loss_weights"].astype(np.float64)
    expected = np.sum(4.0 * np.sum(p * (np.log(p) - np.log(q)), -1) * w) / w.sum()
    np.testing.assert_allclose(float(metrics["distill_soft"]), expected, rtol=2e-5)
    assert expected > 1e-3
