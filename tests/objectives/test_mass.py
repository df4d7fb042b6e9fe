"""MASS: one contiguous masked span, exact inverse, span statistics, lengths, seeds."""

import numpy as np
import pytest
import tensorflow as tf
from objective_helpers import MASK_ID, FakeVocabulary, as_lists, features, random_examples, run

from ptmjax.objectives import mass


@pytest.fixture(scope="module")
def examples() -> list[np.ndarray]:
    return random_examples(300, 1, 120, seed=4)


def reconstruct(inputs: list[int], targets: list[int]) -> list[int]:
    """Independent inverse: the single run of MASKs is replaced by the targets."""
    masked = [i for i, t in enumerate(inputs) if t == MASK_ID]
    assert masked == list(range(masked[0], masked[0] + len(targets))), "the masked positions form one run"
    return inputs[: masked[0]] + targets + inputs[masked[0] + len(targets) :]


def test_reconstruction_and_span_length(examples):
    out = as_lists(run(lambda ds: mass.mask_span(ds, FakeVocabulary(), mass.MassOptions()), examples, seed=1))
    starts = []
    for original, x in zip(examples, out, strict=True):
        n = len(original)
        assert len(x["inputs"]) == n
        assert len(x["targets"]) == mass.MassOptions().targets_length(n) == min(max(round(n / 2), 1), n)
        assert reconstruct(x["inputs"], x["targets"]) == original.tolist()
        if n >= 40:
            start = x["inputs"].index(MASK_ID)
            starts.append(start / (n - len(x["targets"])))
    assert abs(np.mean(starts) - 0.5) < 0.06 and min(starts) < 0.1 and max(starts) > 0.9  # uniform start


def test_span_ratio_is_a_parameter(examples):
    options = mass.MassOptions(span_ratio=0.25, mask_id=7)
    out = as_lists(run(lambda ds: mass.mask_span(ds, FakeVocabulary(), options), examples, 1))
    total = sum(len(e) for e in examples)
    assert abs(sum(len(x["targets"]) for x in out) / total - 0.25) < 0.01
    assert all(x["inputs"].count(7) >= len(x["targets"]) for x in out)  # mask_id 7 (may also occur in text)


def test_mass_chain_lengths_and_dtypes(examples):
    seq = {"inputs": 33, "targets": 17}
    out = run(lambda ds: mass.mass(ds, seq, features(), documents_per_stream=6), examples[:60], 0)
    assert sum(len(x["inputs"]) for x in out) == sum(len(e) for e in examples[:60])
    assert max(len(x["inputs"]) for x in out) == 32 and max(len(x["targets"]) for x in out) == 16
    assert all(x["inputs"].dtype == x["targets"].dtype == np.int32 for x in out)


def test_deterministic_per_seed(examples):
    def go(seed):
        return as_lists(run(lambda ds: mass.mask_span(ds, FakeVocabulary(), mass.MassOptions()), examples[:30], seed))

    assert go(3) == go(3)
    assert go(3) != go(4)


def test_bad_parameters_are_named():
    empty = tf.data.Dataset.from_tensors({"targets": tf.constant([5], tf.int32)})
    with pytest.raises(ValueError, match="targets need 17"):
        mass.mass(empty, {"inputs": 33, "targets": 10}, features())
    with pytest.raises(ValueError, match="span_ratio=0"):
        mass.MassOptions(span_ratio=0.0)
