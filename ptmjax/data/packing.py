"""Packing several examples into each row, traced without AutoGraph.

`trim_and_pack` gives the rows of `seqio.utils.trim_and_pack_dataset` (without
its custom ops), the same values in the same order: examples are trimmed to
their feature's length, read in order, and appended to the row being filled
while every feature still fits; otherwise the row is padded with 0 and a new
one starts. seqio writes that loop as Python control flow over tensors, which
only AutoGraph can trace, and converting it costs every process about a second
of Python on a 2-core CPU (with the rest of a feature converter, which
`without_autograph.without_autograph_converter` then traces as written). This
is the same loop as an explicit `tf.while_loop` and `tf.cond`.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

SEGMENT_IDS, POSITIONS = "_segment_ids", "_positions"


def trim_and_pack(dataset: tf.data.Dataset, feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    """Rows of `feature_lengths` tokens per feature, each holding several examples, with `<feature>_segment_ids`
    (1, 2, ... per example, 0 on padding) and `<feature>_positions` (0, 1, ... within each example), all int32.
    Features not in `feature_lengths` are dropped. Id 0 is padding: as in seqio, an example keeps as many tokens
    as it has non-zero ones (its trailing 0s are dropped)."""
    spec = dataset.element_spec
    for name in feature_lengths:
        if name not in spec:
            raise ValueError(f"Feature '{name}' not found in dataset. Available keys are {list(spec)}")
        if not spec[name].shape.is_compatible_with(tf.TensorShape([None])):
            raise ValueError(f"Features to be packed must be one-dimensional. '{name}' is not.")
    lengths = dict(feature_lengths)
    dataset = dataset.map(lambda x: {name: x[name][:length] for name, length in lengths.items()},
                          num_parallel_calls=tf.data.AUTOTUNE)
    # A batch of as many examples as the longest row has tokens fills at least one row (examples are non-empty).
    dataset = dataset.padded_batch(max(lengths.values()), padded_shapes={name: [-1] for name in lengths})
    dataset = dataset.map(lambda batch: _packed_rows(batch, lengths), num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    def with_static_shapes(row: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        for name, value in row.items():
            value.set_shape([lengths[name.removesuffix(SEGMENT_IDS).removesuffix(POSITIONS)]])
        return row

    return dataset.map(with_static_shapes, num_parallel_calls=tf.data.AUTOTUNE)


def _packed_rows(batch: Mapping[str, tf.Tensor], lengths: Mapping[str, int]) -> dict[str, tf.Tensor]:
    """The rows that a batch of 0-padded examples packs into, [rows, length] per feature."""
    names = list(lengths)
    columns = {**{name: lengths[name] for name in names}, **{name + POSITIONS: lengths[name] for name in names}}
    empty = {column: tf.zeros([0], tf.int32) for column in columns}

    def with_row_written(row: dict[str, tf.Tensor], rows: dict[str, tf.TensorArray]):
        """An empty row, and `rows` with `row` padded to its length appended."""
        padded = {column: tf.pad(row[column], [[0, n - tf.size(row[column])]]) for column, n in columns.items()}
        return dict(empty), {column: rows[column].write(rows[column].size(), padded[column]) for column in columns}

    def add_example(i: tf.Tensor, row: dict[str, tf.Tensor], rows: dict[str, tf.TensorArray]):
        example = {}
        for name in names:
            tokens = tf.cast(batch[name][i], tf.int32)
            example[name] = tokens[: tf.reduce_sum(tf.cast(tf.not_equal(tokens, 0), tf.int32))]
        fits = tf.reduce_all([tf.size(row[name]) + tf.size(example[name]) <= lengths[name] for name in names])
        row, rows = tf.cond(fits, lambda: (row, rows), lambda: with_row_written(row, rows))
        appended = {}
        for name in names:  # examples come trimmed to their feature's length
            appended[name] = tf.concat([row[name], example[name]], 0)
            appended[name + POSITIONS] = tf.concat([row[name + POSITIONS], tf.range(tf.size(example[name]))], 0)
        return i + 1, appended, rows

    rows = {column: tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[length])
            for column, length in columns.items()}
    count = tf.shape(batch[names[0]])[0]
    _, row, rows = tf.while_loop(
        lambda i, row, rows: i < count, add_example, (tf.constant(0), dict(empty), rows),
        shape_invariants=(tf.TensorShape([]), {column: tf.TensorShape([None]) for column in columns},
                          {column: tf.TensorShape(None) for column in columns}),
    )
    _, rows = with_row_written(row, rows)
    packed = {column: rows[column].stack() for column in columns}
    for name in names:
        starts = tf.cast(tf.equal(packed[name + POSITIONS], 0), tf.int32)
        packed[name + SEGMENT_IDS] = tf.cumsum(starts, axis=1) * tf.cast(tf.not_equal(packed[name], 0), tf.int32)
    return packed
