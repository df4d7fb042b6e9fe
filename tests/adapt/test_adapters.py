"""Houlsby and Pfeiffer adapters on tiny T5, GPT-2 and BERT: exact base outputs when fresh, the adapter against
float64 numpy, where each placement puts them, and scanned layers."""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np
import pytest
from lora_test_models import batch, init_params
from peft_test_models import MODELS, outputs, redrawn, without

from ptmjax.adapt.adapters import ADAPTER_PARAMS, adapters
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack
from ptmjax.tree_paths import shapes_by_path


@pytest.mark.parametrize("name", ["t5", "gpt2", "bert"])
def test_a_fresh_adapter_model_computes_exactly_the_base_model(name):
    model = adapters(MODELS[name], "houlsby", bottleneck=4)
    params = init_params(model)
    base = without(params, ADAPTER_PARAMS)
    assert jax.tree.structure(base) == jax.tree.structure(model_api(MODELS[name]).abstract_params)
    np.testing.assert_array_equal(outputs(model, params, name), outputs(MODELS[name], base, name))
    assert np.abs(outputs(model, redrawn(params, ADAPTER_PARAMS), name) - outputs(model, params, name)).max() > 0.1


def test_the_feed_forward_adapter_is_h_plus_up_act_down_h_in_float64():
    model = adapters(MODELS["gpt2"], "pfeiffer", bottleneck=4, activation="gelu_exact")
    params = redrawn(init_params(model), ADAPTER_PARAMS)
    capture = lambda module, _: module.scope.path in (("layers_1", "mlp"), ("layers_1", "mlp", "wo"))  # noqa: E731
    _, seen = model.apply({"params": params}, **model_api(model).model_inputs(batch("gpt2")),
                          capture_intermediates=capture)
    mlp = seen["intermediates"]["layers_1"]["mlp"]
    h = np.asarray(mlp["wo"]["__call__"][0], np.float64)  # the block's output before its adapter
    p = {k: np.asarray(v, np.float64) for k, v in params["layers_1"]["mlp"].items() if k.startswith("adapter")}
    pre = h @ p["adapter_down"] + p["adapter_down_bias"]
    gelu = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / np.sqrt(2)))
    expected = h + gelu @ p["adapter_up"] + p["adapter_up_bias"]
    assert np.abs(expected - h).max() > 0.1
    np.testing.assert_allclose(np.asarray(mlp["__call__"][0], np.float64), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("placement", "modules"), [
    ("houlsby", {"encoder/layers_0/attention", "encoder/layers_0/mlp", "decoder/layers_0/self_attention",
                 "decoder/layers_0/mlp"}),
    ("pfeiffer", {"encoder/layers_0/mlp", "decoder/layers_0/mlp"}),
])
def test_the_placements_adapt_self_attention_and_feed_forward_or_feed_forward_alone(placement, modules):
    shapes = shapes_by_path(model_api(adapters(MODELS["t5"], placement, bottleneck=4)).abstract_params)
    adapted = {path.rsplit("/", 1)[0] for path in shapes if re.search(ADAPTER_PARAMS, path)}
    assert {path for path in adapted if "layers_0" in path} == modules  # cross-attention never
    assert len(adapted) == 2 * len(modules)  # two layers per stack
    assert shapes["encoder/layers_0/mlp/adapter_down"] == (32, 4)
    assert shapes["encoder/layers_0/mlp/adapter_up"] == (4, 32)


def test_scanned_layers_compute_what_unscanned_ones_do():
    plain = adapters(MODELS["t5"], bottleneck=4)
    config = dataclasses.replace(plain.config, scan_layers=True)
    scanned = adapters(MODELS["t5"].clone(config=config), bottleneck=4)
    params = redrawn(init_params(plain), ADAPTER_PARAMS)
    stacked = layer_stack.scan(params, config)
    assert jax.tree.map(np.shape, stacked) == jax.tree.map(np.shape, model_api(scanned).abstract_params)
    np.testing.assert_allclose(outputs(scanned, stacked, "t5"), outputs(plain, params, "t5"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"placement": "after"}, "placement='after' is unknown"),
    ({"bottleneck": 0}, "AdapterSettings.bottleneck must be a positive int, got 0"),
    ({"activation": "tanh"}, "activation='tanh' is unknown"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapters(MODELS["gpt2"], **kwargs)
