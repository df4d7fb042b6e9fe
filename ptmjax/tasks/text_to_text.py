"""What the text-to-text tasks share: their registration (text in, tokenized with EOS), T5's text helpers and
postprocessors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import seqio
import tensorflow as tf

from ptmjax.data.without_autograph import without_autograph
from ptmjax.tasks import registry

DEFAULT_PREFIX = "ptmjax_"
TEXT_PREPROCESSORS = (without_autograph(seqio.preprocessors.tokenize), seqio.CacheDatasetPlaceholder(),
                      without_autograph(seqio.preprocessors.append_eos_after_trim))


def register(
    name: str,
    source: seqio.DataSource,
    text_preprocessor: Callable[[tf.data.Dataset], tf.data.Dataset] | None,
    vocabulary: seqio.Vocabulary,
    metric_fns: Sequence[Callable],
    postprocess_fn: Callable | None = None,
) -> seqio.Task:
    """Registers (or replaces) a text-to-text task: `text_preprocessor` makes 'inputs'/'targets' strings
    (None: the source has them), which are tokenized with `vocabulary` and get EOS."""
    preprocessors = [*([text_preprocessor] if text_preprocessor else []), *TEXT_PREPROCESSORS]
    return registry.register_task(name, source, preprocessors, vocabulary, metric_fns, postprocess_fn)


def tfds_source(tfds_name: str, splits: Mapping[str, str] | Sequence[str] | None = None) -> seqio.TfdsDataSource:
    """A TFDS source; nothing is read until a dataset is asked for."""
    return seqio.TfdsDataSource(tfds_name=tfds_name, splits=splits)


def pad_punctuation(text: tf.Tensor) -> tf.Tensor:
    """T5's `_pad_punctuation`: spaces around every character that is not a letter, digit, mark or '_'."""
    text = tf.strings.regex_replace(text, r"([^_\s\p{N}\p{L}\p{M}])", r" \1 ")
    return tf.strings.regex_replace(text, r"\s+", " ")


def join(parts: Sequence[tf.Tensor | str]) -> tf.Tensor:
    """Joins on spaces, collapsing runs of whitespace (T5's `_string_join`)."""
    return tf.strings.regex_replace(tf.strings.join(list(parts), separator=" "), r"\s+", " ")


def label_text(label: tf.Tensor, label_names: Sequence[str]) -> tf.Tensor:
    """The name of an integer label; '<unk>' for -1 (TFDS' label of unlabelled test examples), as in T5."""
    index = tf.maximum(tf.cast(label, tf.int32), 0)
    return tf.where(tf.equal(label, -1), tf.constant("<unk>"), tf.gather(list(label_names), index))


def string_label_to_class_id(label_names: Sequence[str]) -> Callable[..., int]:
    """A postprocessor: the index of the text in `label_names`, -1 for any other text (always wrong)."""
    names = list(label_names)

    def postprocess(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> int:
        del example, is_target
        return names.index(text) if text in names else -1

    return postprocess


def string_to_float(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> float:
    """A postprocessor: the text as a float, -1.0 when it is not a number (T5's `string_to_float`)."""
    del example, is_target
    try:
        return float(text)
    except ValueError:
        return -1.0


def as_text(value: bytes | str) -> str:
    """A string feature of an example as seqio's evaluator holds it (bytes) -> str."""
    return value.decode("utf-8") if isinstance(value, bytes) else value
