"""Prefix tuning on tiny GPT-2, T5, BART and BERT: prefixes equal to the keys and values of a real text compute
what GPT-2 computes on that text prepended; the reparameterisation MLP against float64 numpy and its folding;
which attentions get a prefix and what they attend to; rematerialised layers; refusals."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_test_models import batch, init_params
from peft_test_models import MODELS, outputs, redrawn, token_inputs, without

from ptmjax.adapt.prefix_tuning import PREFIX_PARAMS, fold_prefixes, prefix_tuning
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig

TEXT = np.array([[7, 8, 9, 10]] * 2, np.int32)


def keys_and_values(model, params, tokens) -> jax.Array:
    """[layers, 2, heads, n, head_dim]: the keys and values each GPT-2 layer computes for `tokens` (row 0)."""
    capture = lambda module, _: module.scope.path[-1:] in (("key",), ("value",))  # noqa: E731
    _, seen = model.apply({"params": params}, tokens, capture_intermediates=capture)
    attention = [seen["intermediates"][f"layers_{i}"]["attention"] for i in range(model.config.num_layers)]
    return jnp.stack([
        jnp.stack([layer[k]["__call__"][0][0].transpose(1, 0, 2) for k in ("key", "value")]) for layer in attention
    ])


@pytest.mark.slow
def test_prefixes_of_a_real_texts_keys_and_values_compute_gpt2_on_that_text_prepended():
    base, n = MODELS["gpt2"], TEXT.shape[1]
    params = init_params(base)
    model = prefix_tuning(base, length=n, hidden=None)
    assert model_api(model).abstract_params["prefix_keys_values"].shape == (2, 2, 4, n, 8)
    prefixed = {**params, "prefix_keys_values": keys_and_values(base, params, TEXT)}
    tokens = token_inputs("gpt2")
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]) + n, tokens.shape)  # the text holds positions 0..n-1
    got = model.apply({"params": prefixed}, tokens, decoder_positions=positions)
    want = base.apply({"params": params}, jnp.concatenate([TEXT, tokens], axis=1))[:, n:]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_the_mlp_computes_the_prefixes_in_float64_and_folding_it_keeps_the_outputs():
    model = prefix_tuning(MODELS["t5"], length=3, hidden=8)
    params = redrawn(init_params(model), PREFIX_PARAMS)
    folded = fold_prefixes(params, model)
    for stack in ("encoder", "decoder"):
        p = {k.removeprefix("prefix_"): np.asarray(v, np.float64) for k, v in params[stack].items()
             if k.startswith("prefix_")}
        hidden = np.tanh(p["embedding"] @ p["wi"] + p["wi_bias"])  # [n, 8]
        want = np.einsum("nm,mlchd->lchnd", hidden, p["wo"]) + p["wo_bias"][:, :, :, None]
        assert want.shape == (2, 2, 4, 3, 8)  # [layers, key/value, heads, n, head_dim]
        np.testing.assert_allclose(folded[stack]["prefix_keys_values"], want, rtol=1e-5, atol=1e-5)
    unfolded = outputs(model, params, "t5")
    assert np.abs(unfolded - outputs(MODELS["t5"], without(params, PREFIX_PARAMS), "t5")).max() > 0.1
    np.testing.assert_allclose(outputs(prefix_tuning(MODELS["t5"], 3, None), folded, "t5"), unfolded, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_self_attentions_attend_to_the_prefix_and_cross_attention_does_not(name):
    model = prefix_tuning(MODELS[name], length=3, hidden=8)
    params = init_params(model)
    assert params["decoder"]["prefix_wo"].shape == (8, 2, 2, 4, 8)  # [hidden, layers, key/value, heads, head_dim]
    inputs = model_api(model).model_inputs(batch(name))
    _, seen = model.apply({"params": params}, **inputs, mutable=["intermediates"])
    weights = lambda *path: seen["intermediates"][path[0]]["layers_1"][path[1]]["attention_weights"][0]  # noqa: E731
    assert weights("encoder", "attention").shape == (2, 4, 6, 3 + 6)
    assert weights("decoder", "self_attention").shape == (2, 4, 6, 3 + 6)
    assert weights("decoder", "encoder_decoder_attention").shape == (2, 4, 6, 6)
    causal = np.asarray(weights("decoder", "self_attention"))
    assert np.all(causal[:, :, 0, 3 + 1 :] < 1e-6) and np.all(causal[:, :, 0, :3] > 0)  # the prefix is always seen


def test_padding_masks_real_keys_only():
    model = prefix_tuning(MODELS["bert"], length=3, hidden=8)
    tokens = np.array(token_inputs("bert"))
    tokens[:, -2:] = 0  # padding
    _, seen = model.apply({"params": init_params(model)}, tokens, method="encode", mutable=["intermediates"])
    weights = np.asarray(seen["intermediates"]["layers_0"]["attention"]["attention_weights"][0])  # [b, h, q, 3 + s]
    assert np.all(weights[..., -2:] < 1e-6) and np.all(weights[..., :3] > 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_scanned_layers_and_folding_a_model_without_mlp_are_refused():
    scanned = MODELS["gpt2"].clone(config=dataclasses.replace(MODELS["gpt2"].config, scan_layers=True))
    with pytest.raises(ValueError, match=r"prefix tuning needs unscanned layers .*GPT2Config.scan_layers = False"):
        model_api(prefix_tuning(scanned, 3)).init(jax.random.key(0))
    model = prefix_tuning(MODELS["gpt2"], 3, hidden=None)
    with pytest.raises(ValueError, match="fold_prefixes needs a prefix tuning model with an MLP"):
        fold_prefixes(init_params(model), model)
    with pytest.raises(ValueError, match="PrefixSettings.hidden must be a positive int, got 0"):
        prefix_tuning(MODELS["gpt2"], 3, hidden=0)


@pytest.mark.slow
def test_rematerialised_layers_get_the_same_gradients():
    base = MODELS["gpt2"]
    remat = base.clone(config=dataclasses.replace(base.config, remat_policy="full"))
    params = redrawn(init_params(prefix_tuning(base, 3, hidden=8)), PREFIX_PARAMS)

    def grads(model):
        loss = lambda p: model_api(model).loss(p, batch("gpt2"), LossConfig(z_loss=0.0))[0]  # noqa: E731
        return jax.grad(loss)(params)

    plain, rematerialised = grads(prefix_tuning(base, 3, hidden=8)), grads(prefix_tuning(remat, 3, hidden=8))
    assert float(jnp.abs(plain["prefix_wo"]).max()) > 1e-4
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), rematerialised, plain)
