"""The registered families: one `Family` record per kind of model, and the model classes they belong to.

A new family is its model file (ptmjax/models/), its record, `FAMILIES` entry and `MODEL_CLASSES` line here,
and its Hugging Face converter (ptmjax/convert/). `family_of(module)` is how every tool learns what a module is.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from flax import linen as nn

from ptmjax import decoding
from ptmjax.families import cloze_logits, head_predictions, losses
from ptmjax.families.bidirectional_lm import bidirectional_lm_family
from ptmjax.families.family import HEAD_CONVERTERS, ConverterName, Family, Kind, ProbedStack, token_inputs
from ptmjax.models.albert import Albert
from ptmjax.models.bart import Bart
from ptmjax.models.bert import Bert
from ptmjax.models.electra import ElectraDiscriminator, ElectraGenerator, ElectraPretraining
from ptmjax.models.elmo import Elmo
from ptmjax.models.encoder import MaskedLMEncoder, PostLNEncoder
from ptmjax.models.encoder_decoder import EncoderDecoderInterface
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.flops import t5_training_flops
from ptmjax.models.gpt2 import GPT2
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification
from ptmjax.models.longt5 import LongT5
from ptmjax.models.mpnet import MPNet, MPNetPretraining
from ptmjax.models.permutation_lm import PermutationLM
from ptmjax.models.sentence_encoder import SentenceEncoder
from ptmjax.models.span_bert import SpanBert
from ptmjax.models.t5 import EncoderDecoder
from ptmjax.models.transformer_xl import TransformerXL
from ptmjax.models.unilm import UniLM

SEQIO = "seqio"
PTMJAX_CONVERTERS = "ptmjax.data.feature_converters"
BLANK_INFILLING_CONVERTER = ConverterName("ptmjax.data.blank_infilling_converter", "BlankInfillingFeatureConverter")
SEGMENT_STREAM_CONVERTER = ConverterName("ptmjax.data.segment_stream_converter", "SegmentStreamFeatureConverter")


def _pad_id(module: nn.Module) -> int:
    return getattr(module.config, "pad_token_id", 0)


def encoder_stack(module: nn.Module) -> ProbedStack:
    return ProbedStack("encode", "input_tokens", (), _pad_id(module))


def decoder_only_stack(module: nn.Module) -> ProbedStack:
    return ProbedStack("hidden_states", "decoder_input_tokens", (), 0)


def encoder_decoder_stack(module: nn.Module) -> ProbedStack:
    return ProbedStack("encode", "encoder_input_tokens", ("encoder",), _pad_id(module))


def t5_flops(module: nn.Module, batch_size: int, lengths: Mapping[str, int]) -> float:
    return t5_training_flops(module.config, batch_size, lengths["inputs"], lengths["targets"])


def mpnet_encoder(module: nn.Module, params: Any) -> dict[str, tuple[nn.Module, Any]]:
    """MPNet's two-stream pre-training model is exported as the encoder it runs (the same parameters)."""
    return {"": (MPNet(module.config), params)}


def electra_parts(module: nn.Module, params: Any) -> dict[str, tuple[nn.Module, Any]]:
    """The generator and the discriminator, each with the shared embeddings."""
    tree = nn.meta.unbox(params)
    return {
        role: (role_class(getattr(module.config, role)), {**tree[role], "embeddings": tree["embeddings"]})
        for role, role_class in (("generator", ElectraGenerator), ("discriminator", ElectraDiscriminator))
    }


