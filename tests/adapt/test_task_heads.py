"""Fine-tuning heads' data and losses: the feature converters on hand-checked examples, each loss against a float64
numpy computation, and the QA best-span search against a brute-force numpy search."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from ptmjax.data import task_head_converters as thc
from ptmjax.families import losses
from ptmjax.families.span_search import best_span
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.encoder_tasks import SpanLogits


def dataset(examples: list[dict], **scalar_dtypes: tf.DType) -> tf.data.Dataset:
    signature = {
        name: tf.TensorSpec([], scalar_dtypes[name]) if name in scalar_dtypes else tf.TensorSpec([None], tf.int32)
        for name in examples[0]
    }
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)


def converted(converter: type, examples: list[dict], length: int, **scalar_dtypes: tf.DType) -> dict[str, np.ndarray]:
    ds = converter(pack=False)(dataset(examples, **scalar_dtypes), {"inputs": length})
    return next(ds.batch(len(examples)).as_numpy_iterator())


def test_sequence_classification_pads_and_weighs_each_example():
    examples = [
        {"inputs": [5, 6, 7], "token_type_ids": [0, 1, 1], "label": 2},
        {"inputs": [8, 9, 10, 11], "token_type_ids": [0, 0, 1, 1], "label": 0},
    ]
    got = converted(thc.SequenceClassificationFeatureConverter, examples, 4, label=tf.int32)
    np.testing.assert_array_equal(got["input_tokens"], [[5, 6, 7, 0], [8, 9, 10, 11]])
    np.testing.assert_array_equal(got["token_type_ids"], [[0, 1, 1, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(got["label"], [2, 0])
    np.testing.assert_array_equal(got["example_weight"], [1, 1])


def test_regression_keeps_float_labels_and_missing_token_types_are_zero():
    examples = [{"inputs": [5, 6], "label": 0.25}, {"inputs": [7], "label": -1.5}]
    got = converted(thc.SequenceRegressionFeatureConverter, examples, 3, label=tf.float32)
    np.testing.assert_array_equal(got["token_type_ids"], np.zeros((2, 3)))
    assert got["label"].dtype == np.float32
    np.testing.assert_array_equal(got["label"], [0.25, -1.5])


def test_decoder_classification_pads_with_the_model_pad_id_and_drops_token_types():
    examples = [{"inputs": [0, 6], "token_type_ids": [0, 1], "label": 1}]
    got = converted(thc.padded_with(thc.DecoderClassificationFeatureConverter, 9), examples, 4, label=tf.int32)
    assert sorted(got) == ["example_weight", "input_tokens", "label"]
    np.testing.assert_array_equal(got["input_tokens"], [[0, 6, 9, 9]])  # the real token 0 stays 0
    assert thc.padded_with(thc.DecoderClassificationFeatureConverter, 0) is thc.DecoderClassificationFeatureConverter


def test_tagging_weights_scored_tokens_only():
    examples = [{"inputs": [5, 6, 7, 8, 9], "tags": [3, -1, 0, 2, -1]}, {"inputs": [4, 4], "tags": [-1, 1]}]
    got = converted(thc.TokenTaggingFeatureConverter, examples, 6)
    np.testing.assert_array_equal(got["tags"], [[3, 0, 0, 2, 0, 0], [0, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got["tag_weights"], [[1, 0, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]])


def test_span_qa_weighs_out_answers_cut_off_by_truncation():
    examples = [  # the task truncated the second example's inputs (seqio trims to the feature length) after the answer
        {"inputs": [5, 1, 6, 7, 8], "token_type_ids": [0, 0, 1, 1, 1], "answer_start": 2, "answer_end": 3},
        {"inputs": [5, 1, 6, 7, 8], "token_type_ids": [0, 0, 1, 1, 1], "answer_start": 4, "answer_end": 7},
    ]
    got = converted(thc.SpanQuestionAnsweringFeatureConverter, examples, 6, answer_start=tf.int32,
                    answer_end=tf.int32)
    np.testing.assert_array_equal(got["answer_start"], [2, 4])
    np.testing.assert_array_equal(got["answer_end"], [3, 5])  # clipped into the row; its weight is 0
    np.testing.assert_array_equal(got["example_weight"], [1, 0])


def test_missing_label_and_packing_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"needs task features \['label'\]"):
        converted(thc.SequenceClassificationFeatureConverter, [{"inputs": [5]}], 3)
    with pytest.raises(ValueError, match="as a int32 scalar"):
        converted(thc.SequenceClassificationFeatureConverter, [{"inputs": [5], "label": 0.5}], 3, label=tf.float32)
    with pytest.raises(ValueError, match="train.pack = False"):
        thc.TokenTaggingFeatureConverter(pack=True)


def np_cross_entropy(logits: np.ndarray, targets: np.ndarray, z_loss: float) -> np.ndarray:
    logits = logits.astype(np.float64)
    log_z = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return log_z - picked + z_loss * log_z**2


Z_LOSS = 1e-3
RNG = np.random.default_rng(0)


def metrics(terms: losses.LossTerms) -> dict[str, float]:
    return {k: float(v) for k, v in terms.stats.metrics().items()}


def test_classification_loss_is_the_mean_over_weighted_examples():
    logits = RNG.normal(size=(5, 3)).astype(np.float32)
    label, weight = np.array([0, 2, 1, 1, 0]), np.array([1, 1, 1, 1, 0])
    batch = {"label": jnp.asarray(label), "example_weight": jnp.asarray(weight)}
    terms = losses.sequence_classification_loss(jnp.asarray(logits), batch, LossConfig(z_loss=Z_LOSS))
    ce = np_cross_entropy(logits, label, Z_LOSS)
    np.testing.assert_allclose(float(terms.token_loss), np.sum(ce * weight), rtol=1e-6)
    got = metrics(terms)
    np.testing.assert_allclose(got["loss"], np.sum(ce * weight) / 4, rtol=1e-6)
    np.testing.assert_allclose(got["accuracy"], np.sum((logits.argmax(-1) == label) * weight) / 4)
    assert got["num_tokens"] == 4


def test_regression_loss_is_the_mean_squared_error():
    scores = RNG.normal(size=(4, 1)).astype(np.float32)
    label, weight = RNG.normal(size=4).astype(np.float32), np.array([1, 1, 0, 1])
    batch = {"label": jnp.asarray(label), "example_weight": jnp.asarray(weight)}
    terms = losses.sequence_regression_loss(jnp.asarray(scores), batch, LossConfig())
    want = np.sum((scores[:, 0].astype(np.float64) - label) ** 2 * weight) / 3
    np.testing.assert_allclose(metrics(terms)["loss"], want, rtol=1e-6)


def test_tagging_loss_and_accuracy_cover_weighted_tokens():
    logits = RNG.normal(size=(2, 5, 4)).astype(np.float32)
    tags = RNG.integers(0, 4, size=(2, 5))
    weights = np.array([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    batch = {"tags": jnp.asarray(tags), "tag_weights": jnp.asarray(weights)}
    got = metrics(losses.token_tagging_loss(jnp.asarray(logits), batch, LossConfig(z_loss=Z_LOSS)))
    ce = np_cross_entropy(logits, tags, Z_LOSS)
    np.testing.assert_allclose(got["loss"], np.sum(ce * weights) / weights.sum(), rtol=1e-6)
    np.testing.assert_allclose(got["accuracy"], np.sum((logits.argmax(-1) == tags) * weights) / weights.sum())


def test_span_loss_is_the_mean_of_start_and_end_cross_entropy():
    start, end = (RNG.normal(size=(3, 6)).astype(np.float32) for _ in range(2))
    answer_start, answer_end, weight = np.array([1, 2, 0]), np.array([3, 2, 5]), np.array([1, 1, 0])
    batch = {"answer_start": jnp.asarray(answer_start), "answer_end": jnp.asarray(answer_end),
             "example_weight": jnp.asarray(weight)}
    outputs = SpanLogits(jnp.asarray(start), jnp.asarray(end))
    got = metrics(losses.span_question_answering_loss(outputs, batch, LossConfig(z_loss=0.0)))
    per_example = (np_cross_entropy(start, answer_start, 0.0) + np_cross_entropy(end, answer_end, 0.0)) / 2
    np.testing.assert_allclose(got["loss"], np.sum(per_example * weight) / 2, rtol=1e-6)
    right = (start.argmax(-1) == answer_start) & (end.argmax(-1) == answer_end)
    np.testing.assert_allclose(got["span_accuracy"], np.sum(right * weight) / 2)


def brute_force_span(start, end, max_length, types):
    best = (0, 0, -np.inf)
    for i, j in itertools.product(range(len(start)), repeat=2):
        if i <= j < i + max_length and (types is None or types[i] == types[j] == 1):
            score = float(start[i]) + float(end[j])
            if score > best[2]:
                best = (i, j, score)
    return best


@pytest.mark.parametrize("with_types", [False, True])
def test_best_span_matches_a_brute_force_search(with_types):
    start, end = (RNG.normal(size=(16, 9)).astype(np.float32) for _ in range(2))
    types = (np.arange(9)[None, :] >= RNG.integers(1, 10, size=(16, 1))).astype(np.int32)  # last row: no context
    types[-1] = 0
    got = best_span(jnp.asarray(start), jnp.asarray(end), 3, jnp.asarray(types) if with_types else None)
    for row in range(16):
        want = brute_force_span(start[row], end[row], 3, types[row] if with_types else None)
        assert (int(got[0][row]), int(got[1][row])) == want[:2]
        np.testing.assert_allclose(float(got[2][row]), want[2], rtol=1e-6)
