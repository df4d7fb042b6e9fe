"""Packing without AutoGraph: the rows of seqio's packing, value for value, and its errors."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from ptmjax.data.packing import trim_and_pack


def examples(count: int, longest: int, seed: int) -> tf.data.Dataset:
    """Random int64 'inputs' (some empty, some longer than any row) and 'targets' (never empty), and an 'idx'."""
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(1, 50, rng.integers(0, longest)), rng.integers(1, 50, rng.integers(1, longest // 2)))
             for _ in range(count)]
    spec = tf.TensorSpec([None], tf.int64)
    dataset = tf.data.Dataset.from_generator(lambda: iter(pairs), output_signature=(spec, spec))
    return dataset.map(lambda inputs, targets: {"inputs": inputs, "targets": targets, "idx": tf.constant(7)})


@pytest.mark.parametrize(
    ("count", "longest", "lengths"),
    [(300, 40, {"inputs": 16, "targets": 8}), (50, 12, {"inputs": 32, "targets": 4}),
     (1, 5, {"inputs": 8, "targets": 8})],
)
def test_the_rows_equal_seqios(count, longest, lengths):
    dataset = examples(count, longest, seed=count)
    got = list(trim_and_pack(dataset, lengths).as_numpy_iterator())
    expected = list(seqio.utils.trim_and_pack_dataset(dataset, lengths).as_numpy_iterator())
    assert len(got) == len(expected) > 0
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.keys() == theirs.keys() == {f"{name}{suffix}" for name in lengths
                                                for suffix in ("", "_segment_ids", "_positions")}
        for key, value in ours.items():
            assert value.dtype == theirs[key].dtype == np.int32 and value.shape == (lengths[key.split("_")[0]],)
            np.testing.assert_array_equal(value, theirs[key], err_msg=key)
    assert count == 1 or max(row["inputs_segment_ids"].max() for row in got) > 1  # rows of several examples


def test_a_hand_checked_row():
    dataset = tf.data.Dataset.from_tensor_slices({"inputs": tf.ragged.constant([[8, 7, 1], [2, 3, 4, 1], [5, 1]])})
    rows = list(trim_and_pack(dataset.map(lambda x: {"inputs": x["inputs"]}), {"inputs": 8}).as_numpy_iterator())
    assert [row["inputs"].tolist() for row in rows] == [[8, 7, 1, 2, 3, 4, 1, 0], [5, 1, 0, 0, 0, 0, 0, 0]]
    assert rows[0]["inputs_segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
    assert rows[0]["inputs_positions"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]


def test_a_missing_or_two_dimensional_feature_is_named():
    dataset = tf.data.Dataset.from_tensors({"inputs": tf.ones([2, 3], tf.int32)})
    with pytest.raises(ValueError, match="'targets' not found"):
        trim_and_pack(dataset, {"targets": 4})
    with pytest.raises(ValueError, match="'inputs' is not"):
        trim_and_pack(dataset, {"inputs": 4})