# BART and any other encoder-decoder; T5's record adds what span corruption taught it and its FLOPs formula.
SEQUENCE_TO_SEQUENCE = Family(
    Kind.ENCODER_DECODER, ConverterName(SEQIO, "EncDecFeatureConverter"),
    token_inputs("encoder_input_tokens", "decoder_input_tokens"), ("decoder_target_tokens", "decoder_loss_weights"),
    "decoder_target_tokens", "decoder_loss_weights", losses.sequence_to_sequence_loss,
    predict=functools.partial(decoding.predict, decoding.encoder_decoder_prefill),
    probed_stack=encoder_decoder_stack,
)
T5_SEQUENCE_TO_SEQUENCE = dataclasses.replace(
    SEQUENCE_TO_SEQUENCE, cloze_logits=cloze_logits.t5_sentinel_logits, flops=t5_flops
)
# Handles causal LM ('targets' only) and prefix LM ('inputs' + 'targets').
DECODER_ONLY = dataclasses.replace(
    SEQUENCE_TO_SEQUENCE, kind=Kind.DECODER_ONLY, converter=ConverterName(SEQIO, "DecoderFeatureConverter"),
    init_inputs=token_inputs("decoder_input_tokens"),
    predict=functools.partial(decoding.predict, decoding.decoder_only_prefill), probed_stack=decoder_only_stack,
)
# GLM: GPT-2 with block positions on blank-infilling rows (part A its bidirectional prefix); decodes one blank.
BLANK_INFILLING = dataclasses.replace(
    DECODER_ONLY, converter=BLANK_INFILLING_CONVERTER,
    predict=functools.partial(decoding.predict, decoding.blank_infilling_prefill),
)
# Transformer-XL: each row continues the row before it (its memory is carried by ptmjax/training/recurrent_memory.py);
# decodes in segments after its memory with a bounded cache.
TRANSFORMER_XL = dataclasses.replace(
    DECODER_ONLY, converter=SEGMENT_STREAM_CONVERTER,
    predict=functools.partial(decoding.predict, decoding.segment_memory_prefill), causal_prompts=True,
)
MASKED_LM = Family(
    Kind.ENCODER, ConverterName(PTMJAX_CONVERTERS, "MaskedLmFeatureConverter"), token_inputs("input_tokens"),
    ("target_tokens", "loss_mask"), "target_tokens", "loss_mask", losses.masked_lm_loss,
    target_logits=lambda outputs: outputs.mlm_logits, probed_stack=encoder_stack,
    cloze_logits=cloze_logits.masked_lm_logits,
)
MASKED_LM_WITH_SENTENCE_PAIRS = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "SentencePairFeatureConverter"),
    target_fields=("target_tokens", "loss_mask", "sentence_label"),
)
# XLM: MLM and translation LM rows with 'positions' (restarting at a pair's second half) and 'language_ids'.
TRANSLATION_LM = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "TranslationLmFeatureConverter"),
    init_inputs=token_inputs("input_tokens", "positions", "language_ids"),
)
# SpanBERT: the module also reads each span token's boundaries and position; MLM + span boundary loss.
SPAN_BOUNDARY_MLM = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "SpanBoundaryFeatureConverter"),
    init_inputs=token_inputs("input_tokens", "span_left", "span_right", "span_position"),
    loss=losses.span_boundary_mlm_loss,
)
# UniLM: each row also says which of its four attention masks the encoder reads it under.
UNIFIED_LM = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "UnifiedLmFeatureConverter"),
)
PERMUTED_LM = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "PermutedLmFeatureConverter"),
    init_inputs=token_inputs("input_tokens", "permutation_rank"), loss=losses.permuted_lm_loss,
    target_logits=lambda outputs: outputs, probed_stack=None, cloze_logits=None,
)
# MPNet: two streams over a permuted row; the module finds the queries' mask tokens from their weights.
MASKED_PERMUTED_LM = dataclasses.replace(
    MASKED_LM, converter=ConverterName("ptmjax.data.masked_permuted_lm_converter", "MaskedPermutedLmFeatureConverter"),
    init_inputs=token_inputs("input_tokens", "positions", "loss_mask"), target_fields=("target_tokens",),
    loss=losses.permuted_lm_loss, target_logits=lambda outputs: outputs, probed_stack=None, cloze_logits=None,
    parts=mpnet_encoder,
)
# The module reads the original tokens and the MLM selection itself; its generator samples from 'sample'.
REPLACED_TOKEN_DETECTION = dataclasses.replace(
    MASKED_LM, init_inputs=token_inputs("input_tokens", "target_tokens", "loss_mask"), target_fields=(),
    loss=losses.replaced_token_detection_loss, target_logits=lambda outputs: outputs.generator_logits,
    rng_streams=("sample",), probed_stack=None, cloze_logits=None, parts=electra_parts,
)
# An encoder trained only inside another model (ELECTRA's discriminator): probed, converted, not trained alone.
ENCODER_FEATURES = dataclasses.replace(
    MASKED_LM, target_fields=(), targets=None, loss=None, target_logits=lambda outputs: outputs, cloze_logits=None
)

# Fine-tuning heads: one row per example (no packing), weighed by 'example_weight' or per token by 'tag_weights'.
SEQUENCE_CLASSIFICATION = Family(
    Kind.ENCODER, ConverterName(HEAD_CONVERTERS, "SequenceClassificationFeatureConverter"),
    token_inputs("input_tokens"), ("label", "example_weight"), None, "example_weight",
    losses.sequence_classification_loss, task_head="SequenceClassification",
    head_predictions=head_predictions.class_ids, probed_stack=encoder_stack,
)
SEQUENCE_REGRESSION = dataclasses.replace(
    SEQUENCE_CLASSIFICATION, converter=ConverterName(HEAD_CONVERTERS, "SequenceRegressionFeatureConverter"),
    loss=losses.sequence_regression_loss, head_predictions=head_predictions.values,
)
TOKEN_TAGGING = dataclasses.replace(
    SEQUENCE_CLASSIFICATION, converter=ConverterName(HEAD_CONVERTERS, "TokenTaggingFeatureConverter"),
    target_fields=("tags", "tag_weights"), loss_weights="tag_weights", loss=losses.token_tagging_loss,
    task_head="TokenClassification",
)
SPAN_QUESTION_ANSWERING = dataclasses.replace(
    SEQUENCE_CLASSIFICATION, converter=ConverterName(HEAD_CONVERTERS, "SpanQuestionAnsweringFeatureConverter"),
    target_fields=("answer_start", "answer_end", "example_weight", "context_mask"),
    loss=losses.span_question_answering_loss,
    task_head="QuestionAnswering", head_predictions=head_predictions.answer_spans,
)


