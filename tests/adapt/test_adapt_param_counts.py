"""Exact trainable-parameter counts of LoRA, prompt tuning, P-tuning and prefix tuning on T5 v1.0 base, and BitFit
and Houlsby adapters on BERT base, derived by hand (the models are built abstractly, with jax.eval_shape)."""

from __future__ import annotations

import math
import re

import gin

from ptmjax import gin_files
from ptmjax.adapt.adapters import ADAPTER_PARAMS, adapters
from ptmjax.adapt.bitfit import BITFIT_PARAMS
from ptmjax.adapt.lora import LORA_PARAMS, lora
from ptmjax.adapt.p_tuning import p_tuning
from ptmjax.adapt.prefix_tuning import PREFIX_PARAMS, prefix_tuning
from ptmjax.adapt.prompt_tuning import PROMPT_PARAMS, prompt_tuning
from ptmjax.families.model_api import model_api
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config
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


def test_prompt_tuning_p_tuning_and_prefix_tuning_on_t5_base():
    config = config_from_gin("t5_1_0_base", T5Config)
    base = count(shapes_by_path(model_api(EncoderDecoder(config)).abstract_params))
    prompt = shapes_by_path(model_api(prompt_tuning(EncoderDecoder(config), length=100)).abstract_params)
    assert {path for path in prompt if re.search(PROMPT_PARAMS, path)} == {"encoder/soft_prompt"}
    assert count(prompt, PROMPT_PARAMS) == 100 * 768 == 76_800
    assert count(prompt) == base + 76_800
    # P-tuning: the 100 x 768 encoder inputs, then 768 -> 128 -> 768 with biases
    p_tuned = shapes_by_path(model_api(p_tuning(EncoderDecoder(config), length=100, hidden=128)).abstract_params)
    assert count(p_tuned, PROMPT_PARAMS) == 76_800 + (768 * 128 + 128) + (128 * 768 + 768) == 274_304
    # prefix tuning, per stack of 12 layers: the 10 x 768 embedding, 768 -> 512 with bias, then 512 -> the
    # prefixes [12 layers, 2, 12 heads, 64] with bias; the encoder and the decoder each have one
    prefixed = shapes_by_path(model_api(prefix_tuning(EncoderDecoder(config), length=10, hidden=512)).abstract_params)
    per_stack = 10 * 768 + (768 * 512 + 512) + (512 + 1) * (12 * 2 * 12 * 64)
    assert count(prefixed, PREFIX_PARAMS) == 2 * per_stack == 19_714_048
    folded = shapes_by_path(model_api(prefix_tuning(EncoderDecoder(config), length=10, hidden=None)).abstract_params)
    assert count(folded, PREFIX_PARAMS) == 2 * 12 * 2 * 12 * 10 * 64 == 368_640  # what decoding needs


def test_houlsby_and_pfeiffer_adapters_on_bert_base():
    config = config_from_gin("bert_base", BertConfig)
    base = count(shapes_by_path(model_api(Bert(config)).abstract_params))
    shapes = shapes_by_path(model_api(adapters(Bert(config), "houlsby", bottleneck=64)).abstract_params)
    # an adapter: down 768 x 64 + its bias 64, up 64 x 768 + its bias 768; Houlsby puts one after the attention
    # and one after the feed-forward block of each of the 12 layers
    per_adapter = 768 * 64 + 64 + 64 * 768 + 768
    assert per_adapter == 99_136
    assert count(shapes, ADAPTER_PARAMS) == 12 * 2 * per_adapter == 2_379_264
    assert count(shapes) == base + 2_379_264
    pfeiffer = shapes_by_path(model_api(adapters(Bert(config), "pfeiffer", bottleneck=64)).abstract_params)
    assert count(pfeiffer, ADAPTER_PARAMS) == 12 * per_adapter == 1_189_632
