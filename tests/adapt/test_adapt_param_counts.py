"""Exact trainable-parameter counts of LoRA on T5 v1.0 base and BitFit on BERT base, derived by hand
(the models are built abstractly, with jax.eval_shape)."""

from __future__ import annotations

import math
import re

import gin

from ptmjax import gin_files
from ptmjax.adapt.bitfit import BITFIT_PARAMS
from ptmjax.adapt.lora import LORA_PARAMS, lora
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config
from ptmjax.training.model_api import model_api
from ptmjax.tree_paths import shapes_by_path


def config_from_gin(name: str, config_class: type) -> object:
    gin_files.parse_gin([f"models/{name}.gin"])
    try:
        return config_class()
    finally:
        gin.clear_config()


def count(shapes: dict[str, tuple[int, ...]], pattern: str | None = None) -> int:
    return sum(math.prod(shape) for path, shape in shapes.items() if pattern is None or re.search(pattern, path))


def test_lora_rank_8_on_query_and_value_of_t5_base():
    config = config_from_gin("t5_1_0_base", T5Config)
    base = shapes_by_path(model_api(EncoderDecoder(config)).abstract_params)
    adapted = shapes_by_path(model_api(lora(EncoderDecoder(config), rank=8)).abstract_params)
    # 12 encoder self-, 12 decoder self- and 12 decoder cross-attention layers, each with a query and a value
    # projection [d_model=768] -> [heads=12, head_dim=64]: A is 768 x 8, B is 8 x (12 * 64).
    attentions, per_projection = 12 + 12 + 12, 8 * (768 + 12 * 64)
    expected = attentions * 2 * per_projection
    assert expected == 884_736
    assert count(adapted, LORA_PARAMS) == expected
    assert count(adapted) == count(base) + expected == 222_903_552 + 884_736
    assert {path for path in adapted if not re.search(LORA_PARAMS, path)} == set(base)


def test_bitfit_on_bert_base_and_t5():
    shapes = shapes_by_path(model_api(Bert(config_from_gin("bert_base", BertConfig))).abstract_params)
    d_model, heads, head_dim, d_ff, vocab = 768, 12, 64, 3072, 30522
    per_layer = (
        3 * heads * head_dim  # query, key, value biases
        + d_model  # attention output
        + d_ff + d_model  # MLP in and out
        + 2 * d_model  # the two LayerNorm offsets
    )
    embeddings = d_model  # the embedding LayerNorm's offset
    mlm_head = d_model + d_model + vocab  # transform, its LayerNorm, the output bias
    nsp_head = d_model + 2  # pooler, classifier
    expected = embeddings + 12 * per_layer + mlm_head + nsp_head
    assert expected == 134_972
    assert count(shapes, BITFIT_PARAMS) == expected
    t5 = shapes_by_path(model_api(EncoderDecoder(config_from_gin("t5_1_0_base", T5Config))).abstract_params)
    assert count(t5, BITFIT_PARAMS) == 0  # T5 has no bias terms
