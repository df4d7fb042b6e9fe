"""BERT / RoBERTa / XLM-R parity with Hugging Face transformers (random tiny models) and lossless conversion.

Inputs are padded (BERT pads with 0, RoBERTa with 1, which also shifts RoBERTa's
positions) and carry two token types; padded positions are not compared.
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
    perturbed_hf_model,
)

from ptmjax.models import Bert, BertConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_bert  # noqa: E402

BERT = BertConfig(
    vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
ROBERTA = dataclasses.replace(
    BERT, pad_token_id=1, positions_after_padding=True, nsp_head=False, max_length=26, layer_norm_epsilon=1e-5
)
CONFIGS = {
    "bert_pretraining": BERT,
    "bert_mlm_odd_heads_3": dataclasses.replace(BERT, d_model=24, num_heads=3, d_ff=40, nsp_head=False, num_layers=3),
    "roberta": ROBERTA,
    "roberta_odd_heads_5_tanh_gelu": dataclasses.replace(ROBERTA, d_model=40, num_heads=5, activation="gelu"),
    "xlm_roberta": dataclasses.replace(ROBERTA, hf_model_type="xlm-roberta"),  # XLMRobertaForMaskedLM
}


def random_hf_model(config: BertConfig):
    return perturbed_hf_model(lambda: hf_bert.build_hf_model(config))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_hidden_match_transformers_with_padding(name):
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert hf_bert.from_hf_config(model.config, nsp_head=config.nsp_head) == config
    params = hf_bert.hf_to_params(model.state_dict(), config)
    outputs = mlm_outputs(config.nsp_head, "seq_relationship_logits")
    diffs = compare_with_hf_encoder(Bert(config), params, model, config, outputs)
    print(name, {k: f"{v:.2e}" for k, v in diffs.items()})
    assert max(diffs.values()) < 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    back = hf_bert.params_to_hf(hf_bert.hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def test_boxed_init_params_export_and_reimport():
    config = CONFIGS["bert_pretraining"]
    variables = numpy_boxed_variables(lambda: Bert(config).init(jax.random.PRNGKey(0), jnp.full((1, 4), 5, jnp.int32)))
    reloaded = hf_bert.hf_to_params(hf_bert.params_to_hf(variables, config), config)
    jax.tree.map(np.testing.assert_array_equal, reloaded, jax.tree.map(np.asarray, nn.meta.unbox(variables)))


def test_roberta_positions_follow_huggingface():
    tokens = np.array([[0, 5, 6, 2, 1, 1], [1, 1, 0, 7, 2, 1]])
    ref = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        torch.tensor(tokens), padding_idx=1
    ).numpy()
    from ptmjax.layers.positions import positions_after_padding

    np.testing.assert_array_equal(np.asarray(positions_after_padding(jnp.asarray(tokens), 1)), ref)


def test_config_round_trip_and_unsupported_values_are_named():
    for config in CONFIGS.values():
        assert hf_bert.from_hf_config(hf_bert.to_hf_config(config), nsp_head=config.nsp_head) == config
    hf = hf_bert.to_hf_config(BERT).to_dict()
    for name, value in (
        ("position_embedding_type", "relative_key"), ("is_decoder", True), ("hidden_act", "quick_gelu"),
        ("tie_word_embeddings", False), ("model_type", "electra"),
    ):
        with pytest.raises(ValueError, match=name):
            hf_bert.from_hf_config(dict(hf, **{name: value}))
    with pytest.raises(ValueError, match="nsp_head"):
        hf_bert.build_hf_model(dataclasses.replace(ROBERTA, nsp_head=True))
    with pytest.raises(KeyError, match="seq_relationship"):
        hf_bert.hf_to_params(random_hf_model(CONFIGS["bert_mlm_odd_heads_3"]).state_dict(),
                             dataclasses.replace(CONFIGS["bert_mlm_odd_heads_3"], nsp_head=True))
    with pytest.raises(ValueError, match="pad_token_id"):
        dataclasses.replace(BERT, pad_token_id=101)
    with pytest.raises(ValueError, match="max_length"):
        jax.eval_shape(Bert(ROBERTA).init, jax.random.PRNGKey(0), jnp.full((1, ROBERTA.max_length - 1), 5, jnp.int32))
