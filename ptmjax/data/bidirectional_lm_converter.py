"""The seqio feature converter of ELMo's rows (ptmjax/tasks/elmo.py): both directions' targets from one row.

Task features: 'targets' (word ids [n]) and 'target_chars' ([n, max_characters]); task_feature_lengths give
'targets'. Model features, padded with 0, never packed (the LSTMs read a row from its first to its last word):
  input_tokens [b, n], input_chars [b, n, max_characters];
  forward_targets, forward_weights [b, n]: the next word, 1 where position t and t + 1 are words;
  backward_targets, backward_weights [b, n]: the previous word, 1 where t - 1 and t are words.
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec
TARGETS = ("forward_targets", "forward_weights", "backward_targets", "backward_weights")


class BidirectionalLmFeatureConverter(seqio.FeatureConverter):
    """ELMo rows -> the words, their characters, and each direction's targets and weights."""

    TASK_FEATURES = {"targets": Spec(dtype=tf.int32)}  # and 'target_chars', of the same length
    MODEL_FEATURES = {"input_tokens": Spec(dtype=tf.int32), "input_chars": Spec(dtype=tf.int32, rank=2),
                      **{name: Spec(dtype=tf.int32) for name in TARGETS}}
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError("BidirectionalLmFeatureConverter does not pack: each LSTM reads a row from its first "
                             "to its last word; set `train.pack = False`")
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        length = task_feature_lengths["targets"]
        ds = seqio.utils.trim_and_pad_dataset(ds, {"targets": length, "target_chars": length})

        def convert(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            tokens = tf.cast(features["targets"], tf.int32)
            word = tf.cast(tokens != 0, tf.int32)
            after, before = tf.pad(tokens[1:], [[0, 1]]), tf.pad(tokens[:-1], [[1, 0]])
            return {
                "input_tokens": tokens, "input_chars": tf.cast(features["target_chars"], tf.int32),
                "forward_targets": after, "forward_weights": word * tf.cast(after != 0, tf.int32),
                "backward_targets": before, "backward_weights": word * tf.cast(before != 0, tf.int32),
            }

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return {name: task_feature_lengths["targets"] for name in self.MODEL_FEATURES}
