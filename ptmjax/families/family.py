"""The family record: what every tool knows about a kind of model, and nothing more.

Tools never test a model's class; they ask its record (`registry.family_of`): its kind, how its batches are
built and scored, whether and how it decodes, which stack is probed, whether it ranks a cloze's blank, its
model FLOPs, and the parts it is exported as.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ptmjax.families import losses
from ptmjax.families.token_loss import LossConfig

if TYPE_CHECKING:
    import seqio
    from flax import linen as nn

Array = jax.Array
Batch = Mapping[str, Array]
Loss = Callable[[Any, Batch, LossConfig], losses.LossTerms]
HEAD_CONVERTERS = "ptmjax.data.task_head_converters"


class Kind(enum.Enum):
    """How a family's stacks are arranged: what decodes, how rows are framed, what is probed."""

    ENCODER_DECODER = "encoder-decoder"  # T5, BART: an encoder and a decoder reading it
    DECODER_ONLY = "decoder-only"  # GPT-2: one causal stack; rows carry no BOS or EOS around the text
    ENCODER = "encoder"  # the BERT family, ELECTRA, the permutation LM: one bidirectional stack


@dataclasses.dataclass(frozen=True)
class ConverterName:
    """A seqio feature converter class by module and class name, imported on first use, so that the model API and
    the train step import without seqio's TensorFlow; `pad_id`: padding 'input_tokens' with a model's pad id."""

    module: str
    name: str
    pad_id: int | None = None

    def load(self) -> type[seqio.FeatureConverter]:
        return _converter_class(self.module, self.name, self.pad_id)


@functools.cache
def _converter_class(module: str, name: str, pad_id: int | None) -> type[seqio.FeatureConverter]:
    """The class, built without AutoGraph (ptmjax/data/without_autograph.py): the same object on every call
    (families compare converters by identity)."""
    converter = getattr(importlib.import_module(module), name)
    if pad_id is not None:
        converter = importlib.import_module(HEAD_CONVERTERS).padded_with(converter, pad_id)
    return importlib.import_module("ptmjax.data.without_autograph").without_autograph_converter(converter)


@dataclasses.dataclass(frozen=True)
class ProbedStack:
    """Where a model's probed layers are: the method returning the stack's final states, its token
    argument, the layers' parent path, and the padding id (GPT-2 masks none: after the real ids, causal
    attention keeps padding from changing them). With `characters_field` (ELMo) the method also takes each
    token's character ids under that name and returns every layer itself, [layers + 1, b, s, d], and the
    model has no attention maps."""

    method: str
    tokens_field: str
    path: tuple[str, ...]
    pad_id: int
    characters_field: str | None = None


ClozeLogits = Callable[["nn.Module", Any, Array, Array, int], Array]
Flops = Callable[["nn.Module", int, Mapping[str, int]], float]
Parts = Callable[["nn.Module", Any], dict[str, tuple["nn.Module", Any]]]


def token_inputs(*names: str) -> dict[str, jax.ShapeDtypeStruct]:
    """Init inputs that are [batch, length] token ids: one of each suffices, parameter shapes not depending on
    length."""
    return {name: jax.ShapeDtypeStruct((1, 1), jnp.int32) for name in names}


@dataclasses.dataclass(frozen=True)
class Family:
    """How batches are built, scored and decoded for a model family, and the facts tools ask of it.

    Attributes:
      kind: how its stacks are arranged (`Kind`).
      converter: its seqio feature converter class, by name (`feature_converter` is the class).
      init_inputs: the model inputs that `module.init` needs, each with the shape and dtype it is initialised on.
      target_fields: batch features the module does not take (the loss's targets and weights, the predictions'
        masks).
      targets: the [batch, length] feature of target token ids that `score` reads; None for a
        fine-tuning head, which has no target tokens to score.
      loss_weights: the feature that weighs the targets ([batch, length], or [batch] for a head that
        scores whole examples); its sum normalises the token loss.
      loss: the family's loss (ptmjax/families/losses.py); None for a model trained only inside another
        (ELECTRA's discriminator alone).
      target_logits: the [batch, length, vocab] logits the targets are scored against, taken from the module's
        output.
      rng_streams: rng collections the module draws from besides 'params' and
        'dropout' (ELECTRA's generator samples from 'sample').
      predict: decoding with a key/value cache (greedy, beam search, sampling),
        `(module, params, batch, DecodeConfig, GenerationIds, rng) -> DecodeOutput`
        (ptmjax/decoding); None for a family that does not generate.
      task_head: a fine-tuning head's task, in Hugging Face's words ('SequenceClassification',
        'TokenClassification', 'QuestionAnswering'); None for a pre-training model.
      head_predictions: a task head's prediction per row from its outputs and the batch
        (ptmjax/families/head_predictions.py); None for a family without a task head.
      probed_stack: the stack the probing tools read, of a module (None: not probed).
      cloze_logits: `(module, params, tokens, blanks, mask_id) -> [b, vocab]`, the logits at each row's blank
        (ptmjax/families/cloze_logits.py); None for a family that does not rank a blank.
      flops: `(module, batch_size, task_feature_lengths) -> model FLOPs of one train step`; None where no
        formula is written (ptmjax/models/flops.py).
      parts: the models a joint one is exported as, `(module, params) -> {name: (module, params)}`
        (ELECTRA's generator and discriminator); None for a model exported whole.
      causal_prompts: a decoder-only family whose converter's rows hold no prompt (Transformer-XL's segment
        streams): `ptmjax infer` and `ptmjax.load` read its prompts as plain causal rows, without EOS.
    """

    kind: Kind
    converter: ConverterName
    init_inputs: Mapping[str, jax.ShapeDtypeStruct]
    target_fields: tuple[str, ...]
    targets: str | None
    loss_weights: str
    loss: Loss | None
    target_logits: Callable[[Any], Array] = lambda outputs: outputs
    rng_streams: tuple[str, ...] = ()
    predict: Callable[..., Any] | None = None
    task_head: str | None = None
    head_predictions: Callable[[Any, Batch], Array] | None = None
    probed_stack: Callable[[nn.Module], ProbedStack] | None = None
    cloze_logits: ClozeLogits | None = None
    flops: Flops | None = None
    parts: Parts | None = None
    causal_prompts: bool = False

    @property
    def feature_converter(self) -> type[seqio.FeatureConverter]:
        """The seqio converter class (constructed with `pack=`)."""
        return self.converter.load()

    @property
    def init_fields(self) -> tuple[str, ...]:
        """The names of the module's init inputs: the token features a batch feeds it."""
        return tuple(self.init_inputs)

    @property
    def encoder_decoder(self) -> bool:
        return self.kind is Kind.ENCODER_DECODER

    @property
    def decoder_only(self) -> bool:
        return self.kind is Kind.DECODER_ONLY
