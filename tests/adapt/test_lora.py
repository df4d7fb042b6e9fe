"""LoRA on tiny T5 and GPT-2: exact base outputs at init, merging, the update and its gradients against float64
numpy, scanned layers, dropout, targeting, and the model's identity (family, equality, gin)."""

from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_test_models import BASE_MODELS, GPT2_TINY, batch, init_params, with_random_lora, without_lora

from ptmjax.adapt.lora import LORA_PARAMS, LoraSettings, base_model, lora
from ptmjax.adapt.lora_merge import merge_lora
from ptmjax.families.model_api import model_api
from ptmjax.families.registry import DECODER_ONLY, family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack
from ptmjax.models import GPT2, Bert, BertConfig
from ptmjax.tree_paths import leaves_by_path

RANK, ALPHA = 4, 16.0  # scale alpha / rank = 4


def outputs(model: nn.Module, params: dict, name: str) -> np.ndarray:
    return np.asarray(model.apply({"params": params}, **model_api(model).model_inputs(batch(name))))


@pytest.mark.parametrize("name", ["t5", "gpt2"])
def test_a_fresh_lora_model_computes_exactly_the_base_model(name):
    model = lora(BASE_MODELS[name], RANK, ALPHA)
    params = init_params(model)
    lora_leaves = [(p, x) for p, x in leaves_by_path(params) if re.search(LORA_PARAMS, p)]
    assert lora_leaves and all(np.all(x == 0) for p, x in lora_leaves if p.endswith("lora_b"))
    base = without_lora(params)
    assert jax.tree.structure(base) == jax.tree.structure(model_api(BASE_MODELS[name]).abstract_params)
    np.testing.assert_array_equal(outputs(model, params, name), outputs(BASE_MODELS[name], base, name))


@pytest.mark.parametrize("name", ["t5", "gpt2"])
def test_the_merged_model_computes_what_the_lora_model_does(name):
    model = lora(BASE_MODELS[name], RANK, ALPHA)
    params = with_random_lora(init_params(model))
    merged = merge_lora(params, model)
    base_shapes = jax.tree.map(lambda s: s.shape, model_api(BASE_MODELS[name]).abstract_params)
    assert jax.tree.map(jnp.shape, merged) == base_shapes
    unmerged = outputs(model, params, name)
    assert np.abs(unmerged - outputs(BASE_MODELS[name], without_lora(params), name)).max() > 0.1  # the update matters
    np.testing.assert_allclose(outputs(base_model(model), merged, name), unmerged, rtol=1e-5, atol=2e-5)


def test_the_update_of_one_projection_is_scale_x_a_b_in_float64():
    model = lora(BASE_MODELS["gpt2"], RANK, ALPHA)
    params = with_random_lora(init_params(model))
    inputs = model_api(model).model_inputs(batch("gpt2"))
    capture = lambda module, _: module.scope.path in (("layers_0", "attention", "query"),  # noqa: E731
                                                      ("layers_0", "pre_attention_layer_norm"))
    _, lora_seen = model.apply({"params": params}, **inputs, capture_intermediates=capture)
    _, base_seen = BASE_MODELS["gpt2"].apply({"params": without_lora(params)}, **inputs, capture_intermediates=capture)
    layer, query = lora_seen["intermediates"]["layers_0"], params["layers_0"]["attention"]["query"]
    x = np.asarray(layer["pre_attention_layer_norm"]["__call__"][0], np.float64)  # [b, t, embed]
    a, b = (np.asarray(query[k], np.float64) for k in ("lora_a", "lora_b"))  # [embed, r], [r, heads, head_dim]
    expected = (ALPHA / RANK) * np.einsum("bte,er,rhd->bthd", x, a, b)
    update = layer["attention"]["query"]["__call__"][0] - base_seen["intermediates"]["layers_0"]["attention"]["query"][
        "__call__"][0]
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(np.asarray(update, np.float64), expected, rtol=1e-5, atol=1e-5)


