"""Hugging Face fine-tuning classes <-> ptmjax task models: configs and state dicts (weights as numpy arrays).

Classes: {Bert, Roberta, XLMRoberta, Albert, Electra}For{SequenceClassification,
TokenClassification, QuestionAnswering} <-> EncoderFor... on the family's
config, and GPT2ForSequenceClassification <-> GPT2ForSequenceClassification.
The backbone converts with its family's rules (hf_bert, hf_albert,
hf_electra, hf_gpt2); the heads map one to one, HF Linear weights transposed:
BERT's `bert.pooler.dense` / ALBERT's `albert.pooler` <-> `pair_head/pooler`,
`classifier` (or RoBERTa's and ELECTRA's `classifier.dense`, `classifier.out_proj`),
`qa_outputs`, GPT-2's bias-free `score`.
num_labels comes from config.json's id2label; a sequence head with one label
is a regression (HF problem_type 'regression'); multi-label classification
and multi-output regression have no ptmjax equivalent and are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import numpy as np

from ptmjax.convert import hf_albert, hf_bert, hf_electra, hf_gpt2
from ptmjax.convert.hf_encoder import TRANSPOSE, backbone_rules, dense_rules
from ptmjax.convert.state_dict import Params, Rule, field, one_to_one, params_to_rules, rules_to_params
from ptmjax.families.registry import family_of
from ptmjax.models.albert import AlbertConfig
from ptmjax.models.bert import BertConfig
from ptmjax.models.electra import ElectraConfig
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification

TASK_MODELS = {
    "SequenceClassification": EncoderForSequenceClassification,
    "TokenClassification": EncoderForTokenClassification,
    "QuestionAnswering": EncoderForQuestionAnswering,
}
ENCODER_PREFIXES = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "albert": "Albert",
                    "electra": "Electra"}
POOLERS = {"bert": "bert.pooler.dense", "albert": "albert.pooler"}
GPT2_CLASS = "GPT2ForSequenceClassification"
PROBLEM_TYPES = (None, "regression", "single_label_classification")


class TaskClass(NamedTuple):
    """One HF fine-tuning class: its model_type and task ('SequenceClassification', ...)."""

    model_type: str
    task: str

    @property
    def name(self) -> str:
        if self.model_type == "gpt2":
            return GPT2_CLASS
        return f"{ENCODER_PREFIXES[self.model_type]}For{self.task}"


HF_CLASSES = {
    **{TaskClass(t, task).name: TaskClass(t, task) for t in ENCODER_PREFIXES for task in TASK_MODELS},
    GPT2_CLASS: TaskClass("gpt2", "SequenceClassification"),
}


def task_class_of_config(hf_config: Mapping[str, Any]) -> TaskClass | None:
    """The fine-tuning class config.json declares, or None for any other class."""
    for name in field(hf_config, "architectures", None) or []:
        if name in HF_CLASSES:
            found = HF_CLASSES[name]
            if field(hf_config, "model_type") != found.model_type:
                raise ValueError(
                    f"config.json declares {name} but model_type={field(hf_config, 'model_type')!r}; "
                    f"a {name} checkpoint has model_type {found.model_type!r}"
                )
            return found
    return None


def task_class_of_model(model: nn.Module) -> TaskClass:
    """The HF class holding exactly `model`'s parameters."""
    family = family_of(model)
    if family.decoder_only:
        return HF_CLASSES[GPT2_CLASS]
    return TaskClass(_encoder_type(model.config), family.task_head)


def _encoder_type(config: Any) -> str:
    if isinstance(config, AlbertConfig):
        return "albert"
    if isinstance(config, ElectraConfig):
        return "electra"
    if isinstance(config, BertConfig):
        return hf_bert.family(config)
    raise ValueError(
        f"{type(config).__name__} has no Hugging Face fine-tuning classes; use BertConfig, AlbertConfig or "
        "ElectraConfig."
    )


