"""Shared pieces of the objective preprocessors: lengths, token streams, special ids.

Conventions (as in `span_corruption`): the tokenised text arrives as an int32
'targets' feature; ids 0 (pad) and 1 (EOS) are special and the top
`vocabulary.extra_ids` ids are the sentinels `<extra_id_i>`.
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

from ptmjax.objectives import token_streams

PAD_ID = 0
EOS_ID = 1
FIRST_REGULAR_ID = 3  # after pad, eos, unk


def required_length(sequence_length: Mapping[str, int] | None, key: str, objective: str) -> int:
    """sequence_length[key], or a ValueError naming the objective and the fix."""
    if not sequence_length or sequence_length.get(key) is None:
        raise ValueError(
            f"{objective} needs sequence_length[{key!r}]; got {dict(sequence_length or {})}; "
            f"set task_feature_lengths[{key!r}]"
        )
    return int(sequence_length[key])


def eos_count(output_features: Mapping[str, seqio.Feature], key: str) -> int:
    """1 if output_features[key] appends EOS (room must be left for it), else 0."""
    feature = output_features.get(key)
    return int(bool(feature is not None and feature.add_eos))


def length_less_eos(
    sequence_length: Mapping[str, int] | None, output_features: Mapping[str, seqio.Feature], key: str, objective: str
) -> int:
    """Raw tokens that fit in sequence_length[key] once the feature's EOS (if it adds one) is appended."""
    return required_length(sequence_length, key, objective) - eos_count(output_features, key)


def vocabulary_of(output_features: Mapping[str, seqio.Feature], objective: str) -> seqio.Vocabulary:
    """The vocabulary of the 'targets' feature."""
    if "targets" not in output_features:
        raise ValueError(f"{objective} needs a 'targets' output feature; got {sorted(output_features)}")
    return output_features["targets"].vocabulary


def sentinel_start(vocabulary: seqio.Vocabulary) -> int:
    """The first sentinel id (ids at or above it are `<extra_id_i>`)."""
    return vocabulary.vocab_size - int(getattr(vocabulary, "extra_ids", 0) or 0)


def default_mask_id(vocabulary: seqio.Vocabulary, mask_id: int | None, objective: str) -> int:
    """mask_id, or `<extra_id_0>` (vocab_size - 1) when None; checked to lie in the vocabulary."""
    if mask_id is None:
        mask_id = vocabulary.vocab_size - 1
    if not 0 <= mask_id < vocabulary.vocab_size or mask_id in (PAD_ID, EOS_ID):
        raise ValueError(
            f"{objective}: mask_id={mask_id} must be a non-special id below vocab_size={vocabulary.vocab_size} "
            "(e.g. a sentinel such as vocab_size - 1)"
        )
    return mask_id


def token_stream(
    dataset: tf.data.Dataset, raw_length: int, max_chunk_tokens: int, documents_per_stream: int
) -> tf.data.Dataset:
    """{'targets': document tokens} -> {'targets': pieces of `raw_length` tokens (last: the rest)}.

    A random chunk of at most `max_chunk_tokens` of each document, then
    `documents_per_stream` documents concatenated, then split (as T5 does).
    """
    if raw_length < 1:
        raise ValueError(f"raw_length={raw_length} must be at least 1; raise the task's sequence lengths")
    dataset = token_streams.select_random_chunk(dataset, "targets", max_chunk_tokens)
    dataset = token_streams.concatenate_token_streams(dataset, "targets", documents_per_stream)
    return token_streams.split_token_stream(dataset, "targets", raw_length)


def check_fraction(name: str, value: float, objective: str, *, allow_zero: bool = True, allow_one: bool = True) -> None:
    """Raises a ValueError naming `name` unless 0 <= value <= 1 (bounds as allowed)."""
    low_ok = value > 0.0 or (allow_zero and value == 0.0)
    high_ok = value < 1.0 or (allow_one and value == 1.0)
    if not (low_ok and high_ok):
        bounds = f"{'[' if allow_zero else '('}0, 1{']' if allow_one else ')'}"
        raise ValueError(f"{objective}: {name}={value} must lie in {bounds}")


def random_permutation(size: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """int32[size], a uniformly random permutation of 0..size-1."""
    return tf.argsort(tf.random.stateless_uniform([size], seed), stable=True)


def first_in_order(order: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """bool[n], True at order[:count]: the first `count` of a permutation `order` of 0..n-1."""
    size = tf.size(order)
    return tf.scatter_nd(order[:, None], tf.range(size) < count, [size])


def count_to_rate(total: tf.Tensor, rate: float) -> tf.Tensor:
    """round(total * rate) as int32 (half to even), at least 1 when total > 0 and rate > 0."""
    count = tf.cast(tf.round(tf.cast(total, tf.float64) * rate), tf.int32)
    if rate > 0.0:
        count = tf.where(total > 0, tf.maximum(count, 1), 0)
    return tf.minimum(count, total)