def token_loss(model: nn.Module, params: dict) -> jax.Array:
    return model_api(model).loss(params, batch("gpt2"), LossConfig(z_loss=0.0))[0]


def test_gradients_reach_the_lora_parameters_as_the_chain_rule_through_the_merged_kernel_says():
    model = lora(BASE_MODELS["gpt2"], RANK, ALPHA)
    fresh = jax.grad(lambda p: token_loss(model, p))(init_params(model))
    for path, grad in leaves_by_path(fresh):  # B = 0, so dL/dA = x^T dL/dy B^T = 0 and only B moves first
        if path.endswith("lora_a"):
            assert np.all(np.asarray(grad) == 0), path
        elif path.endswith("lora_b"):
            assert np.abs(np.asarray(grad)).max() > 1e-4, path

    params = with_random_lora(init_params(model))
    grads = jax.grad(lambda p: token_loss(model, p))(params)
    assert all(np.abs(np.asarray(g)).max() > 1e-4 for p, g in leaves_by_path(grads) if re.search(LORA_PARAMS, p))
    merged_grads = jax.grad(lambda p: token_loss(base_model(model), p))(merge_lora(params, model))
    # d/dA L(W + s A B) = s dL/dW B^T and d/dB = s A^T dL/dW, from the merged model's gradient, in float64.
    for layer in ("layers_0", "layers_1"):
        for projection in ("query", "value"):
            g_w = np.asarray(merged_grads[layer]["attention"][projection]["kernel"], np.float64)  # [e, h, d]
            ab = params[layer]["attention"][projection]
            a, b = np.asarray(ab["lora_a"], np.float64), np.asarray(ab["lora_b"], np.float64)
            got = grads[layer]["attention"][projection]
            # atol: float32 gradients of entries up to about 0.5; an entry that cancels to 2e-3 keeps their
            # absolute error (2.1e-6 on a 2-core Intel Xeon), not a 1e-4 relative one.
            np.testing.assert_allclose(got["lora_a"], (ALPHA / RANK) * np.einsum("ehd,rhd->er", g_w, b), rtol=1e-4,
                                       atol=1e-5)
            np.testing.assert_allclose(got["lora_b"], (ALPHA / RANK) * np.einsum("er,ehd->rhd", a, g_w), rtol=1e-4,
                                       atol=1e-5)


def test_scanned_rematerialised_lora_equals_unscanned_and_merges_to_the_scanned_merge():
    plain = lora(BASE_MODELS["gpt2"], RANK, ALPHA)
    scanned = lora(GPT2(dataclasses.replace(GPT2_TINY, scan_layers=True, remat_policy="full")), RANK, ALPHA)
    boxed = model_api(scanned).boxed_abstract_params["layers"]["attention"]["query"]
    assert boxed["lora_a"].names == ("layers", "embed", None)
    assert boxed["lora_b"].names == ("layers", None, "heads", "kv")
    params = with_random_lora(init_params(plain))
    scanned_params = layer_stack.scan(params, scanned.config)
    np.testing.assert_allclose(outputs(scanned, scanned_params, "gpt2"), outputs(plain, params, "gpt2"), rtol=1e-5,
                               atol=1e-5)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
        merge_lora(scanned_params, scanned), layer_stack.scan(merge_lora(params, plain), scanned.config),
    )


def test_lora_dropout_applies_only_with_enable_dropout():
    with_dropout, without = lora(BASE_MODELS["gpt2"], RANK, ALPHA, dropout=0.5), lora(BASE_MODELS["gpt2"], RANK, ALPHA)
    params = with_random_lora(init_params(without))
    np.testing.assert_array_equal(outputs(with_dropout, params, "gpt2"), outputs(without, params, "gpt2"))
    inputs = model_api(with_dropout).model_inputs(batch("gpt2"))

    def train(seed: int) -> np.ndarray:
        rngs = {"dropout": jax.random.key(seed)}
        return np.asarray(with_dropout.apply({"params": params}, **inputs, enable_dropout=True, rngs=rngs))

    assert np.abs(train(0) - outputs(without, params, "gpt2")).max() > 0.1  # the base model has no dropout
    np.testing.assert_array_equal(train(0), train(0))
    assert np.abs(train(0) - train(1)).max() > 0.1


