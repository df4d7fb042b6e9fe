"""Quantization-aware training (`fake_quantized(model)`): the forward pass equals the float model on kernels
dequantized by float64 NumPy; gradients are the straight-through ones (the float model's at the dequantized
kernels) and equal qwix's own quantized training; a sharded QAT run equals one device; `ptmjax quantize` of a
trained run stores the integers it trained with; a TernaryBERT-style student distils from its float model."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import qwix
from compress.test_distillation import teacher_folder
from compress.test_quantization import numpy_quantized
from compress.test_quantization_scheme import groups, numpy_dequantized
from flax import traverse_util
from training.sharding_helpers import assert_updates_match, parameter_update

from ptmjax import cli, gin_files, partitioning
from ptmjax.compress import fake_quantization
from ptmjax.compress.distillation import Distillation
from ptmjax.compress.fake_quantization import fake_quantized
from ptmjax.compress.float_model import float_model
from ptmjax.compress.quantization_scheme import absmax_calibration
from ptmjax.convert import checkpoint
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run_spec import RunSpec

CONFIG = T5Config(
    vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=2, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
LENGTHS = {"inputs": 12, "targets": 6}
LAYER_KERNEL = r"(.*/)?layers_\d+/.*/kernel"


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return {"encoder_input_tokens": rng.integers(1, 64, (4, 12), dtype=np.int32),
            "decoder_input_tokens": rng.integers(1, 64, (4, 6), dtype=np.int32),
            "decoder_target_tokens": rng.integers(1, 64, (4, 6), dtype=np.int32)}


def float_params():
    return nn.unbox(model_api(EncoderDecoder(CONFIG)).init(jax.random.key(0)))


def logits(model, params, seed=0):
    inputs = {k: v for k, v in batch(seed).items() if k != "decoder_target_tokens"}
    return model.apply({"params": params}, **inputs, enable_dropout=False)


def loss(model, params):
    """The mean token cross-entropy of the logits (a loss of every parameter the forward pass reads)."""
    out = logits(model, params)
    targets = batch()["decoder_target_tokens"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(out), targets[..., None], -1))


def numpy_dequantized_params(params, weights, tile=None):
    """The float params with each layer kernel as float64 NumPy dequantizes it, contracted dims by name."""
    flat = traverse_util.flatten_dict(params, sep="/")
    for path, kernel in flat.items():
        if re.fullmatch(LAYER_KERNEL, path):
            contracted = 2 if path.endswith("attention/out/kernel") else 1
            if weights.startswith("int"):
                q, scale, _ = numpy_quantized(kernel, contracted, weights, tile)
                dequantized = groups(q, contracted, tile)[0] * np.expand_dims(scale, contracted) if tile else q * scale
            else:
                dequantized = numpy_dequantized(kernel, contracted, weights, tile)[1]
            flat[path] = dequantized.reshape(kernel.shape).astype(np.float32)
    return traverse_util.unflatten_dict(flat, sep="/")


@pytest.mark.parametrize("weights, tile", [("int8", None), ("int4", 16), ("ternary", None), ("binary", 8),
                                           ("nf4", 16)])
def test_the_forward_pass_is_the_float_model_on_numpy_dequantized_kernels(weights, tile):
    model, params = EncoderDecoder(CONFIG), float_params()
    ours = logits(fake_quantized(model, weights, tile_size=tile), params)
    reference = logits(model, numpy_dequantized_params(params, weights, tile))
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights, tile", [("int8", None), ("int4", 16), ("ternary", None), ("nf4", 16)])
@pytest.mark.slow
def test_gradients_are_straight_through_the_float_model_at_the_quantized_kernels(weights, tile):
    model, params = EncoderDecoder(CONFIG), float_params()
    qat = fake_quantized(model, weights, tile_size=tile)
    base, dequantized, _ = float_model(qat, params)
    np.testing.assert_array_equal(logits(qat, params), logits(base, dequantized))
    ours = jax.grad(lambda p: loss(qat, p))(params)
    straight_through = jax.grad(lambda p: loss(base, p))(dequantized)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ours, straight_through)


@pytest.mark.parametrize("activations", [None, "int8"])
def test_the_loss_equals_qwix_quantized_training(activations):
    """qwix's QtProvider on the float model's dot_general, with the same absmax bound. Only the loss: on the CPU
    the float Dense's own VJP (ptmjax/layers/dense.py) differentiates qwix's intercepted product, so qwix's
    gradients there are not its straight-through ones (the test above checks ours against their definition)."""
    model, params = EncoderDecoder(CONFIG), float_params()
    qat = fake_quantized(model, "int8", activations)
    rule = qwix.QtRule(module_path=r"(.*/)?layers_\d+/.*", op_names=("dot_general",), weight_qtype=jnp.int8,
                       act_qtype=None if activations is None else jnp.int8,
                       weight_calibration_method=absmax_calibration("int8"),
                       act_calibration_method=absmax_calibration("int8"))
    qwix_model = qwix.quantize_model(model, qwix.QtProvider([rule]))
    np.testing.assert_allclose(loss(qat, params), loss(qwix_model, params), rtol=1e-6)


def trained_states(model, mesh_config, devices, steps):
    """(initial parameters, parameters after `steps` SGD steps on random rows, the last step's loss)."""
    spec = RunSpec(model=model, batch_size=8, task_feature_lengths=LENGTHS, optimizer=optax.sgd, pack=False,
                   mesh_config=mesh_config)
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config, devices))
    state, rng = trainer.init_state(jax.random.key(0)), np.random.default_rng(0)
    initial = jax.device_get(state.params)
    for _ in range(steps):
        rows = {name: rng.integers(1, CONFIG.vocab_size, s.shape, dtype=s.dtype)
                for name, s in spec.abstract_batch(None).items()}
        rows["decoder_loss_weights"] = np.ones_like(rows["decoder_loss_weights"])
        state, metrics = trainer.train_step(state, partitioning.global_batch(rows, trainer.mesh), jax.random.key(1))
    return initial, jax.device_get(state.params), float(metrics["loss"])


