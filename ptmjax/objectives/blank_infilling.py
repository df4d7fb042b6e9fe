"""GLM's autoregressive blank infilling (Du et al., 2022): spans blanked in part A, regenerated in part B.

Each piece of n raw tokens becomes one row:
  num_masked = round(n * noise_density) (at least 1); span lengths are drawn
  i.i.d. from Poisson(span_length_lambda) restricted to 1..max_span_length
  (GLM's block-length distribution) until they cover num_masked, the last one
  cut so they cover it exactly; the spans are placed uniformly at random
  without overlap (two may touch) and in a random order along the text.
  Part A = the text with each span replaced by one [MASK];
  part B = the spans in a second, independent random order, each as
           inputs  [START] x_1 ... x_l
           targets x_1 ... x_l [END].
Row features (int32, all of the row's length):
  inputs          = part A, then part B's inputs;
  targets         = 0 on part A, then part B's targets;
  loss_mask       = 0 on part A, 1 on part B;
  positions       = 0, 1, ... on part A; on part B, the part-A position of the span's [MASK];
  block_positions = 0 on part A; 1, ..., l + 1 within each span of part B.
The model (GPT-2 with `block_position_embeddings`) reads part A bidirectionally
and part B causally after all of A (a prefix-LM mask over part A).
[MASK], [START], [END] are `<extra_id_0>`, `<extra_id_1>`, `<extra_id_2>` (`blank_ids`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import common

FEATURES = ("inputs", "targets", "loss_mask", "positions", "block_positions")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BlankInfillingOptions:
    """The setting of GLM's blank infilling, checked on construction.

    noise_density: the fraction of each piece's tokens that is blanked, in (0, 1) (GLM's BERT-like setting: 0.15).
    span_length_lambda: the Poisson mean of the span lengths, positive (GLM: 3).
    max_span_length: the longest span drawn, at least 1 (GLM: 39).
    """

    noise_density: float = 0.15
    span_length_lambda: float = 3.0
    max_span_length: int = 39

    def __post_init__(self) -> None:
        common.check_fraction("noise_density", self.noise_density, "blank infilling", allow_zero=False,
                              allow_one=False)
        if not self.span_length_lambda > 0:
            raise ValueError(f"blank infilling: span_length_lambda={self.span_length_lambda} must be positive (GLM: 3)")
        if self.max_span_length < 1:
            raise ValueError(f"blank infilling: max_span_length={self.max_span_length} must be at least 1 (GLM: 39)")

    def span_length_probabilities(self) -> list[float]:
        """P(length = k) for k = 1..max_span_length: Poisson(lambda) restricted to that range and renormalised."""
        weights = [self.span_length_lambda**k / math.factorial(k) for k in range(1, self.max_span_length + 1)]
        return [w / sum(weights) for w in weights]


class BlankIds(NamedTuple):
    """The special tokens of blank infilling."""

    mask: int
    start: int
    end: int


def blank_ids(vocab_size: int) -> BlankIds:
    """[MASK], [START], [END] = `<extra_id_0>`, `<extra_id_1>`, `<extra_id_2>` of a vocabulary of `vocab_size`."""
    return BlankIds(vocab_size - 1, vocab_size - 2, vocab_size - 3)


def masked_count(raw_length: int, options: BlankInfillingOptions) -> int:
    """round(raw_length * noise_density) (half to even, as TF rounds), at least 1 and at most raw_length."""
    return min(max(round(raw_length * options.noise_density), 1), raw_length)


def largest_raw_length(row_length: int, options: BlankInfillingOptions) -> int:
    """The largest piece whose row fits `row_length` whatever the spans: n + 2 * num_masked (every span of
    length 1 adds a [MASK] and a [START])."""
    if row_length < 3:
        raise ValueError(f"blank infilling needs rows of at least 3 tokens, got {row_length}; raise the row length")
    raw = 1
    while raw + 1 + 2 * masked_count(raw + 1, options) <= row_length:
        raw += 1
    return raw


def span_lengths(num_masked: tf.Tensor, seeds: Sequence[tf.Tensor], options: BlankInfillingOptions) -> tf.Tensor:
    """int32[num_spans]: lengths drawn until they cover num_masked (the last one cut), in a random order."""
    log_p = tf.math.log(tf.constant([options.span_length_probabilities()], tf.float32))
    draws = tf.cast(tf.random.stateless_categorical(log_p, num_masked, seeds[0], dtype=tf.int32)[0] + 1, tf.int32)
    ends = tf.minimum(tf.cumsum(draws), num_masked)
    starts = tf.minimum(tf.cumsum(draws, exclusive=True), num_masked)
    lengths = tf.boolean_mask(ends - starts, starts < num_masked)
    return tf.gather(lengths, common.random_permutation(tf.size(lengths), seeds[1]))


def blank_infill(
    tokens: tf.Tensor, seeds: Sequence[tf.Tensor], ids: BlankIds, options: BlankInfillingOptions
) -> dict[str, tf.Tensor]:
    """The row features (see the module docstring) of one piece `tokens` [n], n >= 1."""
    num_masked = common.count_to_rate(tf.size(tokens), options.noise_density)
    lengths = span_lengths(num_masked, seeds[:2], options)
    num_spans = tf.size(lengths)
    num_slots = tf.size(tokens) - num_masked + num_spans  # part A: the kept tokens and one [MASK] per span
    is_span = common.first_in_order(common.random_permutation(num_slots, seeds[2]), num_spans)
    span_index = tf.cumsum(tf.cast(is_span, tf.int32)) - 1
    slot_lengths = tf.where(is_span, tf.gather(lengths, tf.maximum(span_index, 0)), 1)
    slot_starts = tf.cumsum(slot_lengths, exclusive=True)  # where each slot begins in the text
    part_a = tf.where(is_span, ids.mask, tf.gather(tokens, tf.minimum(slot_starts, tf.size(tokens) - 1)))
    mask_positions = tf.boolean_mask(tf.range(num_slots), is_span)  # [num_spans], in text order
    order = common.random_permutation(num_spans, seeds[3])  # part B's order of the spans
    b_lengths = tf.gather(lengths, order) + 1
    b_span = tf.repeat(order, b_lengths)
    offset = tf.range(tf.reduce_sum(b_lengths)) - tf.repeat(tf.cumsum(b_lengths, exclusive=True), b_lengths)
    source = tf.gather(tf.boolean_mask(slot_starts, is_span), b_span) + offset  # the text index of the target
    length = tf.gather(lengths, b_span)
    text = tf.gather(tokens, tf.clip_by_value(source, 0, tf.size(tokens) - 1))
    b_inputs = tf.where(offset == 0, ids.start, tf.gather(tokens, tf.clip_by_value(source - 1, 0, tf.size(tokens) - 1)))
    zeros_a, ones_b = tf.zeros_like(part_a), tf.ones_like(b_span)
    return {
        "inputs": tf.concat([part_a, b_inputs], 0),
        "targets": tf.concat([zeros_a, tf.where(offset == length, ids.end, text)], 0),
        "loss_mask": tf.concat([zeros_a, ones_b], 0),
        "positions": tf.concat([tf.range(num_slots), tf.gather(mask_positions, b_span)], 0),
        "block_positions": tf.concat([zeros_a, offset + 1], 0),
    }


@seqio.map_over_dataset(num_seeds=4)
@tf.autograph.experimental.do_not_convert  # straight-line TensorFlow
def _blank_infill(
    features: Mapping[str, tf.Tensor], seeds: Sequence[tf.Tensor], ids: BlankIds, options: BlankInfillingOptions
) -> dict[str, tf.Tensor]:
    return blank_infill(features["targets"], seeds, ids, options)


def blank_infill_dataset(dataset: tf.data.Dataset, ids: BlankIds, options: BlankInfillingOptions) -> tf.data.Dataset:
    """{'targets': pieces, each non-empty} -> the rows of blank infilling (see the module docstring)."""
    return _blank_infill(dataset, ids=ids, options=options)


@gin.configurable
def blank_infilling(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: BlankInfillingOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """GLM's blank-infilling seqio preprocessor over tokenised 'targets' (see the module docstring).

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: 'targets' gives the row length; every row fits it (`largest_raw_length`).
      output_features: seqio features; 'targets' gives the vocabulary whose sentinels are the special ids.
      options: the spans' setting; None: `BlankInfillingOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    options = options or BlankInfillingOptions()
    row_length = common.required_length(sequence_length, "targets", "blank infilling")
    vocabulary = common.vocabulary_of(output_features, "blank infilling")
    dataset = common.token_stream(dataset, largest_raw_length(row_length, options), max_chunk_tokens,
                                  documents_per_stream)
    return blank_infill_dataset(dataset, blank_ids(vocabulary.vocab_size), options)