def _num_labels(hf_config: Any, task_class: TaskClass) -> int:
    id2label = field(hf_config, "id2label", None)
    num_labels = len(id2label) if id2label else field(hf_config, "num_labels", 2)
    problem = field(hf_config, "problem_type", None)
    if problem not in PROBLEM_TYPES or (problem is not None and (problem == "regression") != (num_labels == 1)):
        raise ValueError(
            f"unsupported Hugging Face {task_class.name} problem_type={problem!r} with num_labels={num_labels}; "
            "ptmjax supports single-label classification (num_labels >= 2) and regression (num_labels == 1)."
        )
    return num_labels


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> nn.Module:
    """A fine-tuning transformers config (or its config.json dict, with `architectures`) -> the ptmjax model."""
    task_class = task_class_of_config(hf_config)
    if task_class is None:
        raise ValueError(
            f"config declares architectures {field(hf_config, 'architectures', None)}; ptmjax imports the "
            f"fine-tuning classes {', '.join(sorted(HF_CLASSES))}"
        )
    kw = {"dtype": dtype, "param_dtype": param_dtype}
    if task_class.model_type == "gpt2":
        pad = field(hf_config, "pad_token_id", None)
        if pad is None:
            raise ValueError(
                "GPT2ForSequenceClassification's config has no pad_token_id, which finds each row's last token; "
                "set pad_token_id in config.json (e.g. to the eos_token_id)."
            )
        config = hf_gpt2.from_hf_config(hf_config, **kw)
        return GPT2ForSequenceClassification(config, num_labels=_num_labels(hf_config, task_class), pad_token_id=pad)
    dropout = field(hf_config, "classifier_dropout", None)  # ALBERT's classifier_dropout_prob is in AlbertConfig
    if task_class.model_type == "albert":
        config = hf_albert.from_hf_config(hf_config, sop_head=False, **kw)
    elif task_class.model_type == "electra":
        config = hf_electra.from_hf_config(hf_config, **kw)
    else:
        config = hf_bert.from_hf_config(hf_config, nsp_head=False, **kw)
    model_class = TASK_MODELS[task_class.task]
    if model_class is EncoderForQuestionAnswering:
        return model_class(config)
    return model_class(
        config, num_labels=_num_labels(hf_config, task_class),
        classifier_dropout_rate=None if dropout is None else float(dropout),
    )


def to_hf_config(model: nn.Module) -> Any:
    """The ptmjax fine-tuning model -> the transformers config of its HF class (architectures, num_labels set)."""
    task_class = task_class_of_model(model)
    if task_class.model_type == "gpt2":
        hf_config = hf_gpt2.to_hf_config(model.config)
        hf_config.pad_token_id = model.pad_token_id
    else:
        converter = {"albert": hf_albert, "electra": hf_electra}.get(task_class.model_type, hf_bert)
        hf_config = converter.to_hf_config(model.config)
        if getattr(model, "classifier_dropout_rate", None) is not None:
            name = "classifier_dropout_prob" if task_class.model_type == "albert" else "classifier_dropout"
            setattr(hf_config, name, model.classifier_dropout_rate)
    if task_class.task != "QuestionAnswering":
        hf_config.num_labels = model.num_labels
    if task_class.task == "SequenceClassification":
        hf_config.problem_type = "regression" if model.num_labels == 1 else "single_label_classification"
    hf_config.architectures = [task_class.name]
    return hf_config


def _rules(model: nn.Module) -> list[Rule]:
    task_class, config = task_class_of_model(model), model.config
    if task_class.model_type == "gpt2":
        return [*hf_gpt2.backbone_rules(config), one_to_one("score.weight", ("score", "kernel"), **TRANSPOSE)]
    layouts = {"albert": hf_albert.LAYOUT, "electra": hf_electra.LAYOUT}
    rules = backbone_rules(config, layouts.get(task_class.model_type) or hf_bert.layout(config))
    if task_class.task == "QuestionAnswering":
        return rules + dense_rules("qa_outputs", ("qa_outputs",))
    if task_class.task == "SequenceClassification" and config.classifier_activation is not None:
        return rules + dense_rules("classifier.dense", ("classifier", "dense")) + dense_rules(
            "classifier.out_proj", ("classifier", "out_proj")
        )
    if task_class.task == "SequenceClassification":
        rules += dense_rules(POOLERS[task_class.model_type], ("pair_head", "pooler"))
    return rules + dense_rules("classifier", ("classifier",))


def _buffers(state_dict: Mapping[str, Any]) -> set[str]:
    """Derived buffers some transformers versions save: position / token-type ids, GPT-2's causal masks."""
    suffixes = (".position_ids", ".token_type_ids", ".attn.bias", ".attn.masked_bias")
    return {key for key in state_dict if key.endswith(suffixes)}


def hf_to_params(state_dict: Mapping[str, Any], model: nn.Module) -> Params:
    """The HF class's state dict -> {'params': tree} of numpy arrays for `model` (from `from_hf_config`)."""
    return rules_to_params(state_dict, _rules(model), _buffers(state_dict), task_class_of_model(model).name)


def params_to_hf(params: Params, model: nn.Module) -> dict[str, np.ndarray]:
    """ptmjax params of `model` -> every weight of its HF class's `state_dict()`."""
    return params_to_rules(params, _rules(model), task_class_of_model(model).name)


def build_hf_model(model: nn.Module) -> Any:
    """A randomly initialised transformers model of `model`'s HF class (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, task_class_of_model(model).name)(to_hf_config(model))
