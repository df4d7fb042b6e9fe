"""Transformer-XL's rows: row r of each batch continues row r of the batch before, on a hand-checked example,
through the family's converter (built as the trainer builds it) and through the pipeline on the corpus."""

from types import SimpleNamespace

import gin
import numpy as np
import pytest
import tensorflow as tf

from ptmjax.data import pipeline
from ptmjax.families.registry import TRANSFORMER_XL
from ptmjax.tasks.documents import STDLIB_DOCUMENTS_TASK
from ptmjax.training.callbacks.loss_evaluation import LossEvaluation

DOCUMENTS = [[1, 2, 3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15, 16], [20, 21, 22], [30, 31]]


def batches(converter, documents, rows):
    ds = tf.data.Dataset.from_generator(lambda: ({"targets": d} for d in documents),
                                        output_signature={"targets": tf.TensorSpec([None], tf.int32)})
    return list(converter(ds, {"targets": 100}).batch(rows).as_numpy_iterator())


def test_rows_continue_their_documents_by_hand():
    # Lane 0 reads documents 0 and 2: 1..8, 20, 21, 22; lane 1 documents 1 and 3: 10..16, 30, 31. Segments of
    # 3 inputs with the next token as the last target; lane 1 has two whole ones (16, 30, 31 lacks a target).
    converter = TRANSFORMER_XL.feature_converter(rows=2, segment_length=3)
    got = batches(converter, DOCUMENTS, rows=2)
    assert len(got) == 2
    np.testing.assert_array_equal(got[0]["decoder_input_tokens"], [[1, 2, 3], [10, 11, 12]])
    np.testing.assert_array_equal(got[0]["decoder_target_tokens"], [[2, 3, 4], [11, 12, 13]])
    np.testing.assert_array_equal(got[1]["decoder_input_tokens"], [[4, 5, 6], [13, 14, 15]])
    np.testing.assert_array_equal(got[1]["decoder_target_tokens"], [[5, 6, 7], [14, 15, 16]])
    assert all((batch["decoder_loss_weights"] == 1).all() for batch in got)


def test_a_lane_crosses_into_its_next_document():
    converter = TRANSFORMER_XL.feature_converter(rows=1, segment_length=4)
    got = batches(converter, DOCUMENTS[:1] + DOCUMENTS[2:3], rows=1)  # 1..8 then 20, 21, 22
    assert [b["decoder_input_tokens"][0].tolist() for b in got] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert got[1]["decoder_target_tokens"][0].tolist() == [6, 7, 8, 20]


def test_corpus_rows_continue_through_the_pipeline():
    rows, length = 4, 16
    converter = TRANSFORMER_XL.feature_converter  # registers the configurable
    gin.bind_parameter("SegmentStreamFeatureConverter.rows", rows)  # as a run's gin file binds them
    gin.bind_parameter("SegmentStreamFeatureConverter.segment_length", length)
    try:
        dataset = pipeline.get_dataset(
            STDLIB_DOCUMENTS_TASK, "validation", {"targets": 4096}, rows, seed=0, shuffle=True, pack=False,
            feature_converter=converter,
        )
        got = [batch for _, batch in zip(range(6), dataset.as_numpy_iterator(), strict=False)]
    finally:
        gin.clear_config()
    for before, after in zip(got, got[1:], strict=False):
        assert before["decoder_input_tokens"].shape == (rows, length)
        np.testing.assert_array_equal(after["decoder_input_tokens"][:, 0], before["decoder_target_tokens"][:, -1])
        np.testing.assert_array_equal(before["decoder_target_tokens"][:, :-1], before["decoder_input_tokens"][:, 1:])
    # the lanes read different documents
    assert len({tuple(row) for row in got[0]["decoder_input_tokens"]}) == rows


def test_unbound_rows_and_packing_are_refused():
    converter = TRANSFORMER_XL.converter.load()
    with pytest.raises(ValueError, match="SegmentStreamFeatureConverter.rows=None must be a positive int"):
        converter(segment_length=4)
    with pytest.raises(ValueError, match="does not pack"):
        converter(pack=True, rows=2, segment_length=4)


@pytest.mark.parametrize("segment_length", [100_000, 4])
def test_a_split_too_short_for_one_segment_is_named_by_the_run_evaluation(segment_length):
    """The trainer's loss evaluation over the corpus's validation split (segments longer than its lanes), and
    over a split with no document at all: one line naming the lanes, the segment and the fix."""
    converter = TRANSFORMER_XL.feature_converter
    gin.bind_parameter("SegmentStreamFeatureConverter.rows", 4)
    gin.bind_parameter("SegmentStreamFeatureConverter.segment_length", segment_length)
    try:
        def validation():
            if segment_length == 4:  # no document
                nothing = tf.data.Dataset.from_tensor_slices({"targets": tf.zeros((0, 3), tf.int32)})
                return converter(pack=False)(nothing, {"targets": 100}).batch(4)
            return pipeline.get_dataset(STDLIB_DOCUMENTS_TASK, "validation", {"targets": 4096}, 4, seed=0,
                                        shuffle=False, pack=False, num_epochs=1, feature_converter=converter)

        evaluation = LossEvaluation(1, SimpleNamespace(api=SimpleNamespace(family=TRANSFORMER_XL)), validation, None,
                                    STDLIB_DOCUMENTS_TASK, None, None, None)
        with pytest.raises(ValueError, match=(
                rf"the validation split of '{STDLIB_DOCUMENTS_TASK}' gives no batch of segments: one of its "
                rf"SegmentStreamFeatureConverter.rows=4 lanes holds fewer than segment_length \+ 1 = "
                rf"{segment_length + 1} tokens; lower SegmentStreamFeatureConverter.rows or .segment_length")):
            evaluation.evaluate(params=None)
    finally:
        gin.clear_config()