def lora_paths(model: nn.Module) -> set[str]:
    return {p for p, _ in leaves_by_path(model_api(model).abstract_params) if re.search(LORA_PARAMS, p)}


def test_targets_choose_the_adapted_projections_and_a_regex_matching_nothing_is_refused():
    pairs = [(i, ab) for i in range(2) for ab in "ab"]
    assert lora_paths(lora(BASE_MODELS["t5"])) == {
        f"{stack}/layers_{i}/{attention}/{projection}/lora_{ab}" for i, ab in pairs for projection in ("query", "value")
        for stack, attention in [("encoder", "attention"), ("decoder", "self_attention"),
                                 ("decoder", "encoder_decoder_attention")]
    }
    bert = Bert(BertConfig(
        vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16, type_vocab_size=2,
        dropout_rate=0.0, attention_dropout_rate=0.0,
    ))
    bert_paths = {f"layers_{i}/attention/{p}/lora_{ab}" for i, ab in pairs for p in ("query", "value")}
    assert lora_paths(lora(bert)) == bert_paths
    mlp_only = lora(BASE_MODELS["gpt2"], RANK, ALPHA, targets=r".*mlp/wi")
    assert lora_paths(mlp_only) == {f"layers_{i}/mlp/wi/lora_{ab}" for i, ab in pairs}
    with pytest.raises(ValueError, match=r"targets='query' match no Dense module of LoraGPT2 .*layers_0/attention/q"):
        model_api(lora(BASE_MODELS["gpt2"], targets="query")).init(jax.random.key(0))
    with pytest.raises(ValueError, match="already has LoRA"):
        lora(mlp_only)
    with pytest.raises(ValueError, match="rank=0 must be a positive int"):
        lora(BASE_MODELS["gpt2"], rank=0)


def test_a_lora_model_is_its_family_equal_to_an_equal_one_and_a_jit_static_argument():
    base = BASE_MODELS["gpt2"]
    model, same = lora(base, RANK, ALPHA), lora(base, RANK, ALPHA)
    assert isinstance(model, GPT2) and family_of(model) is DECODER_ONLY
    assert model == same and hash(model) == hash(same) and model != lora(base, RANK + 1, ALPHA)
    assert base_model(model) == base
    params = init_params(model)
    apply = jax.jit(lambda m, p, t: m.apply({"params": p}, t), static_argnums=0)
    tokens = batch("gpt2")["decoder_input_tokens"]
    np.testing.assert_array_equal(apply(model, params, tokens), apply(same, params, tokens))
    assert apply._cache_size() == 1


def test_lora_is_configured_with_gin():
    import ptmjax.configurables  # noqa: F401  (registers lora and the models)

    gin.clear_config()
    try:
        gin.parse_config([
            "lora.model = @GPT2()", "GPT2.config = @GPT2Config()", "lora.rank = 2", "lora.alpha = 4.0",
            "lora.targets = '.*attention/value'",
            *(f"GPT2Config.{f.name} = {getattr(GPT2_TINY, f.name)!r}" for f in dataclasses.fields(GPT2_TINY)
              if f.name in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_length")),
        ])
        model = gin.get_configurable("ptmjax.adapt.lora")()
    finally:
        gin.clear_config()
    assert isinstance(model, GPT2) and model.config.d_model == GPT2_TINY.d_model
    assert model.lora == LoraSettings(rank=2, alpha=4.0, dropout=0.0, targets=".*attention/value")
