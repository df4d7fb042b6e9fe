"""ALBERT parity with Hugging Face transformers (random tiny models) and lossless conversion.

Shapes cover E < H, E > H, odd head counts (3, 5), full sharing (one layer
group) and partial sharing (2 groups of 2 layers), both heads and MLM only.
Inputs are padded and carry two token types; padded positions are not compared.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_same_state_dict,
    compare_with_hf_encoder,
    mlm_outputs,
    numpy_boxed_variables,
    padded_encoder_batch,
    perturbed_hf_model,
)

from ptmjax.models.albert import Albert, AlbertConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_albert  # noqa: E402

ALBERT = AlbertConfig(
    vocab_size=101, embedding_size=16, d_model=24, num_heads=3, num_layers=3, d_ff=40, max_length=24,
    classifier_dropout_rate=0.0,
)
CONFIGS = {
    "albert_pretraining_E16_H24_heads_3": ALBERT,
    "albert_mlm_E40_H20_heads_5_two_groups_erf_gelu": dataclasses.replace(
        ALBERT,
        embedding_size=40,
        d_model=20,
        num_heads=5,
        num_layers=4,
        num_layer_groups=2,
        sop_head=False,
        activation="gelu_exact",
    ),
    "albert_pretraining_E32_H32_heads_4_relu": dataclasses.replace(
        ALBERT, embedding_size=32, d_model=32, num_heads=4, activation="relu", layer_norm_epsilon=1e-6
    ),
}


def random_hf_model(config: AlbertConfig):
    return perturbed_hf_model(lambda: hf_albert.build_hf_model(config))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_hidden_match_transformers_with_padding(name):
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert hf_albert.from_hf_config(model.config, sop_head=config.sop_head) == config
    params = hf_albert.hf_to_params(model.state_dict(), config)
    outputs = mlm_outputs(config.sop_head, "sop_logits")
    diffs = compare_with_hf_encoder(Albert(config), params, model, config, outputs)
    print(name, {k: f"{v:.2e}" for k, v in diffs.items()})
    assert max(diffs.values()) < 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    back = hf_albert.params_to_hf(hf_albert.hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def test_boxed_init_params_export_and_reimport():
    config = CONFIGS["albert_mlm_E40_H20_heads_5_two_groups_erf_gelu"]
    variables = numpy_boxed_variables(
        lambda: Albert(config).init(jax.random.PRNGKey(0), jnp.full((1, 4), 5, jnp.int32))
    )
    assert sorted(k for k in variables["params"] if k.startswith("layers_")) == ["layers_0", "layers_1"]
    reloaded = hf_albert.hf_to_params(hf_albert.params_to_hf(variables, config), config)
    jax.tree.map(np.testing.assert_array_equal, reloaded, jax.tree.map(np.asarray, nn.meta.unbox(variables)))


def test_shared_layer_parameters_are_used_by_every_layer():
    """With one group, the single parameter set `layers_0` is applied by all 4 layers."""
    config = dataclasses.replace(ALBERT, num_layers=4, dropout_rate=0.0)
    tokens = jnp.asarray(padded_encoder_batch(config)[0])
    params = jax.eval_shape(Albert(config).init, jax.random.PRNGKey(0), tokens)
    _, state = jax.eval_shape(
        lambda p: Albert(config).apply(p, tokens, method=Albert.encode, mutable=["intermediates"]), params
    )
    assert [k for k in params["params"] if k.startswith("layers_")] == ["layers_0"]
    assert len(state["intermediates"]["layers_0"]["hidden_states"]) == 4


def test_config_round_trip_and_unsupported_values_are_named():
    for config in CONFIGS.values():
        assert hf_albert.from_hf_config(hf_albert.to_hf_config(config), sop_head=config.sop_head) == config
    hf = hf_albert.to_hf_config(ALBERT).to_dict()
    for name, value in (
        ("inner_group_num", 2), ("num_hidden_groups", 2), ("position_embedding_type", "relative_key"),
        ("hidden_act", "quick_gelu"), ("model_type", "bert"), ("tie_word_embeddings", False),
    ):
        with pytest.raises(ValueError, match=name):
            hf_albert.from_hf_config(dict(hf, **{name: value}))
    with pytest.raises(ValueError, match="num_labels"):
        hf_albert.from_hf_config(dict(hf, id2label={0: "a", 1: "b", 2: "c"}))
    for name, value in (("embedding_size", None), ("positions_after_padding", True), ("activation", "linear")):
        with pytest.raises(ValueError, match=name):
            hf_albert.to_hf_config(dataclasses.replace(ALBERT, **{name: value}))
    with pytest.raises(ValueError, match="num_layer_groups"):
        dataclasses.replace(ALBERT, num_layer_groups=2)
    with pytest.raises(ValueError, match="classifier_dropout_rate"):
        dataclasses.replace(ALBERT, classifier_dropout_rate=1.0)
    with pytest.raises(KeyError, match="sop_classifier"):
        hf_albert.hf_to_params(random_hf_model(dataclasses.replace(ALBERT, sop_head=False)).state_dict(), ALBERT)
    with pytest.raises(ValueError, match="no pooler"):
        model, tokens = Albert(dataclasses.replace(ALBERT, sop_head=False)), jnp.full((1, 4), 5, jnp.int32)
        jax.eval_shape(
            lambda t: model.init(jax.random.PRNGKey(0), t, method=lambda m, t: m.pooled(m.encode(t))), tokens
        )
