"""QLoRA (`lora(quantized(model, weights='nf4'))`): a fresh one computes what its quantized model does; its
training steps equal LoRA's on the float model with the dequantized kernels, the 4-bit base staying bit for bit;
it starts from a quantized folder; merged in float (`float_model`) it computes what it did; the reverse order
is refused."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from ptmjax import partitioning
from ptmjax.adapt.lora import LORA_PARAMS, lora
from ptmjax.compress.float_model import float_model
from ptmjax.compress.quantization import quantize_params, quantized
from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.training.init_checkpoint import initial_params
from ptmjax.training.optimizers import adafactor
from ptmjax.training.params_folder import ParamsFolder
from ptmjax.training.run_spec import RunSpec

CONFIG = T5Config(
    vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=2, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
LENGTHS = {"inputs": 12, "targets": 6}
LORA_TARGETS = r".*attention/(query|value)"


def nf4_model_and_params():
    model = quantized(EncoderDecoder(CONFIG), "nf4", tile_size=16)
    float_params = nn.unbox(model_api(EncoderDecoder(CONFIG)).init(jax.random.key(0)))
    return model, jax.device_get(quantize_params(model, float_params))


def trainer_and_rows(model, init_checkpoint=None):
    spec = RunSpec(model=model, batch_size=8, task_feature_lengths=LENGTHS, optimizer=adafactor, pack=False,
                   trainable=[LORA_PARAMS])
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config))
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(3):
        batch = {name: rng.integers(1, CONFIG.vocab_size, s.shape, dtype=s.dtype)
                 for name, s in spec.abstract_batch(None).items()}
        batch["decoder_loss_weights"] = np.ones_like(batch["decoder_loss_weights"])
        rows.append(partitioning.global_batch(batch, trainer.mesh))
    return trainer, rows


def trained(trainer, state, rows):
    for batch in rows:
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
    return jax.device_get(state.params), float(metrics["loss"])


def with_lora_of(params, lora_source):
    """`params` with the lora_a / lora_b leaves of `lora_source`."""
    flat, source = traverse_util.flatten_dict(params, sep="/"), traverse_util.flatten_dict(lora_source, sep="/")
    flat.update({path: value for path, value in source.items() if "/lora_" in path})
    return traverse_util.unflatten_dict(flat, sep="/")


def logits(model, params):
    rng = np.random.default_rng(3)
    return model.apply({"params": params}, rng.integers(1, 64, (2, 12)), rng.integers(1, 64, (2, 6)),
                       enable_dropout=False)


@pytest.mark.slow
def test_qlora_trains_as_lora_on_the_dequantized_float_model_and_keeps_its_base():
    q_model, q_params = nf4_model_and_params()
    qlora = lora(q_model, rank=4, targets=LORA_TARGETS)
    trainer, rows = trainer_and_rows(qlora)
    state = trainer.init_state(jax.random.key(1))
    start = jax.device_get(state.params)
    state = trainer.with_params(state, with_lora_of(q_params, start))
    np.testing.assert_array_equal(logits(qlora, jax.device_get(state.params)), logits(q_model, q_params))
    qlora_params, qlora_loss = trained(trainer, state, rows)

    base, dequantized, _ = float_model(q_model, q_params)
    float_lora = lora(base, rank=4, targets=LORA_TARGETS)
    float_trainer, _ = trainer_and_rows(float_lora)
    float_state = float_trainer.with_params(float_trainer.init_state(jax.random.key(1)),
                                            with_lora_of(dequantized, start))
    float_params, float_loss = trained(float_trainer, float_state, rows)

    np.testing.assert_allclose(qlora_loss, float_loss, rtol=1e-5)
    flat, reference = (traverse_util.flatten_dict(p, sep="/") for p in (qlora_params, float_params))
    for path, value in flat.items():
        if "/lora_" in path:
            np.testing.assert_allclose(value, reference[path], rtol=1e-4, atol=1e-6, err_msg=path)
        else:
            original = traverse_util.flatten_dict(q_params, sep="/")[path]
            assert value.dtype == original.dtype and np.array_equal(value, original), path
    assert any(not np.array_equal(flat[p], traverse_util.flatten_dict(start, sep="/")[p]) for p in flat
               if p.endswith("lora_b"))


def test_qlora_starts_from_a_quantized_folder(tmp_path):
    q_model, q_params = nf4_model_and_params()
    folder = ParamsFolder(str(tmp_path), "nf4", config="")
    folder.save(1, q_params)
    folder.close()
    qlora = lora(q_model, rank=4, targets=LORA_TARGETS)
    spec = RunSpec(model=qlora, batch_size=8, task_feature_lengths=LENGTHS, optimizer=adafactor, pack=False,
                   trainable=[LORA_PARAMS])
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config))
    params = jax.device_get(initial_params(str(tmp_path / "nf4"), trainer, jax.random.key(1)))
    flat = traverse_util.flatten_dict(params, sep="/")
    for path, value in traverse_util.flatten_dict(q_params, sep="/").items():
        assert flat[path].dtype == value.dtype and np.array_equal(flat[path], value), path
    assert sum("/lora_" in path for path in flat) == 2 * 2 * 4  # (query, value) x (a, b) x 4 attentions


def test_merged_in_float_it_computes_what_it_did():
    q_model, q_params = nf4_model_and_params()
    qlora = lora(q_model, rank=4, targets=LORA_TARGETS)
    params = nn.unbox(model_api(qlora).init_around(jax.random.key(2), q_params))
    flat = traverse_util.flatten_dict(params, sep="/")
    for path in flat:
        if path.endswith("lora_b"):  # a trained update, not zeros
            flat[path] = 0.05 * np.asarray(jax.random.normal(jax.random.key(len(path)), flat[path].shape))
    params = traverse_util.unflatten_dict(flat, sep="/")
    merged_model, merged, notes = float_model(qlora, params)
    assert merged_model == EncoderDecoder(CONFIG)
    assert notes == ["quantized nf4 kernels dequantized to float32", "LoRA updates merged into their float kernels"]
    np.testing.assert_allclose(logits(merged_model, merged), logits(qlora, params), rtol=1e-5, atol=1e-5)


def test_lora_under_quantization_is_refused_naming_the_order():
    with pytest.raises(ValueError, match=r"apply LoRA on top instead, lora\(quantized\(model\)\) \(QLoRA\)"):
        quantized(lora(EncoderDecoder(CONFIG)), "nf4")
