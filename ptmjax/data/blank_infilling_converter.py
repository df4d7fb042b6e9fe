"""The seqio feature converter of GLM's blank-infilling rows (ptmjax/objectives/blank_infilling.py).

Task features (int32, one row each): inputs, targets, loss_mask, positions, block_positions;
task_feature_lengths give 'targets', the row length.
Model features [b, length], padded with 0, never packed (a row is one piece of text):
  decoder_input_tokens, decoder_target_tokens, decoder_loss_weights (the objective's loss_mask),
  decoder_positions, decoder_block_positions, decoder_segment_ids (1 on the row, 0 on padding) and
  decoder_causal_attention (1 on part A, where the block position is 0: read bidirectionally).
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec
TASK_TO_MODEL = {
    "inputs": "decoder_input_tokens", "targets": "decoder_target_tokens", "loss_mask": "decoder_loss_weights",
    "positions": "decoder_positions", "block_positions": "decoder_block_positions",
}


class BlankInfillingFeatureConverter(seqio.FeatureConverter):
    """GLM rows -> a decoder-only model's fields with 2D positions and part A as its bidirectional prefix."""

    TASK_FEATURES = {"targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        name: Spec(dtype=tf.int32)
        for name in (*TASK_TO_MODEL.values(), "decoder_segment_ids", "decoder_causal_attention")
    }
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError(
                "BlankInfillingFeatureConverter does not pack: a GLM row is one piece of text with its own part A; "
                "set `train.pack = False`"
            )
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        missing = sorted(set(TASK_TO_MODEL) - set(ds.element_spec))
        if missing:
            raise ValueError(
                f"BlankInfillingFeatureConverter needs task features {missing}, which the task does not produce "
                f"(it gives {sorted(ds.element_spec)}); use ptmjax.objectives.blank_infilling.blank_infilling"
            )

        def convert(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            out = {model: tf.cast(features[task], tf.int32) for task, model in TASK_TO_MODEL.items()}
            out["decoder_segment_ids"] = tf.ones_like(out["decoder_input_tokens"])
            out["decoder_causal_attention"] = tf.cast(out["decoder_block_positions"] == 0, tf.int32)
            return out

        ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)
        return seqio.utils.trim_and_pad_dataset(ds, self.get_model_feature_lengths(task_feature_lengths))

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return dict.fromkeys(self.MODEL_FEATURES, task_feature_lengths["targets"])
