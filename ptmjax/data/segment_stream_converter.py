"""The seqio feature converter of Transformer-XL's rows: row r of each batch continues row r of the batch before.

The task's examples are whole documents ('targets', trimmed to task_feature_lengths['targets'], so that
length bounds a document, not a row: e.g. 'ptmjax_stdlib_documents'). They are dealt to `rows` lanes
in turn (document d to lane d mod rows); each lane's documents follow each other as one token stream, as
the original code reads its corpus, and the stream is cut into consecutive segments of `segment_length`
tokens. The converter's output interleaves the lanes, lane 0 to rows - 1, so batches of `rows` examples
(the train batch size, unshuffled after conversion as `pipeline.get_dataset` batches) hold segment t of
every lane in batch t. It stops when the shortest lane runs out (never, for a repeated training split).

Model features [rows, segment_length], never packed: decoder_input_tokens (the segment),
decoder_target_tokens (the segment shifted by one: its last target is the next segment's first token)
and decoder_loss_weights (1). Each lane reads the task's dataset again (`Dataset.shard`), so a task's
preprocessing runs `rows` times; cache the task where that costs.

`rows` and `segment_length` come from gin (`SegmentStreamFeatureConverter.rows = %BATCH_SIZE`, see
gin_configs/runs/txl_demo.gin) or the constructor.
"""

from __future__ import annotations

from collections.abc import Mapping

import gin
import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec
MODEL_FIELDS = ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights")


@gin.configurable
class SegmentStreamFeatureConverter(seqio.FeatureConverter):
    """Documents -> consecutive segments, lane r in row r of every batch of `rows` (see the module doc)."""

    TASK_FEATURES = {"targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {name: Spec(dtype=tf.int32) for name in MODEL_FIELDS}
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, rows: int | None = None, segment_length: int | None = None, **kwargs):
        if pack:
            raise ValueError("SegmentStreamFeatureConverter does not pack: each row continues the row before it; "
                             "set `train.pack = False`")
        for name, value in (("rows", rows), ("segment_length", segment_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SegmentStreamFeatureConverter.{name}={value!r} must be a positive int; bind it "
                                 f"in gin (e.g. SegmentStreamFeatureConverter.{name} = "
                                 f"{'%BATCH_SIZE' if name == 'rows' else '64'})")
        self.rows, self.segment_length = rows, segment_length
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        lanes = tuple(self._segments(ds.shard(self.rows, lane)) for lane in range(self.rows))
        interleaved = tf.data.Dataset.zip(lanes).flat_map(
            lambda *segments: tf.data.Dataset.from_tensor_slices(tf.stack(segments)))
        return interleaved.map(lambda segment: {
            "decoder_input_tokens": segment[:-1], "decoder_target_tokens": segment[1:],
            "decoder_loss_weights": tf.ones_like(segment[1:]),
        })

    def _segments(self, documents: tf.data.Dataset) -> tf.data.Dataset:
        """One lane's stream of tokens -> windows of segment_length + 1 tokens, each starting where the
        previous one's inputs end."""
        tokens = documents.map(lambda example: tf.cast(example["targets"], tf.int32)).unbatch()
        windows = tokens.window(self.segment_length + 1, shift=self.segment_length, drop_remainder=True)
        return windows.flat_map(lambda window: window.batch(self.segment_length + 1))

    def explain_empty(self, split: str, task: str) -> str:
        """Why `split` of `task` gives no batch (`pipeline.empty_split_error`), and the fix."""
        return (f"the {split} split of {task!r} gives no batch of segments: one of its SegmentStreamFeatureConverter"
                f".rows={self.rows} lanes holds fewer than segment_length + 1 = {self.segment_length + 1} tokens; "
                "lower SegmentStreamFeatureConverter.rows or .segment_length, or give the split more text")

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return dict.fromkeys(MODEL_FIELDS, self.segment_length)