# A sentence encoder (models/sentence_encoder.py): anchor and positive rows, the MultipleNegativesRanking loss,
# their embeddings as its prediction (a retrieval metric compares them across the split); probed as an encoder.
SENTENCE_EMBEDDING = Family(
    Kind.ENCODER, ConverterName(HEAD_CONVERTERS, "EmbeddingPairFeatureConverter"),
    token_inputs("input_tokens", "positive_tokens"), ("example_weight",), None, "example_weight",
    losses.multiple_negatives_ranking_loss, head_predictions=head_predictions.embedding_pairs,
    probed_stack=encoder_stack,
)


def sentence_embedding_family(module: SentenceEncoder) -> Family:
    """Rows padded with the encoder's pad_token_id (RoBERTa's 1), as its attention mask reads them."""
    converter = dataclasses.replace(SENTENCE_EMBEDDING.converter, pad_id=_pad_id(module))
    return dataclasses.replace(SENTENCE_EMBEDDING, converter=converter)


def sequence_head_family(num_labels: int) -> Family:
    """Regression when num_labels == 1 (as Hugging Face), else classification."""
    return SEQUENCE_REGRESSION if num_labels == 1 else SEQUENCE_CLASSIFICATION


def decoder_sequence_head_family(module: GPT2ForSequenceClassification) -> Family:
    """GPT-2's rows carry no token types and are padded with the model's pad_token_id."""
    family = sequence_head_family(module.num_labels)
    name = "Decoder" + ("Regression" if family is SEQUENCE_REGRESSION else "Classification") + "FeatureConverter"
    return dataclasses.replace(
        family, kind=Kind.DECODER_ONLY, converter=ConverterName(HEAD_CONVERTERS, name, module.pad_token_id),
        probed_stack=decoder_only_stack,
    )


# Looked up along the module's class hierarchy, the most specific class first.
FAMILIES: dict[type[nn.Module], Callable[[nn.Module], Family]] = {
    EncoderDecoderInterface: lambda module: SEQUENCE_TO_SEQUENCE,  # BART, and any other encoder-decoder
    EncoderDecoder: lambda module: T5_SEQUENCE_TO_SEQUENCE,
    GPT2: lambda module: BLANK_INFILLING if module.config.block_position_embeddings else DECODER_ONLY,
    PermutationLM: lambda module: PERMUTED_LM,
    MPNetPretraining: lambda module: MASKED_PERMUTED_LM,
    PostLNEncoder: lambda module: ENCODER_FEATURES,
    # BERT, RoBERTa, ALBERT: with a sentence-pair head (NSP / SOP) the batches carry sentence pairs; with XLM's
    # language embedding (num_languages) translation-LM rows.
    MaskedLMEncoder: lambda module: (TRANSLATION_LM if module.config.num_languages else
                                     MASKED_LM_WITH_SENTENCE_PAIRS if module.config.pair_head else MASKED_LM),
    SpanBert: lambda module: SPAN_BOUNDARY_MLM,
    UniLM: lambda module: UNIFIED_LM,
    ElectraPretraining: lambda module: REPLACED_TOKEN_DETECTION,
    EncoderForSequenceClassification: lambda module: sequence_head_family(module.num_labels),
    EncoderForTokenClassification: lambda module: TOKEN_TAGGING,
    EncoderForQuestionAnswering: lambda module: SPAN_QUESTION_ANSWERING,
    GPT2ForSequenceClassification: decoder_sequence_head_family,
    SentenceEncoder: sentence_embedding_family,
    Elmo: bidirectional_lm_family,
    TransformerXL: lambda module: TRANSFORMER_XL,
}

# The model classes a user builds by name: each gin-configurable as `ptmjax.models.<class name>`.
MODEL_CLASSES: tuple[type[nn.Module], ...] = (
    EncoderDecoder, Bart, GPT2, Bert, Albert, ElectraPretraining, ElectraDiscriminator, ElectraGenerator,
    PermutationLM, SpanBert, UniLM, EncoderForSequenceClassification, EncoderForTokenClassification,
    EncoderForQuestionAnswering, GPT2ForSequenceClassification,
    MPNet, MPNetPretraining, Elmo, LongT5, TransformerXL,
)


def family_of(module: nn.Module) -> Family:
    """The registered family of `module`'s class; names the known ones if none."""
    for cls in type(module).__mro__:
        if cls in FAMILIES:
            return FAMILIES[cls](module)
    known = ", ".join(sorted(cls.__name__ for cls in FAMILIES))
    raise ValueError(
        f"ptmjax does not know model class {type(module).__name__}; known: {known}. "
        "Register it in ptmjax.families.registry.FAMILIES"
    )
