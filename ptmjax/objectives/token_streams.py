"""Token-stream preprocessors: random chunk, concatenate, split to a fixed length.

These turn documents of any length into examples of exactly `length` raw tokens
(the last piece of the stream may be shorter), as T5 does before corrupting
spans. All are seqio preprocessors over one integer feature (`feature_key`).
Their map functions are straight-line TensorFlow, with no Python control flow
over tensors, so they skip AutoGraph (`do_not_convert`), as span corruption's
does: converting them cost about 0.4 s of every pre-training run's start.
"""

from __future__ import annotations

import seqio
import tensorflow as tf


@seqio.map_over_dataset(num_seeds=1)
@tf.autograph.experimental.do_not_convert
def _select_random_chunk(
    features: dict[str, tf.Tensor], seed: tf.Tensor, feature_key: str, max_length: int
) -> dict[str, tf.Tensor]:
    tokens = features[feature_key]
    num_chunks = (tf.size(tokens) + max_length - 1) // max_length
    chunk = tf.random.stateless_uniform([], seed, minval=0, maxval=tf.maximum(num_chunks, 1), dtype=tf.int32)
    return {feature_key: tokens[chunk * max_length : (chunk + 1) * max_length]}


def select_random_chunk(dataset: tf.data.Dataset, feature_key: str, max_length: int) -> tf.data.Dataset:
    """Keeps one of the `max_length`-aligned chunks of each example, uniformly.

    Only `feature_key` is kept; empty examples are dropped.
    """
    if max_length < 1:
        raise ValueError(f"max_length={max_length} must be a positive number of tokens")
    dataset = dataset.filter(lambda x: tf.size(x[feature_key]) > 0)
    return _select_random_chunk(dataset, feature_key=feature_key, max_length=max_length)


def concatenate_token_streams(dataset: tf.data.Dataset, feature_key: str, num_examples: int) -> tf.data.Dataset:
    """Concatenates each run of `num_examples` consecutive examples into one."""
    if num_examples < 1:
        raise ValueError(f"num_examples={num_examples} must be at least 1")
    dataset = dataset.map(lambda x: x[feature_key])
    dataset = dataset.ragged_batch(num_examples)
    return dataset.map(lambda batch: {feature_key: batch.flat_values})


def split_token_stream(dataset: tf.data.Dataset, feature_key: str, length: int) -> tf.data.Dataset:
    """Splits each example into consecutive pieces of `length` tokens (last: rest)."""
    if length < 1:
        raise ValueError(f"length={length} must be a positive number of tokens")

    @tf.autograph.experimental.do_not_convert
    def split(features: dict[str, tf.Tensor]) -> tf.data.Dataset:
        tokens = features[feature_key]
        size = tf.size(tokens)
        num_full = size // length
        row_lengths = tf.concat([tf.fill([num_full], length), tf.reshape(size - num_full * length, [1])], axis=0)
        row_lengths = tf.boolean_mask(row_lengths, row_lengths > 0)
        pieces = tf.RaggedTensor.from_row_lengths(tokens, tf.cast(row_lengths, tf.int64))
        return tf.data.Dataset.from_tensor_slices({feature_key: pieces})

    return dataset.flat_map(split)
