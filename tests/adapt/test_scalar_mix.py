"""ELMo's scalar mix against a float64 numpy computation (AllenNLP's masked layer norm included), and a
mix + linear classifier trained on a frozen tiny BERT's layer features."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.adapt.probing.layer_features import LayerReader, padded_batch
from ptmjax.adapt.probing.mix_training import fit_mix_classifier
from ptmjax.adapt.probing.scalar_mix import ScalarMix, masked_mean
from ptmjax.models import Bert, BertConfig


def numpy_mix(layers, valid, weights, gamma, layer_norm):
    layers = layers.astype(np.float64)
    if layer_norm:
        normed = []
        for layer in layers:  # [b, s, d]: statistics over the valid tokens' elements
            kept = layer[valid]  # [tokens, d]
            normed.append((layer - kept.mean()) / np.sqrt(kept.var() + 1e-12))
        layers = np.stack(normed)
    soft = np.exp(weights - weights.max())
    soft /= soft.sum()
    return gamma * sum(w * layer for w, layer in zip(soft, layers, strict=True))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_equals_numpy(layer_norm):
    rng = np.random.default_rng(0)
    layers = (rng.normal(size=(4, 3, 5, 6)) * rng.uniform(0.5, 3, size=(4, 1, 1, 1)) + 2).astype(np.float32)
    valid = np.arange(5)[None] < np.array([[5], [2], [4]])
    weights, gamma = np.array([0.3, -1.0, 2.0, 0.5]), 1.7
    params = {"weights": jnp.asarray(weights, jnp.float32), "gamma": jnp.asarray(gamma, jnp.float32)}
    mix = ScalarMix(4, layer_norm).apply({"params": params}, jnp.asarray(layers), jnp.asarray(valid))
    expected = numpy_mix(layers, valid, weights, gamma, layer_norm)
    np.testing.assert_allclose(np.asarray(mix)[valid], expected[valid], rtol=1e-5, atol=1e-5)
    initial = ScalarMix(4).init(jax.random.key(0), jnp.asarray(layers))["params"]
    np.testing.assert_allclose(
        ScalarMix(4).apply({"params": initial}, jnp.asarray(layers)), layers.astype(np.float64).mean(0), rtol=1e-5
    )  # initially an even mix with gamma 1
    with pytest.raises(ValueError, match="num_representations=layers"):
        ScalarMix(3).init(jax.random.key(0), jnp.asarray(layers))


def test_masked_mean_equals_numpy():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(2, 3, 4, 5))
    valid = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], bool)
    expected = np.stack([[values[n, b][valid[b]].mean(0) for b in range(3)] for n in range(2)])
    np.testing.assert_allclose(np.asarray(masked_mean(jnp.asarray(values, jnp.float32), valid)), expected, rtol=1e-5)


def test_mix_and_classifier_train_on_a_frozen_model():
    config = BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, nsp_head=False,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
    model = Bert(config)
    params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
    frozen = jax.tree.map(np.array, params)
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(3, 64, rng.integers(4, 12))) for _ in range(24)]
    labels = np.array([int(7 in row) for row in rows]) + 2 * np.array([len(row) > 8 for row in rows])
    tokens, valid = padded_batch(rows, 12, config.pad_token_id)
    features = LayerReader(model, params)(tokens).hidden
    head, losses = fit_mix_classifier(features, valid, labels, num_classes=4, steps=150)
    print(f"mix classifier loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.5 * losses[0]
    assert set(head) == {"scalar_mix", "classifier"} and set(head["scalar_mix"]) == {"weights", "gamma"}
    assert np.abs(np.asarray(head["scalar_mix"]["weights"])).max() > 1e-3  # the mix learned a weighting
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), frozen)  # the model stayed frozen
