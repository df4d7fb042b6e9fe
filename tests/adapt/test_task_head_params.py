"""The task models' parameters: the backbone has exactly the pre-training model's paths and shapes (so a
pre-trained checkpoint restores into it by path), only the head is new, and every parameter carries logical axes."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, Albert, AlbertConfig, Bert, BertConfig, ElectraConfig, ElectraDiscriminator, GPT2Config
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification

SMALL = {"vocab_size": 64, "d_model": 32, "num_heads": 4, "num_layers": 2, "d_ff": 64, "max_length": 16}
BERT, ALBERT = BertConfig(**SMALL), AlbertConfig(**SMALL, embedding_size=16)
ROBERTA = BertConfig(**SMALL, pad_token_id=1, positions_after_padding=True, nsp_head=False)
ELECTRA, GPT2_CONFIG = ElectraConfig(**SMALL, embedding_size=16), GPT2Config(**SMALL)
# name -> (task model, pre-trained model, the task model's head, the pre-trained model's head)
CASES = {
    "bert_sequence": (EncoderForSequenceClassification(BERT, num_labels=3), Bert(BERT), {"classifier"},
                      {"mlm_head", "pair_head/classifier"}),
    "albert_sequence": (EncoderForSequenceClassification(ALBERT, num_labels=3), Albert(ALBERT), {"classifier"},
                        {"mlm_head", "pair_head/classifier"}),
    "roberta_sequence": (EncoderForSequenceClassification(ROBERTA, num_labels=1), Bert(ROBERTA), {"classifier"},
                         {"mlm_head"}),
    "electra_tokens": (EncoderForTokenClassification(ELECTRA, num_labels=5), ElectraDiscriminator(ELECTRA),
                       {"classifier"}, {"discriminator_head"}),
    "bert_span": (EncoderForQuestionAnswering(BERT), Bert(BERT), {"qa_outputs"}, {"mlm_head", "pair_head"}),
    "gpt2_sequence": (GPT2ForSequenceClassification(GPT2_CONFIG, num_labels=2), GPT2(GPT2_CONFIG), {"score"}, set()),
}


def shapes_by_path(model: nn.Module, drop: set[str]) -> dict[str, tuple]:
    tokens = jnp.ones((1, 1), jnp.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
    leaves = jax.tree_util.tree_leaves_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    table = {}
    for path, leaf in leaves:
        name = "/".join(str(k.key) for k in path)
        assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim, f"{name} has no logical axes"
        if not any(name == d or name.startswith(d + "/") for d in drop):
            table[name] = leaf.value.shape
    return table


@pytest.mark.parametrize("name", sorted(CASES))
def test_backbone_paths_are_the_pretrained_models(name):
    task_model, pretrained, task_head, pretrained_head = CASES[name]
    assert shapes_by_path(task_model, task_head) == shapes_by_path(pretrained, pretrained_head)
    assert shapes_by_path(task_model, set()).keys() - shapes_by_path(task_model, task_head).keys()  # a head exists


def test_heads_neither_score_nor_generate():
    api = model_api(CASES["bert_span"][0])
    with pytest.raises(ValueError, match="fine-tuning head without target tokens to score"):
        api.score(None, {})
    with pytest.raises(ValueError, match="does not generate text"):
        api.predict(None, {}, None, None)
