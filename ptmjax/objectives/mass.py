"""MASS (Song et al., 2019): mask one contiguous span, predict it with the decoder.

For n raw tokens, a span of k = round(span_ratio * n) tokens (clipped to
1..n) starts at a position drawn uniformly from 0..n-k. Then
  inputs  = tokens with every span token replaced by `mask_id` (same length n)
  targets = the span (k tokens).
The encoder-decoder feature converter shifts the targets into the decoder
inputs, as MASS feeds the decoder the span's previous tokens. Add
`seqio.preprocessors.append_eos_after_trim` after `mass` in the task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import common


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MassOptions:
    """The settings of MASS, checked on construction.

    span_ratio: fraction of each piece that is masked, in (0, 1] (MASS: 0.5).
    mask_id: the mask id; None means `<extra_id_0>` (vocab_size - 1).
    """

    span_ratio: float = 0.5
    mask_id: int | None = None

    def __post_init__(self) -> None:
        common.check_fraction("span_ratio", self.span_ratio, "MASS", allow_zero=False)

    def targets_length(self, raw_length: int) -> int:
        """Longest span (no EOS) for pieces of at most `raw_length` tokens."""
        return min(max(round(raw_length * self.span_ratio), 1), raw_length)


def span_bounds(size: tf.Tensor, seed: tf.Tensor, span_ratio: float) -> tuple[tf.Tensor, tf.Tensor]:
    """(start, length) of the masked span of a sequence of `size` tokens."""
    length = tf.minimum(common.count_to_rate(size, span_ratio), size)
    start = tf.random.stateless_uniform([], seed, minval=0, maxval=size - length + 1, dtype=tf.int32)
    return start, length


@seqio.map_over_dataset(num_seeds=1)
def _mask_span(
    features: Mapping[str, tf.Tensor], seed: tf.Tensor, span_ratio: float, mask_id: int
) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    start, length = span_bounds(tf.size(tokens), seed, span_ratio)
    positions = tf.range(tf.size(tokens))
    in_span = (positions >= start) & (positions < start + length)
    inputs = tf.where(in_span, tf.constant(mask_id, tokens.dtype), tokens)
    return {"inputs": inputs, "targets": tokens[start : start + length]}


def mask_span(dataset: tf.data.Dataset, vocabulary: seqio.Vocabulary, options: MassOptions) -> tf.data.Dataset:
    """{'targets': tokens} -> {'inputs': tokens with one span masked, 'targets': the span}."""
    mask_id = common.default_mask_id(vocabulary, options.mask_id, "MASS")
    return _mask_span(dataset, span_ratio=options.span_ratio, mask_id=mask_id)


@gin.configurable
def mass(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: MassOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The MASS seqio preprocessor over tokenised 'targets'.

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs' (pieces fill it, EOS included);
        'targets', if given, must fit the span (checked).
      output_features: seqio features; 'targets' gives the vocabulary.
      options: the span's settings; None: `MassOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    options = options or MassOptions()
    vocabulary = common.vocabulary_of(output_features, "mass")
    raw_length = common.length_less_eos(sequence_length, output_features, "inputs", "mass")
    needed = options.targets_length(raw_length) + common.eos_count(output_features, "targets")
    declared = sequence_length.get("targets")
    if declared is not None and declared < needed:
        raise ValueError(
            f"targets length {declared} is too short for MASS with inputs length {sequence_length['inputs']} "
            f"and span_ratio={options.span_ratio}: the targets need {needed}; "
            f"set task_feature_lengths['targets'] >= {needed}"
        )
    dataset = common.token_stream(dataset, raw_length, max_chunk_tokens, documents_per_stream)
    return mask_span(dataset, vocabulary, options)
