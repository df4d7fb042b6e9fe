"""mT5, XLM-R and mBERT gin shapes: parameter counts (shapes only, never materialised) against Hugging Face's
model of the same config (built on torch's 'meta' device) and the published sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import count_params, hf_meta_param_count

from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config

# Published sizes: the mT5 paper's (300M, 580M), the XLM-R paper's (270M, which rounds the embedding and the
# encoder apart: transformers counts 278M), the mBERT model card's (179M). Ours must equal transformers' exactly.
PUBLISHED = {"mt5_small": (300e6, 0.01), "mt5_base": (580e6, 0.01), "xlmr_base": (270e6, 0.035),
             "mbert_base": (179e6, 0.01)}
FAMILIES = {"mt5": (T5Config, "hf_t5"), "xlmr": (BertConfig, "hf_bert"), "mbert": (BertConfig, "hf_bert")}


def _init(config: T5Config | BertConfig):
    tokens = jnp.full((1, 4), 5, jnp.int32)
    if isinstance(config, T5Config):
        return lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens)
    return lambda: Bert(config).init(jax.random.PRNGKey(0), tokens)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_hf_and_published(name, gin_config):
    config_class, converter = FAMILIES[name.split("_")[0]]
    config = gin_config(name, config_class)
    ours = count_params(_init(config))
    published, tolerance = PUBLISHED[name]
    print(f"{name}: {ours:,} parameters")
    assert abs(ours - published) / published < tolerance, (name, ours)
    assert ours == hf_meta_param_count(converter, config), name


def test_the_gin_shapes_export_as_their_hugging_face_classes(gin_config):
    from ptmjax.convert import hf_bert, hf_t5

    assert type(hf_t5.to_hf_config(gin_config("mt5_small", T5Config))).__name__ == "MT5Config"
    assert hf_bert.hf_class_name(gin_config("xlmr_base", BertConfig)) == "XLMRobertaForMaskedLM"
    assert hf_bert.hf_class_name(gin_config("mbert_base", BertConfig)) == "BertForPreTraining"


def test_a_hf_model_type_the_architecture_cannot_hold_is_refused(gin_config):
    import dataclasses

    mt5, xlmr = gin_config("mt5_small", T5Config), gin_config("xlmr_base", BertConfig)
    with pytest.raises(ValueError, match="T5Config.hf_model_type='xlm-roberta' is unknown; use None"):
        dataclasses.replace(mt5, hf_model_type="xlm-roberta")
    with pytest.raises(ValueError, match="own unscaled output layer, as T5 v1.1: set tie_embeddings=False"):
        dataclasses.replace(mt5, tie_embeddings=True)
    with pytest.raises(ValueError, match="RoBERTa's architecture: set positions_after_padding=True"):
        dataclasses.replace(xlmr, positions_after_padding=False)
