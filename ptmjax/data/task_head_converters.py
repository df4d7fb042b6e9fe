"""seqio feature converters for fine-tuning heads: sequence classification / regression, token tagging, span QA,
and sentence-embedding pairs.

Task features (int32 unless said; [n] = the length of 'inputs'):
  classification: inputs [n], label (scalar; float32 for regression), optional token_type_ids [n].
  tagging: inputs [n], tags [n] (the tag id on each word's first sub-token, -1 where not scored).
  span QA: inputs [n] (question, separator, context), optional token_type_ids [n] (0 question, 1 context),
    optional context_mask [n] (1 on the context), answer_start, answer_end (scalars: inclusive token
    indices into inputs).
  embedding pairs: inputs [n] (the anchor), targets [m] (its positive).
Model features ([b, L] sequences, [b] scalars):
  classification: input_tokens, token_type_ids, label, example_weight.
  tagging: input_tokens, token_type_ids, tags (>= 0 everywhere), tag_weights (1 where scored).
  span QA: input_tokens, token_type_ids, context_mask (where an answer may lie: the task's, else the
    token type 1 positions, else every real token), answer_start, answer_end, example_weight.
  embedding pairs: input_tokens [b, L], positive_tokens [b, 'targets' length], example_weight.
token_type_ids are zeros when the task has none. 'example_weight' is 1 for
every example (the train step normalises the loss by its sum: the number
of examples); a QA example whose answer truncation cut off gets 0, as
Hugging Face ignores answers outside the input. Padded rows of a batch
(all zeros) weigh nothing. Rows are padded, never packed: a row is one example.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec
Features = Mapping[str, tf.Tensor]


class TaskHeadFeatureConverter(seqio.FeatureConverter):
    """Pads 'inputs' (and the other sequences) to the 'inputs' length; subclasses name the label features.

    LABELS: task scalar features -> their dtype. PAD_ID: the id 'input_tokens' is padded with.
    """

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {"input_tokens": Spec(dtype=tf.int32), "token_type_ids": Spec(dtype=tf.int32)}
    PACKING_FEATURE_DTYPES = {}
    LABELS: dict[str, tf.DType] = {}
    PAD_ID = 0

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError(
                f"{type(self).__name__} does not pack: a fine-tuning row is one example; set `train.pack = False`"
            )
        super().__init__(pack=False, **kwargs)

    def required_features(self) -> list[str]:
        return ["inputs", *self.LABELS]

    def example_features(self, features: Features, length: int) -> dict[str, tf.Tensor]:
        """One unpadded example -> its model features (before padding); subclasses add their labels."""
        tokens = tf.cast(features["inputs"], tf.int32)[:length]
        types = features.get("token_type_ids")
        types = tf.zeros_like(tokens) if types is None else tf.cast(types, tf.int32)[:length]
        return {"input_tokens": tokens, "token_type_ids": types, "real": tf.ones_like(tokens)}

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        length = task_feature_lengths["inputs"]
        missing = sorted(set(self.required_features()) - set(ds.element_spec))
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs task features {missing}, which the task does not produce (it gives "
                f"{sorted(ds.element_spec)}); see ptmjax/data/task_head_converters.py for the features of each head"
            )
        for name, dtype in self.LABELS.items():
            spec = ds.element_spec[name]
            if spec.shape.rank != 0 or spec.dtype != dtype:
                raise ValueError(
                    f"{type(self).__name__} needs task feature {name!r} as a {dtype.name} scalar, got "
                    f"{spec.dtype.name} of shape {spec.shape}; cast it in the task's preprocessors"
                )
        ds = ds.map(lambda f: self.example_features(f, length), num_parallel_calls=tf.data.AUTOTUNE)
        sequences = [name for name, spec in ds.element_spec.items() if spec.shape.rank == 1]
        ds = seqio.utils.trim_and_pad_dataset(ds, {name: length for name in sequences})
        return ds.map(self.padded, num_parallel_calls=tf.data.AUTOTUNE)

    def padded(self, features: Features) -> dict[str, tf.Tensor]:
        """Fills the padding of 'input_tokens' with PAD_ID and drops the helper 'real' mask."""
        out = {name: value for name, value in features.items() if name != "real"}
        if self.PAD_ID:
            out["input_tokens"] = tf.where(features["real"] > 0, features["input_tokens"], self.PAD_ID)
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        length = task_feature_lengths["inputs"]
        return {name: length if spec.rank == 1 else 1 for name, spec in self.MODEL_FEATURES.items()}


class SequenceClassificationFeatureConverter(TaskHeadFeatureConverter):
    """'inputs', 'label' (int32) [, 'token_type_ids'] -> 'input_tokens', 'token_type_ids', 'label', 'example_weight'."""

    LABELS = {"label": tf.int32}
    MODEL_FEATURES = {
        **TaskHeadFeatureConverter.MODEL_FEATURES,
        "label": Spec(dtype=tf.int32, rank=0),
        "example_weight": Spec(dtype=tf.int32, rank=0),
    }

    def example_features(self, features: Features, length: int) -> dict[str, tf.Tensor]:
        out = super().example_features(features, length)
        return {**out, "label": features["label"], "example_weight": tf.constant(1, tf.int32)}


class SequenceRegressionFeatureConverter(SequenceClassificationFeatureConverter):
    """As SequenceClassificationFeatureConverter with a float32 'label' (num_labels == 1)."""

    LABELS = {"label": tf.float32}
    MODEL_FEATURES = {
        **SequenceClassificationFeatureConverter.MODEL_FEATURES, "label": Spec(dtype=tf.float32, rank=0),
    }


class TokenTaggingFeatureConverter(TaskHeadFeatureConverter):
    """'inputs', 'tags' [, 'token_type_ids'] -> 'input_tokens', 'token_type_ids', 'tags', 'tag_weights'."""

    MODEL_FEATURES = {
        **TaskHeadFeatureConverter.MODEL_FEATURES, "tags": Spec(dtype=tf.int32), "tag_weights": Spec(dtype=tf.int32),
    }

    def required_features(self) -> list[str]:
        return ["inputs", "tags"]

    def example_features(self, features: Features, length: int) -> dict[str, tf.Tensor]:
        out = super().example_features(features, length)
        tags = tf.cast(features["tags"], tf.int32)[:length]
        return {**out, "tags": tf.maximum(tags, 0), "tag_weights": tf.cast(tags >= 0, tf.int32)}


class SpanQuestionAnsweringFeatureConverter(TaskHeadFeatureConverter):
    """'inputs', 'answer_start', 'answer_end' [, 'token_type_ids', 'context_mask'] -> 'input_tokens',
    'token_type_ids', 'context_mask', 'answer_start', 'answer_end', 'example_weight' (0 when the answer does not
    fit the length)."""

    LABELS = {"answer_start": tf.int32, "answer_end": tf.int32}
    MODEL_FEATURES = {
        **TaskHeadFeatureConverter.MODEL_FEATURES,
        "context_mask": Spec(dtype=tf.int32),
        "answer_start": Spec(dtype=tf.int32, rank=0),
        "answer_end": Spec(dtype=tf.int32, rank=0),
        "example_weight": Spec(dtype=tf.int32, rank=0),
    }

    def example_features(self, features: Features, length: int) -> dict[str, tf.Tensor]:
        out = super().example_features(features, length)
        context = features.get("context_mask")
        if context is None:
            typed = tf.cast(out["token_type_ids"] == 1, tf.int32)
            context = tf.cond(tf.reduce_any(typed > 0), lambda: typed, lambda: out["real"])
        out["context_mask"] = tf.cast(context, tf.int32)[:length]
        start, end = features["answer_start"], features["answer_end"]
        fits = (start >= 0) & (start <= end) & (end < tf.shape(out["input_tokens"])[0])
        last = length - 1
        return {
            **out, "answer_start": tf.clip_by_value(start, 0, last), "answer_end": tf.clip_by_value(end, 0, last),
            "example_weight": tf.cast(fits, tf.int32),
        }


class DecoderClassificationFeatureConverter(SequenceClassificationFeatureConverter):
    """GPT-2 classification: 'input_tokens' (right-padded with PAD_ID), 'label', 'example_weight';
    token types are dropped (GPT-2 has none)."""

    MODEL_FEATURES = {
        name: spec for name, spec in SequenceClassificationFeatureConverter.MODEL_FEATURES.items()
        if name != "token_type_ids"
    }

    def padded(self, features: Features) -> dict[str, tf.Tensor]:
        out = super().padded(features)
        del out["token_type_ids"]
        return out


class DecoderRegressionFeatureConverter(DecoderClassificationFeatureConverter):
    """GPT-2 regression: as DecoderClassificationFeatureConverter with a float32 'label'."""

    LABELS = {"label": tf.float32}
    MODEL_FEATURES = {**DecoderClassificationFeatureConverter.MODEL_FEATURES, "label": Spec(dtype=tf.float32, rank=0)}


class EmbeddingPairFeatureConverter(TaskHeadFeatureConverter):
    """'inputs', 'targets' -> 'input_tokens' (the anchors, at the 'inputs' length), 'positive_tokens' (at the
    'targets' length), both padded with PAD_ID, and 'example_weight'; no token types."""

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_tokens": Spec(dtype=tf.int32), "positive_tokens": Spec(dtype=tf.int32),
        "example_weight": Spec(dtype=tf.int32, rank=0),
    }

    def required_features(self) -> list[str]:
        return ["inputs", "targets"]

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        lengths = {"input_tokens": task_feature_lengths["inputs"], "positive_tokens": task_feature_lengths["targets"]}

        def features(example: Features) -> dict[str, tf.Tensor]:
            out = {name: tf.cast(example[key], tf.int32)[: lengths[name]]
                   for name, key in (("input_tokens", "inputs"), ("positive_tokens", "targets"))}
            return {**out, "example_weight": tf.constant(1, tf.int32)}

        def padded(example: Features) -> dict[str, tf.Tensor]:
            return {**example, **{name: tf.ensure_shape(tf.pad(
                example[name], [[0, length - tf.shape(example[name])[0]]], constant_values=self.PAD_ID), [length])
                for name, length in lengths.items()}}

        return ds.map(features, num_parallel_calls=tf.data.AUTOTUNE).map(padded, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return {"input_tokens": task_feature_lengths["inputs"], "positive_tokens": task_feature_lengths["targets"],
                "example_weight": 1}


@functools.cache
def padded_with(converter: type[TaskHeadFeatureConverter], pad_id: int) -> type[TaskHeadFeatureConverter]:
    """`converter` padding 'input_tokens' with `pad_id` (a model's pad_token_id) instead of 0."""
    if pad_id == converter.PAD_ID:
        return converter
    return type(f"{converter.__name__}PaddedWith{pad_id}", (converter,), {"PAD_ID": pad_id})
