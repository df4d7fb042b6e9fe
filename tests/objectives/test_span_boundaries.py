"""SpanBERT's span boundary features: hand-checked boundaries, and on masked examples the boundaries of every
maximal run of selected tokens (a NumPy reference), their statistics, and the seqio task that carries them."""

import numpy as np
import pytest
import tensorflow as tf
from objective_helpers import NUM_SENTINELS, VOCAB_SIZE, FakeVocabulary, run

from ptmjax.objectives import masked_lm as mlm
from ptmjax.objectives import span_boundaries as sb


def boundaries(selected) -> dict[str, list[int]]:
    out = sb.span_boundaries(tf.constant(np.asarray(selected, bool)))
    return {name: value.numpy().tolist() for name, value in out.items()}


def test_hand_checked_boundaries():
    #            0  1  2  3  4  5  6  7  8  9 10
    selected = [0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0]
    assert boundaries(selected) == {
        "span_left": [0, 0, 0, 0, 0, 4, 0, 6, 6, 6, 0],
        "span_right": [0, 3, 3, 0, 0, 6, 0, 10, 10, 10, 0],
        "span_position": [0, 1, 2, 0, 0, 1, 0, 1, 2, 3, 0],
    }


def test_spans_at_the_edges_have_no_boundary_and_nothing_selected_gives_zeros():
    # A span at position 0 has no left token, one ending at the last position no right token.
    assert boundaries([1, 1, 0, 1, 0, 1]) == {
        "span_left": [0, 0, 0, 2, 0, 0], "span_right": [0, 0, 0, 4, 0, 0], "span_position": [0, 0, 0, 1, 0, 0],
    }
    assert boundaries([0, 0, 0]) == {name: [0, 0, 0] for name in sb.FEATURES}
    assert boundaries([1, 1, 1]) == {name: [0, 0, 0] for name in sb.FEATURES}
    assert boundaries([]) == {name: [] for name in sb.FEATURES}


def reference(selected: np.ndarray) -> dict[str, np.ndarray]:
    """Float-free NumPy: walk the maximal runs of selected positions."""
    n = len(selected)
    out = {name: np.zeros(n, np.int32) for name in sb.FEATURES}
    i = 0
    while i < n:
        if not selected[i]:
            i += 1
            continue
        end = i
        while end + 1 < n and selected[end + 1]:
            end += 1
        if i > 0 and end < n - 1:
            out["span_left"][i:end + 1] = i - 1
            out["span_right"][i:end + 1] = end + 1
            out["span_position"][i:end + 1] = np.arange(1, end - i + 2)
        i = end + 1
    return out


@pytest.fixture(scope="module")
def spans() -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """400 sequences of 100..300 regular ids with 3% EOS and sentinels, SpanBERT-masked by tokens."""
    rng = np.random.default_rng(0)
    examples = []
    for n in rng.integers(100, 300, 400):
        tokens = rng.integers(3, VOCAB_SIZE - NUM_SENTINELS, size=n)
        special = rng.random(n) < 0.03
        tokens[special] = rng.choice([1, VOCAB_SIZE - 1], size=special.sum())
        examples.append(tokens.astype(np.int32))
    options = mlm.MaskedLMOptions(masking="span", whole_word_spans=False, span_boundaries=True)
    return examples, run(lambda ds: mlm.mask_tokens(ds, FakeVocabulary(), options), examples, seed=3)


def test_masked_examples_carry_the_boundaries_of_their_runs(spans):
    examples, out = spans
    for original, x in zip(examples, out, strict=True):
        assert set(x) == {"inputs", "targets", "loss_mask", *sb.FEATURES}
        assert all(x[name].dtype == np.int32 and x[name].shape == original.shape for name in sb.FEATURES)
        selected = x["loss_mask"].astype(bool)
        want = reference(selected)
        for name in sb.FEATURES:
            np.testing.assert_array_equal(x[name], want[name], err_msg=name)
        targets = x["span_position"] > 0
        # The boundary tokens are never selected: the model sees them as they are.
        assert not selected[x["span_left"][targets]].any() and not selected[x["span_right"][targets]].any()
        np.testing.assert_array_equal(x["inputs"][x["span_left"][targets]], original[x["span_left"][targets]])


def test_boundary_statistics(spans):
    _, out = spans
    selected = sum(int(x["loss_mask"].sum()) for x in out)
    targets = np.concatenate([x["span_position"][x["span_position"] > 0] for x in out])
    lengths = np.concatenate([(x["span_right"] - x["span_left"] - 1)[x["span_position"] == 1] for x in out])
    # Almost every selected token has both boundaries (spans at a row's edges are rare).
    assert 0.97 < len(targets) / selected <= 1.0, len(targets) / selected
    # A span of length L holds the positions 1..L once each.
    assert len(targets) == lengths.sum()
    counts = np.bincount(targets)[1:]
    np.testing.assert_array_equal(counts, [(lengths >= k).sum() for k in range(1, len(counts) + 1)])
    # Spans of Geometric(0.2) length (mean 3.80, at most 10), merged where adjacent, cut at the budget and at
    # special ids: their mean lies near the drawn mean, and runs rarely pass 10.
    assert 3.0 < lengths.mean() < 4.6, lengths.mean()
    assert np.mean(lengths > 10) < 0.05, np.mean(lengths > 10)


def test_the_span_bert_task_gives_the_features():
    from ptmjax.data import feature_converters, pipeline
    from ptmjax.tasks import span_bert

    lengths = {"inputs": 64, "targets": 64}
    dataset = pipeline.get_dataset(span_bert.SPAN_BERT_TASK, "validation", lengths, 4, seed=0, shuffle=False,
                                   pack=False, feature_converter=feature_converters.SpanBoundaryFeatureConverter)
    for row in dataset.unbatch().take(20).as_numpy_iterator():
        want = reference(row["loss_mask"].astype(bool))
        for name in sb.FEATURES:
            np.testing.assert_array_equal(row[name], want[name], err_msg=name)
