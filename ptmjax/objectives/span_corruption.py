"""T5 span corruption ("i.i.d. random spans, one sentinel per span").

Given `length` raw tokens:
  num_noise_tokens = round(length * noise_density), clipped to [1, length - 1]
  num_noise_spans  = max(1, round(num_noise_tokens / mean_noise_span_length))
The noise tokens and the non-noise tokens are each split into `num_noise_spans`
non-empty spans uniformly at random, and the spans are interleaved starting
with non-noise: [keep_1, noise_1, keep_2, noise_2, ...]. Then
  inputs  = keep_1 <S_0> keep_2 <S_1> ...           (+ EOS)
  targets = <S_0> noise_1 <S_1> noise_2 ...         (+ EOS)
with sentinel S_i = vocab_size - 1 - i (`<extra_id_i>` in seqio vocabularies).
`round` is half-to-even, both here and in TF (`tf.round`).

`span_corruption` is the whole T5 chain after tokenisation: a random chunk of
each document, concatenation of 128 documents, split into pieces of exactly
the raw length whose corruption (+ EOS) fills `sequence_length['inputs']`
(`span_corruption_lengths`), then corruption. Add
`seqio.preprocessors.append_eos_after_trim` after it in the task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import token_streams


@gin.configurable
@dataclasses.dataclass(frozen=True)
class SpanCorruptionOptions:
    """The settings of span corruption, checked on construction.

    noise_density: fraction of the raw tokens that are masked, strictly between 0 and 1 (T5: 0.15).
    mean_noise_span_length: mean length of a masked span, at least 1 (T5: 3).
    """

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(f"noise_density={self.noise_density} must lie strictly between 0 and 1 (T5: 0.15)")
        if not self.mean_noise_span_length >= 1.0:
            raise ValueError(f"mean_noise_span_length={self.mean_noise_span_length} must be at least 1 (T5: 3.0)")


def noise_counts(length: int, options: SpanCorruptionOptions) -> tuple[int, int]:
    """(num_noise_tokens, num_noise_spans) for `length` raw tokens (length >= 2)."""
    num_noise = min(max(round(length * options.noise_density), 1), length - 1)
    return num_noise, max(round(num_noise / options.mean_noise_span_length), 1)


def corrupted_lengths(raw_length: int, options: SpanCorruptionOptions) -> tuple[int, int]:
    """(inputs, targets) lengths, without EOS, of the corruption of `raw_length` tokens (one sentinel per span)."""
    num_noise, num_spans = noise_counts(raw_length, options)
    return raw_length - num_noise + num_spans, num_noise + num_spans


def largest_raw_length(inputs_limit: int, targets_limit: int | None, options: SpanCorruptionOptions) -> int:
    """The largest raw length whose corruption has at most `inputs_limit` input and `targets_limit` target tokens.

    Lengths exclude EOS; targets_limit None means unlimited. Both corrupted
    lengths grow monotonically with the raw length (by 0 or 1 per token, for a
    density below 1), so counting up from 2 to the first overflow finds it.
    """

    def fits(raw: int) -> bool:
        inputs, targets = corrupted_lengths(raw, options)
        return inputs <= inputs_limit and (targets_limit is None or targets <= targets_limit)

    if not fits(2):
        raise ValueError(
            f"span corruption ({options}) of even 2 tokens needs {corrupted_lengths(2, options)} (inputs, targets) "
            f"tokens, more than the ({inputs_limit}, {targets_limit}) available; raise task_feature_lengths"
        )
    raw = 2
    while fits(raw + 1):
        raw += 1
    return raw


def span_corruption_lengths(inputs_length: int, options: SpanCorruptionOptions) -> tuple[int, int]:
    """(raw_tokens_length, targets_length) for corrupted inputs of `inputs_length`.

    raw_tokens_length is the largest raw length whose corruption plus EOS has
    at most `inputs_length` tokens (as T5 computes it); targets_length is the
    matching length of the targets, EOS included. For inputs 512: (568, 114);
    at noise density 0.5, (766, 512).
    """
    if inputs_length < 3:
        raise ValueError(f"inputs_length={inputs_length} is too short for span corruption; use at least 3")
    raw = largest_raw_length(inputs_length - 1, None, options)
    inputs, targets = (n + 1 for n in corrupted_lengths(raw, options))
    if options.noise_density == 0.5 and targets > inputs:
        # T5's adjustment (random_spans_helper): one raw token fewer makes the targets as long as the
        # inputs, a round number (512 -> raw 766, targets 512). It applies when the noise count rounded
        # up, so one token fewer has one noise token fewer: the targets shrink by exactly one.
        raw, targets = raw - 1, targets - 1
    return raw, targets


def _random_segmentation(num_items: tf.Tensor, num_segments: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Lengths of a uniformly random split of num_items into num_segments (>0 each)."""
    noise = tf.random.stateless_uniform([num_items - 1], seed)
    rank = tf.argsort(tf.argsort(noise))  # a random permutation of 0..num_items-2
    starts_segment = tf.cast(rank < num_segments - 1, tf.int32)  # item i+1 opens a segment
    segment_ids = tf.cumsum(tf.concat([[0], starts_segment], axis=0))
    return tf.math.bincount(segment_ids, minlength=num_segments, maxlength=num_segments, dtype=tf.int32)


