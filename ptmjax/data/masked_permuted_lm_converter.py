"""The seqio feature converter of MPNet's rows (ptmjax/objectives/masked_permuted_lm.py).

Task features (int32, one row each): inputs and positions (the content stream), targets and loss_mask
(one per query). task_feature_lengths give 'inputs' (the content stream's length) and 'targets' (the
number of queries). Model features, padded with 0, never packed (a row is one piece of text):
  input_tokens, positions [b, inputs]; target_tokens, loss_mask [b, targets].
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec
CONTENT = {"inputs": "input_tokens", "positions": "positions"}
QUERIES = {"targets": "target_tokens", "loss_mask": "loss_mask"}


class MaskedPermutedLmFeatureConverter(seqio.FeatureConverter):
    """MPNet rows -> the content stream's tokens and positions, the queries' targets and weights."""

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {name: Spec(dtype=tf.int32) for name in (*CONTENT.values(), *QUERIES.values())}
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError(
                "MaskedPermutedLmFeatureConverter does not pack: an MPNet row is one piece of text in its own "
                "order; set `train.pack = False`"
            )
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        missing = sorted({*CONTENT, *QUERIES} - set(ds.element_spec))
        if missing:
            raise ValueError(
                f"MaskedPermutedLmFeatureConverter needs task features {missing}, which the task does not produce "
                f"(it gives {sorted(ds.element_spec)}); use ptmjax.objectives.masked_permuted_lm.masked_permuted_lm"
            )

        def convert(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            return {model: tf.cast(features[task], tf.int32) for task, model in {**CONTENT, **QUERIES}.items()}

        ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)
        return seqio.utils.trim_and_pad_dataset(ds, self.get_model_feature_lengths(task_feature_lengths))

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        lengths = {model: task_feature_lengths["inputs"] for model in CONTENT.values()}
        return {**lengths, **{model: task_feature_lengths["targets"] for model in QUERIES.values()}}
