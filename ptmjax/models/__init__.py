"""Model families, one module each, built from the shared blocks in ptmjax/layers/: T5, BART/mBART,
LongT5, GPT-2, BERT/RoBERTa, ALBERT, ELECTRA, XLNet-style permutation LM, ELMo; and their fine-tuning heads."""

from ptmjax.models.albert import Albert, AlbertConfig
from ptmjax.models.bart import Bart, BartConfig
from ptmjax.models.bert import Bert, BertConfig
from ptmjax.models.electra import (
    ElectraConfig,
    ElectraDiscriminator,
    ElectraGenerator,
    ElectraOutput,
    ElectraPretraining,
    ElectraPretrainingConfig,
)
from ptmjax.models.elmo import Elmo, ElmoConfig, ElmoOutput
from ptmjax.models.encoder import MaskedLMOutput
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2 import GPT2, GPT2Config
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification
from ptmjax.models.longt5 import LongT5, LongT5Config
from ptmjax.models.mpnet import MPNet, MPNetConfig, MPNetPretraining
from ptmjax.models.permutation_lm import PermutationLM
from ptmjax.models.span_bert import SpanBert, SpanBertOutput
from ptmjax.models.t5 import EncoderDecoder, T5Config
from ptmjax.models.unilm import UniLM

__all__ = [
    "Albert", "AlbertConfig", "Bart", "BartConfig", "Bert", "BertConfig",
    "ElectraConfig", "ElectraDiscriminator", "ElectraGenerator", "ElectraOutput", "ElectraPretraining",
    "ElectraPretrainingConfig", "Elmo", "ElmoConfig", "ElmoOutput", "EncoderDecoder", "EncoderForQuestionAnswering",
    "EncoderForSequenceClassification",
    "EncoderForTokenClassification", "GPT2", "GPT2Config", "GPT2ForSequenceClassification", "MaskedLMOutput",
    "LongT5", "LongT5Config", "MPNet", "MPNetConfig", "MPNetPretraining",
    "PermutationLM", "SpanBert", "SpanBertOutput", "T5Config", "UniLM",
]
