"""The model API: what every tool knows about a model family, and nothing more.

`model_api(module)` binds a Flax module to its family's `Family` entry and
gives training, evaluation, inspection, conversion and compilation one way to
initialise parameters (real or abstract), draw rngs, build batches, compute
the loss and score targets. No tool initialises parameters any other way.

Why a registry of plain `Family` records instead of a model base class per
family (T5X's `BaseModel`): the train step is family-free, so a family differs
only in data (its feature converter and field names) and two functions (its
loss and the logits its targets are scored against). A new family is one
entry in `FAMILIES`; the Flax modules stay plain `nn.Module`s that know
nothing of training.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax import decoding
from ptmjax.evaluation import head_predictions
from ptmjax.layers import layer_stack
from ptmjax.models import GPT2
from ptmjax.models.electra import ElectraPretraining
from ptmjax.models.encoder import MaskedLMEncoder
from ptmjax.models.encoder_decoder import EncoderDecoderInterface
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification
from ptmjax.models.permutation_lm import PermutationLM
from ptmjax.training import model_losses
from ptmjax.training.chunked_logits import chunked_token_cross_entropy
from ptmjax.training.losses import LossConfig
from ptmjax.training.model_losses import Stats

if TYPE_CHECKING:
    import seqio

Array = jax.Array
Batch = Mapping[str, Array]
Loss = Callable[[Any, Batch, LossConfig], model_losses.LossTerms]
EVAL_SAMPLE_SEED = 0  # eval draws (ELECTRA's generator samples) use a fixed key, so evaluations compare
SEQIO = "seqio"
PTMJAX_CONVERTERS = "ptmjax.data.feature_converters"
HEAD_CONVERTERS = "ptmjax.data.task_head_converters"


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
class Family:
    """How batches are built, scored and decoded for a model family.

    Attributes:
      converter: its seqio feature converter class, by name (`feature_converter` is the class).
      init_fields: the model inputs that `module.init` needs, as [batch, length] ints.
      target_fields: batch features the loss reads and the module does not take.
      targets: the [batch, length] feature of target token ids that `score` reads; None for a
        fine-tuning head, which has no target tokens to score.
      loss_weights: the feature that weighs the targets ([batch, length], or [batch] for a head that
        scores whole examples); its sum normalises the token loss.
      loss: the family's loss (ptmjax/training/model_losses.py).
      target_logits: the [batch, length, vocab] logits the targets are scored
        against, taken from the module's output.
      rng_streams: rng collections the module draws from besides 'params' and
        'dropout' (ELECTRA's generator samples from 'sample').
      predict: decoding with a key/value cache (greedy, beam search, sampling),
        `(module, params, batch, DecodeConfig, GenerationIds, rng) -> DecodeOutput`
        (ptmjax/decoding); None for a family that does not generate.
      head_predictions: a task head's prediction per row from its outputs and the batch
        (ptmjax/evaluation/head_predictions.py); None for a family without a task head.
    """

    converter: ConverterName
    init_fields: tuple[str, ...]
    target_fields: tuple[str, ...]
    targets: str | None
    loss_weights: str
    loss: Loss
    target_logits: Callable[[Any], Array] = lambda outputs: outputs
    rng_streams: tuple[str, ...] = ()
    predict: Callable[..., Any] | None = None
    head_predictions: Callable[[Any, Batch], Array] | None = None

    @property
    def feature_converter(self) -> type[seqio.FeatureConverter]:
        """The seqio converter class (constructed with `pack=`)."""
        return self.converter.load()


SEQUENCE_TO_SEQUENCE = Family(
    ConverterName(SEQIO, "EncDecFeatureConverter"), ("encoder_input_tokens", "decoder_input_tokens"),
    ("decoder_target_tokens", "decoder_loss_weights"), "decoder_target_tokens", "decoder_loss_weights",
    model_losses.sequence_to_sequence_loss,
    predict=functools.partial(decoding.predict, decoding.encoder_decoder_prefill),
)  # fmt: skip
# Handles causal LM ('targets' only) and prefix LM ('inputs' + 'targets').
DECODER_ONLY = dataclasses.replace(
    SEQUENCE_TO_SEQUENCE, converter=ConverterName(SEQIO, "DecoderFeatureConverter"),
    init_fields=("decoder_input_tokens",),
    predict=functools.partial(decoding.predict, decoding.decoder_only_prefill),
)  # fmt: skip
MASKED_LM = Family(
    ConverterName(PTMJAX_CONVERTERS, "MaskedLmFeatureConverter"), ("input_tokens",), ("target_tokens", "loss_mask"),
    "target_tokens", "loss_mask", model_losses.masked_lm_loss, target_logits=lambda outputs: outputs.mlm_logits,
)  # fmt: skip
MASKED_LM_WITH_SENTENCE_PAIRS = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "SentencePairFeatureConverter"),
    target_fields=("target_tokens", "loss_mask", "sentence_label"),
)  # fmt: skip
PERMUTED_LM = dataclasses.replace(
    MASKED_LM, converter=ConverterName(PTMJAX_CONVERTERS, "PermutedLmFeatureConverter"),
    init_fields=("input_tokens", "permutation_rank"), loss=model_losses.permuted_lm_loss,
    target_logits=lambda outputs: outputs,
)  # fmt: skip
# The module reads the original tokens and the MLM selection itself; its generator samples from 'sample'.
REPLACED_TOKEN_DETECTION = dataclasses.replace(
    MASKED_LM, init_fields=("input_tokens", "target_tokens", "loss_mask"), target_fields=(),
    loss=model_losses.replaced_token_detection_loss, target_logits=lambda outputs: outputs.generator_logits,
    rng_streams=("sample",),
)  # fmt: skip

# Fine-tuning heads: one row per example (no packing), weighed by 'example_weight' or per token by 'tag_weights'.
SEQUENCE_CLASSIFICATION = Family(
    ConverterName(HEAD_CONVERTERS, "SequenceClassificationFeatureConverter"), ("input_tokens",),
    ("label", "example_weight"), None, "example_weight", model_losses.sequence_classification_loss,
    head_predictions=head_predictions.class_ids,
)  # fmt: skip
SEQUENCE_REGRESSION = dataclasses.replace(
    SEQUENCE_CLASSIFICATION, converter=ConverterName(HEAD_CONVERTERS, "SequenceRegressionFeatureConverter"),
    loss=model_losses.sequence_regression_loss, head_predictions=head_predictions.values,
)  # fmt: skip
TOKEN_TAGGING = Family(
    ConverterName(HEAD_CONVERTERS, "TokenTaggingFeatureConverter"), ("input_tokens",), ("tags", "tag_weights"), None,
    "tag_weights", model_losses.token_tagging_loss, head_predictions=head_predictions.class_ids,
)  # fmt: skip
SPAN_QUESTION_ANSWERING = Family(
    ConverterName(HEAD_CONVERTERS, "SpanQuestionAnsweringFeatureConverter"), ("input_tokens",),
    ("answer_start", "answer_end", "example_weight"), None, "example_weight",
    model_losses.span_question_answering_loss, head_predictions=head_predictions.answer_spans,
)  # fmt: skip


def sequence_head_family(num_labels: int) -> Family:
    """Regression when num_labels == 1 (as Hugging Face), else classification."""
    return SEQUENCE_REGRESSION if num_labels == 1 else SEQUENCE_CLASSIFICATION


def decoder_sequence_head_family(module: GPT2ForSequenceClassification) -> Family:
    """GPT-2's rows carry no token types and are padded with the model's pad_token_id."""
    family = sequence_head_family(module.num_labels)
    name = "Decoder" + ("Regression" if family is SEQUENCE_REGRESSION else "Classification") + "FeatureConverter"
    return dataclasses.replace(family, converter=ConverterName(HEAD_CONVERTERS, name, module.pad_token_id))


FAMILIES: dict[type[nn.Module], Callable[[nn.Module], Family]] = {
    EncoderDecoderInterface: lambda module: SEQUENCE_TO_SEQUENCE,  # T5, BART
    GPT2: lambda module: DECODER_ONLY,
    PermutationLM: lambda module: PERMUTED_LM,
    # BERT, RoBERTa, ALBERT: with a sentence-pair head (NSP / SOP) the batches carry sentence pairs.
    MaskedLMEncoder: lambda module: MASKED_LM_WITH_SENTENCE_PAIRS if module.config.pair_head else MASKED_LM,
    ElectraPretraining: lambda module: REPLACED_TOKEN_DETECTION,
    EncoderForSequenceClassification: lambda module: sequence_head_family(module.num_labels),
    EncoderForTokenClassification: lambda module: TOKEN_TAGGING,
    EncoderForQuestionAnswering: lambda module: SPAN_QUESTION_ANSWERING,
    GPT2ForSequenceClassification: decoder_sequence_head_family,
}


def family_of(module: nn.Module) -> Family:
    """The registered family of `module`'s class; names the known ones if none."""
    for cls in type(module).__mro__:
        if cls in FAMILIES:
            return FAMILIES[cls](module)
    known = ", ".join(sorted(cls.__name__ for cls in FAMILIES))
    raise ValueError(
        f"ptmjax does not know model class {type(module).__name__}; known: {known}. "
        "Register it in ptmjax.training.model_api.FAMILIES"
    )


@dataclasses.dataclass(frozen=True)
class ModelApi:
    """A Flax module with its family: parameters, rngs, batches, loss and scores.

    Every method is pure over explicit parameters; jit them as needed.
    """

    module: nn.Module
    family: Family

    def rngs(self, rng: jax.Array | None, train: bool) -> dict[str, jax.Array]:
        """The rngs of one application: 'dropout' in training, and the family's own streams.

        Without `rng` (evaluation), the family's streams draw from a fixed key.
        """
        if rng is None:
            rng = jax.random.key(EVAL_SAMPLE_SEED)
        rngs = {name: jax.random.fold_in(rng, i + 1) for i, name in enumerate(self.family.rng_streams)}
        if train:
            rngs["dropout"] = rng
        return rngs

    def init(self, rng: jax.Array) -> Any:
        """The parameters, boxed with their logical axes (nn.Partitioned).

        A one-token dummy batch suffices: parameter shapes do not depend on length.
        Under `jax.eval_shape` this allocates nothing.
        """
        return self.module.init({"params": rng, **self.rngs(rng, train=False)}, **self._dummy_inputs())["params"]

    def init_around(self, rng: jax.Array, present: Any) -> Any:
        """The parameters (unboxed): those of `present`, and the rest initialised as `init(rng)` would, but with
        `present` in place, so an initialiser that reads another parameter (prompt tuning's 'vocab' init reads
        the token table) reads the given one: a restored checkpoint's, when fine-tuning starts."""
        _, variables = self.module.apply(
            {"params": present}, **self._dummy_inputs(), rngs={"params": rng, **self.rngs(rng, train=False)},
            mutable=["params"],
        )  # fmt: skip
        return nn.unbox(variables["params"])

    def _dummy_inputs(self) -> dict[str, Array]:
        tokens = jnp.ones((1, 1), jnp.int32)
        return {name: tokens for name in self.family.init_fields}

    @functools.cached_property
    def boxed_abstract_params(self) -> Any:
        """`init`'s result as ShapeDtypeStructs in nn.Partitioned boxes; nothing is allocated."""
        return jax.eval_shape(self.init, jax.random.key(0))

    @property
    def abstract_params(self) -> Any:
        """The parameters' shapes and dtypes (ShapeDtypeStructs), unboxed."""
        return nn.unbox(self.boxed_abstract_params)

    @property
    def logical_axes(self) -> Any:
        """The parameters' logical axis names (a tree of PartitionSpecs)."""
        return nn.get_partition_spec(self.boxed_abstract_params)

    @property
    def scanning(self) -> layer_stack.LayerStacks | None:
        """The config if the module scans its layers, else None."""
        return layer_stack.scanning_config(self.module)

    def unscanned(self) -> ModelApi:
        """The same model with plain (unscanned) layers: the layout the optimizer, golden files and
        Hugging Face see. `layer_stack.scan` / `unscan` convert parameters between the two."""
        return self.with_scan_layers(False) if self.scanning else self

    def with_scan_layers(self, scan_layers: bool) -> ModelApi | None:
        """The same model with `scan_layers` set; None for a family without layer stacks."""
        other = layer_stack.with_scan_layers(self.module, scan_layers)
        return None if other is None else model_api(other)

    def model_inputs(self, batch: Batch) -> dict[str, Array]:
        """The features of `batch` the module takes: all but the target fields."""
        return {name: value for name, value in batch.items() if name not in self.family.target_fields}

    def loss(
        self, params: Any, batch: Batch, loss_config: LossConfig, dropout_rng: jax.Array | None = None
    ) -> tuple[Array, Array, Stats]:
        """Runs the module on `batch` (dropout on iff `dropout_rng` is given).

        Returns (summed token loss, per-batch loss including the sown aux losses, stats);
        see ptmjax/training/steps.py for how the train step combines them.
        With `loss_config.logits_chunk_size` the module gives its final hidden states and the
        logits are made a chunk of positions at a time (ptmjax/training/chunked_logits.py).
        """
        train = dropout_rng is not None
        chunked = loss_config.logits_chunk_size is not None
        if chunked:
            self.check_chunkable()
        outputs, variables = self.module.apply(
            {"params": params}, **self.model_inputs(batch), enable_dropout=train,
            rngs=self.rngs(dropout_rng, train), mutable=["losses"], method="hidden_states" if chunked else None,
        )  # fmt: skip
        if chunked:
            logits_fn = functools.partial(self.module.apply, {"params": params}, method="logits")
            terms = model_losses.chunked_sequence_to_sequence_loss(logits_fn, outputs, batch, loss_config)
        else:
            terms = self.family.loss(outputs, batch, loss_config)
        sown = jax.tree.leaves(variables.get("losses", {}))
        aux = sum((jnp.sum(x.astype(jnp.float32)) for x in sown), jnp.zeros((), jnp.float32))
        stats = terms.stats
        if sown:  # fixed when the step is traced: a model without MoE layers has no 'moe_aux_loss'
            tokens = stats.counts["token_loss"]
            stats = stats.merge(Stats.of(moe_aux_loss=(aux * tokens, tokens)))
        return terms.token_loss, terms.batch_loss + aux, stats

    def check_chunkable(self) -> None:
        """Raise unless the module is a language model with `hidden_states` and `logits` methods (T5, BART, GPT-2)."""
        methods = all(callable(getattr(self.module, name, None)) for name in ("hidden_states", "logits"))
        if self.family.loss is not model_losses.sequence_to_sequence_loss or not methods:
            raise ValueError(
                f"LossConfig.logits_chunk_size needs T5, BART or GPT-2, got {type(self.module).__name__}; "
                "set LossConfig.logits_chunk_size = None for this model"
            )

    def score(self, params: Any, batch: Batch, logits_chunk_size: int | None = None) -> Array:
        """float32 [b]: each row's log-likelihood of its targets, `sum_t w_t log p(y_t | ...)`.

        The targets and weights are the family's (`Family.targets`, `Family.loss_weights`):
        the decoder targets of an encoder-decoder or decoder-only model, the
        masked positions of an MLM (a pseudo-log-likelihood). No dropout. With
        `logits_chunk_size` (T5, BART, GPT-2) the logits are made that many
        positions at a time, as the chunked loss makes them.
        """
        if self.family.targets is None:
            raise ValueError(
                f"{type(self.module).__name__} is a fine-tuning head without target tokens to score; score with a "
                "language model (T5, BART, GPT-2) or a masked-LM encoder"
            )
        targets = batch[self.family.targets]
        variables, inputs, rngs = {"params": params}, self.model_inputs(batch), self.rngs(None, False)
        if logits_chunk_size is None:
            outputs = self.module.apply(variables, **inputs, rngs=rngs)
            log_probs = jax.nn.log_softmax(self.family.target_logits(outputs).astype(jnp.float32), axis=-1)
            token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [b, t]
        else:
            self.check_chunkable()
            hidden = self.module.apply(variables, **inputs, rngs=rngs, method="hidden_states")
            logits_fn = functools.partial(self.module.apply, variables, method="logits")
            token_log_probs = -chunked_token_cross_entropy(logits_fn, hidden, targets, logits_chunk_size)[0]
        return jnp.sum(token_log_probs * batch[self.family.loss_weights].astype(jnp.float32), axis=-1)

    def head_predictions(self, params: Any, batch: Batch) -> Array:
        """A task head's prediction per row (class ids, values, tag ids per token, answer spans); no dropout."""
        if self.family.head_predictions is None:
            raise ValueError(
                f"{type(self.module).__name__} has no task head; heads are the models of "
                "ptmjax/models/encoder_tasks.py and gpt2_tasks.py"
            )
        outputs = self.module.apply({"params": params}, **self.model_inputs(batch), rngs=self.rngs(None, False))
        return self.family.head_predictions(outputs, batch)

    def predict(
        self, params: Any, batch: Batch, config: decoding.DecodeConfig, ids: decoding.GenerationIds,
        rng: jax.Array | None = None,
    ) -> decoding.DecodeOutput:  # fmt: skip
        """Decodes `batch` with a key/value cache as `config` says (ptmjax/decoding); pure, so jit it
        with `config` and `ids` static. Encoder-decoders read 'encoder_input_tokens'; decoder-only
        models a prompt in 'decoder_input_tokens' (see decoding.prefill)."""
        if self.family.predict is None:
            raise ValueError(
                f"{type(self.module).__name__} does not generate text; decode with an encoder-decoder (T5, BART) "
                "or a decoder-only model (GPT-2)"
            )
        return self.family.predict(self.module, params, batch, config, ids, rng)


def model_api(module: nn.Module) -> ModelApi:
    """`module` with its registered family (raises for an unknown class)."""
    return ModelApi(module, family_of(module))
