"""Post-training quantization (`quantized(model)`): kernels against float64 NumPy absmax quantization, the
quantized model against the float model on the dequantized kernels and against qwix's own PTQ of the float
model, w8a8 against float64 NumPy integer products, scanned equal to unscanned, sharded equal to one device."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from flax import traverse_util

from ptmjax import partitioning
from ptmjax.compress.quantization import QuantizationSettings, quantize_params, quantized
from ptmjax.compress.quantization_scheme import absmax_calibration
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack
from ptmjax.layers.dense import Dense
from ptmjax.models import EncoderDecoder, T5Config

CONFIG = T5Config(
    vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=2, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
Q_MAX = {"int8": 127, "int4": 7}


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return {"encoder_input_tokens": rng.integers(1, 64, (4, 12), dtype=np.int32),
            "decoder_input_tokens": rng.integers(1, 64, (4, 6), dtype=np.int32)}


def float_params(model):
    return nn.unbox(model_api(model).init(jax.random.key(0)))


def logits(model, params, inputs):
    return model.apply({"params": params}, **inputs, enable_dropout=False)


def numpy_quantized(kernel, contracted, weights, tile=None):
    """float64 NumPy: symmetric absmax integers and scales, per output channel or per tile of the last
    contracted dim, and the weights over their scales before rounding."""
    q_max = Q_MAX[weights]
    w = np.asarray(kernel, np.float64)
    if tile is None:
        scale = np.abs(w).max(axis=tuple(range(contracted)), keepdims=True) / q_max
        return np.round(w / scale), scale, w / scale
    tiles = w.reshape(w.shape[:contracted - 1] + (w.shape[contracted - 1] // tile, tile) + w.shape[contracted:])
    scale = np.abs(tiles).max(axis=tuple(range(contracted - 1)) + (contracted,), keepdims=True) / q_max
    q = np.round(tiles / scale).reshape(w.shape)
    return q, scale.reshape(scale.shape[:contracted] + scale.shape[contracted + 1:]), (tiles / scale).reshape(w.shape)


@pytest.mark.parametrize("weights, tile, shape, contracted", [
    ("int8", None, (32, 2, 16), 1), ("int8", None, (2, 16, 32), 2), ("int4", None, (32, 64), 1),
    ("int4", 8, (32, 64), 1), ("int8", 4, (2, 16, 32), 2),
])
def test_kernels_quantize_as_float64_numpy_absmax(weights, tile, shape, contracted):
    kernel = jax.random.normal(jax.random.key(1), shape)
    q = QuantizationSettings(weights, tile_size=tile).quantize_kernel(kernel, contracted)
    expected_q, expected_scale, ratio = numpy_quantized(kernel, contracted, weights, tile)
    assert q.qvalue.dtype == {"int8": jnp.int8, "int4": jnp.int4}[weights]
    np.testing.assert_allclose(np.asarray(q.scale), expected_scale, rtol=1e-6)
    differ = np.asarray(q.qvalue).astype(np.int8) != expected_q
    at_ties = np.abs(np.abs(ratio) % 1 - 0.5) < 1e-4
    assert np.all(at_ties[differ])  # float32 rounds a weight at x.5 in float64 (a channel's absmax) either way


@pytest.mark.parametrize("weights, tile", [("int8", None), ("int4", None), ("int4", 8)])
@pytest.mark.slow
def test_weight_only_model_equals_the_float_model_on_its_dequantized_kernels(weights, tile):
    model = EncoderDecoder(CONFIG)
    params = float_params(model)
    q_model = quantized(model, weights, tile_size=tile)
    q_params = quantize_params(q_model, params)
    flat, q_flat = (traverse_util.flatten_dict(p, sep="/") for p in (params, q_params))
    dequantized = dict(flat)
    for path, kernel in q_flat.items():
        if path.endswith("kernel_scale"):
            kernel_path = path.removesuffix("_scale")
            q = q_flat[kernel_path]
            assert q.dtype == {"int8": jnp.int8, "int4": jnp.int4}[weights]
            dequantized[kernel_path] = np.asarray(qwix.dequantize(qwix.QArray(q, kernel)))
    quantized_paths = {p.removesuffix("_scale") for p in q_flat if p.endswith("kernel_scale")}
    assert quantized_paths == {p for p in flat if "layers_" in p and p.endswith("kernel")}
    for path in set(flat) - quantized_paths:
        np.testing.assert_array_equal(q_flat[path], flat[path])  # embeddings, norms, the output head
    reference = logits(model, traverse_util.unflatten_dict(dequantized, sep="/"), batch())
    np.testing.assert_allclose(logits(q_model, q_params, batch()), reference, rtol=1e-5, atol=1e-5)
    float_logits = logits(model, params, batch())
    error = np.abs(logits(q_model, q_params, batch()) - float_logits).max() / np.abs(float_logits).max()
    assert 0 < error < {"int8": 0.02, "int4": 0.3}[weights]


@pytest.mark.parametrize("activations", [None, "int8"])
@pytest.mark.slow
def test_the_quantized_model_equals_qwix_ptq_of_the_float_model(activations):
    """qwix's own PTQ (its interception of jax.lax.dot_general, the op ptmjax's Dense uses) of the float model."""
    model = EncoderDecoder(CONFIG)
    params = float_params(model)
    q_model = quantized(model, "int8", activations)
    ours = logits(q_model, quantize_params(q_model, params), batch())
    rule = qwix.QuantizationRule(module_path=r"(.*/)?layers_\d+/.*", op_names=("dot_general",),
                                 weight_qtype=jnp.int8, act_qtype=None if activations is None else jnp.int8,
                                 weight_calibration_method=absmax_calibration("int8"),
                                 act_calibration_method=absmax_calibration("int8"))
    qwix_model = qwix.quantize_model(model, qwix.PtqProvider([rule]))
    abstract = jax.eval_shape(lambda: qwix_model.init(jax.random.key(0), **batch(), enable_dropout=False))
    reference = qwix_model.apply({"params": qwix.quantize_params(params, abstract["params"])}, **batch(),
                                 enable_dropout=False)
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)


class Projection(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Dense((2, 8), ("embed", "heads", "kv"), name="layers_0")(x)


def test_w8a8_products_equal_float64_numpy_integer_products():
    x = jax.random.normal(jax.random.key(2), (3, 5, 16))
    model = Projection()
    params = nn.unbox(model.init(jax.random.key(3), x)["params"])
    q_model = quantized(model, "int8", "int8", targets=".*")
    q_params = q_model.apply({"params": params}, x, mutable=["params"])[1]["params"]
    qw, sw, _ = numpy_quantized(params["layers_0"]["kernel"], 1, "int8")
    xs = np.abs(np.asarray(x, np.float64)).max(axis=-1, keepdims=True) / 127
    qx = np.round(np.asarray(x, np.float64) / xs)
    expected = np.einsum("bti,ihk->bthk", qx, qw) * xs[..., None] * sw
    out = q_model.apply({"params": q_params}, x)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(q_params["layers_0"]["kernel"], qw.astype(np.int8))


def test_a_fresh_quantized_model_keeps_logical_axes_and_quantizes_its_float_init():
    model = EncoderDecoder(CONFIG)
    api = model_api(quantized(model, "int8"))
    axes = traverse_util.flatten_dict(api.logical_axes, sep="/")
    shapes = traverse_util.flatten_dict(api.abstract_params, sep="/")
    path = "encoder/layers_0/attention/query/kernel"
    assert shapes[path].dtype == jnp.int8 and tuple(axes[path]) == ("embed", "heads", "kv")
    assert shapes[path + "_scale"].shape == (1, 2, 16) and tuple(axes[path + "_scale"]) == (None, "heads", "kv")
    out_path = "encoder/layers_0/attention/out/kernel_scale"
    assert shapes[out_path].shape == (1, 1, 32) and tuple(axes[out_path]) == (None, None, "embed")
    fresh = nn.unbox(api.init(jax.random.key(0)))
    expected = quantize_params(quantized(model, "int8"), float_params(model))
    jax.tree.map(np.testing.assert_array_equal, fresh, expected)


@pytest.mark.slow
def test_scanned_quantized_layers_equal_unscanned_ones():
    model, scanned = EncoderDecoder(CONFIG), EncoderDecoder(CONFIG.with_scan_layers(True))
    params = float_params(model)
    q_model, q_scanned = quantized(model, "int4", tile_size=8), quantized(scanned, "int4", tile_size=8)
    q_params = quantize_params(q_model, params)
    q_scanned_params = quantize_params(q_scanned, layer_stack.scan(params, CONFIG))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),  # integers equal, scales to an ulp
                 layer_stack.unscan(q_scanned_params, CONFIG), q_params)
    np.testing.assert_allclose(logits(q_scanned, q_scanned_params, batch()), logits(q_model, q_params, batch()),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activations", [None, "int8"])
def test_a_sharded_quantized_model_equals_one_device(activations):
    """Quantized parameters bitwise, logits to float32 rounding (about 1e-6, against a quantization error of
    3e-2 to 5e-2 here), with int8 activations too."""
    model = EncoderDecoder(CONFIG)
    q_model = quantized(model, "int8", activations)
    api, params = model_api(q_model), float_params(model)
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        mesh = partitioning.make_mesh(mesh_config, devices)
        with jax.set_mesh(mesh):
            shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
            q_params = jax.jit(lambda p: quantize_params(q_model, p), out_shardings=shardings)(params)
            out = jax.jit(lambda p, b: logits(q_model, p, b))(q_params, partitioning.global_batch(batch(), mesh))
            results.append((jax.device_get(q_params), np.asarray(out)))
    (sharded_params, sharded), (single_params, single) = results
    jax.tree.map(np.testing.assert_array_equal, sharded_params, single_params)
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("settings, message", [
    ({"weights": "int2"}, "weights='int2' must be one of"),
    ({"activations": "int4"}, "activations='int4' must be None"),
    ({"tile_size": 0}, "tile_size=0 must be a positive int"),
    ({"targets": "("}, "targets='\\(' is not a valid regex"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        QuantizationSettings(**settings)


def test_float_kernels_targets_matching_nothing_and_bad_tiles_are_refused():
    model = EncoderDecoder(CONFIG)
    with pytest.raises(ValueError, match="holds a float kernel in a quantized model; quantize"):
        logits(quantized(model), float_params(model), batch())
    with pytest.raises(ValueError, match="targets='nothing' match no Dense module"):
        model_api(quantized(model, targets="nothing")).init(jax.random.key(0))
    with pytest.raises(ValueError, match="tile_size=5 does not divide a kernel's contracted dim of 32"):
        model_api(quantized(model, tile_size=5)).init(jax.random.key(0))