def random_spans_noise_mask(length: tf.Tensor, seeds: Sequence[tf.Tensor], options: SpanCorruptionOptions) -> tf.Tensor:
    """bool[length], True on noise tokens; always starts with non-noise.

    Lengths below 2 are corrupted as if 2 long, then truncated (as in T5).
    """
    padded_length = tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(padded_length, tf.float64) * options.noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, padded_length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float64) / options.mean_noise_span_length), tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, seeds[0])
    keep_lengths = _random_segmentation(padded_length - num_noise, num_spans, seeds[1])
    span_lengths = tf.reshape(tf.stack([keep_lengths, noise_lengths], axis=1), [-1])
    span_is_noise = tf.tile([False, True], [num_spans])
    return tf.repeat(span_is_noise, span_lengths)[:length]


def _with_sentinels(
    tokens: tf.Tensor, sentinels: tf.Tensor, sentinel_kept: tf.Tensor, token_kept: tf.Tensor
) -> tf.Tensor:
    """Emits, position by position, the sentinel (if kept) then the token (if kept)."""
    values = tf.reshape(tf.stack([sentinels, tokens], axis=1), [-1])
    kept = tf.reshape(tf.stack([sentinel_kept, token_kept], axis=1), [-1])
    return tf.boolean_mask(values, kept)


def corrupt_with_mask(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(inputs, targets) of T5 span corruption for a given noise mask (no EOS)."""
    previous_is_noise = tf.concat([[False], noise_mask[:-1]], axis=0)
    span_start = noise_mask & ~previous_is_noise
    span_index = tf.cumsum(tf.cast(span_start, tokens.dtype)) - 1
    sentinels = vocab_size - 1 - span_index
    inputs = _with_sentinels(tokens, sentinels, span_start, ~noise_mask)
    targets = _with_sentinels(tokens, sentinels, span_start, noise_mask)
    return inputs, targets


@seqio.map_over_dataset(num_seeds=2)
@tf.autograph.experimental.do_not_convert  # straight-line TensorFlow: AutoGraph would only cost start-up time
def _corrupt_spans(
    features: Mapping[str, tf.Tensor],
    seeds: Sequence[tf.Tensor],
    vocab_size: int,
    options: SpanCorruptionOptions,
) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    mask = random_spans_noise_mask(tf.size(tokens), seeds, options)
    inputs, targets = corrupt_with_mask(tokens, mask, vocab_size)
    return {"inputs": inputs, "targets": targets}


def corrupt_spans(dataset: tf.data.Dataset, vocab_size: int, options: SpanCorruptionOptions) -> tf.data.Dataset:
    """Maps {'targets': raw tokens} to {'inputs', 'targets'} by span corruption."""
    return _corrupt_spans(dataset, vocab_size=vocab_size, options=options)


@gin.configurable
def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: SpanCorruptionOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The T5 span-corruption seqio preprocessor over tokenised 'targets'.

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs'; 'targets', if given, must fit the
        corrupted targets (see `span_corruption_lengths`).
      output_features: seqio features; 'targets' gives the sentinel ids.
      options: the corruption's settings; None: `SpanCorruptionOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    if "inputs" not in sequence_length or sequence_length["inputs"] is None:
        raise ValueError(f"span corruption needs sequence_length['inputs']; got {dict(sequence_length)}")
    options = options or SpanCorruptionOptions()
    raw_length, targets_length = span_corruption_lengths(sequence_length["inputs"], options)
    declared_targets = sequence_length.get("targets")
    if declared_targets is not None and declared_targets < targets_length:
        raise ValueError(
            f"targets length {declared_targets} is too short for span corruption with inputs length "
            f"{sequence_length['inputs']}: the targets need {targets_length}; set task_feature_lengths"
            f"['targets'] >= {targets_length}"
        )
    vocab_size = output_features["targets"].vocabulary.vocab_size
    dataset = token_streams.select_random_chunk(dataset, "targets", max_chunk_tokens)
    dataset = token_streams.concatenate_token_streams(dataset, "targets", documents_per_stream)
    dataset = token_streams.split_token_stream(dataset, "targets", raw_length)
    return corrupt_spans(dataset, vocab_size, options)