@pytest.mark.parametrize("activations, steps, loss_rtol, update_tolerance", [(None, 3, 1e-6, 2e-3),
                                                                             ("int8", 1, 1e-3, 2e-2)])
def test_a_sharded_qat_run_equals_one_device(activations, steps, loss_rtol, update_tolerance):
    """Each parameter's update within `update_tolerance` of one device's (relative to its largest entry).

    With int8 activations the sharded products differ from one device's in float rounding, which moves an
    activation here and there across a rounding step of its int8 grid: measured, the loss 7e-5 apart and the
    first updates 0.5% (an unsharded product's error in a sharded layout would be tens of percent). SGD, since
    Adafactor's normalised update turns a near-zero gradient entry's rounding into a whole step of either sign."""
    model = fake_quantized(EncoderDecoder(CONFIG), "int8", activations)
    initial, sharded, sharded_loss = trained_states(model, partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None,
                                                    steps)
    _, single, single_loss = trained_states(model, partitioning.MeshConfig(data=1), jax.devices()[:1], steps)
    np.testing.assert_allclose(sharded_loss, single_loss, rtol=loss_rtol)
    assert_updates_match(parameter_update(initial, single), parameter_update(initial, sharded), update_tolerance)


def qat_folder(path, qat, params):
    """A run folder of the fake-quantized model `qat` (its config binds train.model = @fake_quantized())."""
    settings = qat.fake_quantization
    path.mkdir()
    float_gin = checkpoint.model_gin(fake_quantization.base_model(qat)).replace("train.model", "fake_quantized.model")
    (path / "config.gin").write_text(float_gin + "".join(
        f"fake_quantized.{name} = {getattr(settings, name)!r}\n" for name in ("weights", "tile_size"))
        + "train.model = @fake_quantized()\n")
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(5, params)
    checkpointer.close()


@pytest.mark.parametrize("weights, tile", [("ternary", None), ("int4", 16)])
def test_quantizing_a_qat_run_stores_the_integers_it_trained_with(tmp_path, capsys, weights, tile):
    qat, params = fake_quantized(EncoderDecoder(CONFIG), weights, tile_size=tile), float_params()
    qat_folder(tmp_path / "qat", qat, params)
    assert cli.main(["quantize", "--from", str(tmp_path / "qat"), "--to", str(tmp_path / "q")]) == 0
    assert "parameters" in capsys.readouterr().out
    folder = ModelDir(str(tmp_path / "q"))
    q_model, _ = gin_files.read_model_config(folder)
    assert (q_model.quantization.weights, q_model.quantization.tile_size) == (weights, tile)
    stored = folder.read_params(model_api(q_model).abstract_params, step=5)
    np.testing.assert_allclose(logits(q_model, stored), logits(qat, params), rtol=1e-5, atol=1e-5)
    assert cli.main(["quantize", "--from", str(tmp_path / "qat"), "--to", str(tmp_path / "q8"), "--weights",
                     "int8"]) == 1
    assert f"trained with fake quantization weights={weights!r}, not 'int8'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_fake_quantized_student_distils_from_its_float_model(tmp_path):
    """TernaryBERT: the ternary student's default teacher is its own float architecture, and a student that
    starts as the teacher's copy has a soft loss from quantization alone."""
    model = EncoderDecoder(CONFIG)
    objective = Distillation(teacher_dir=str(tmp_path / "teacher"), hard_weight=0.0, soft_weight=1.0)
    assert objective.teacher_model(fake_quantized(model, "ternary")) == model
    float_soft = distilled_soft_loss(tmp_path, model, model, objective)
    ternary_soft = distilled_soft_loss(tmp_path, fake_quantized(model, "ternary"), model, objective)
    assert float_soft < 1e-6 < ternary_soft


def distilled_soft_loss(tmp_path, student, teacher, objective):
    if not (tmp_path / "teacher").exists():
        teacher_folder(tmp_path, teacher)
    spec = RunSpec(model=student, batch_size=8, task_feature_lengths=LENGTHS, optimizer=adafactor, pack=False,
                   objective=objective, loss_config=LossConfig(z_loss=0.0))
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config))
    state = trainer.init_state(jax.random.key(0))  # seed 0: the teacher's own initialisation
    rng = np.random.default_rng(0)
    rows = {name: rng.integers(1, CONFIG.vocab_size, s.shape, dtype=s.dtype)
            for name, s in spec.abstract_batch(None).items()}
    rows["decoder_loss_weights"] = np.ones_like(rows["decoder_loss_weights"])
    _, metrics = trainer.train_step(state, partitioning.global_batch(rows, trainer.mesh), jax.random.key(1))
    return float(metrics["distill_soft"])
