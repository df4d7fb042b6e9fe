"""Fixed-size batches of a seqio evaluator's enumerated examples, placed on a device mesh.

seqio's `Evaluator` hands a model function a dataset of (index, features)
pairs. `padded_batches` groups them `batch_size` at a time and fills the last
batch with copies of its first row, so a jitted function sees one shape and
compiles once; the caller drops the copies (`count` says how many rows are real).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
import tensorflow as tf
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, Sharding

from ptmjax import partitioning
from ptmjax.data.fixed_batches import padded
from ptmjax.data.pipeline import without_autotuning


class Batch(NamedTuple):
    """indices int64 [count]: the examples' seqio indices; features: [batch_size, ...] each; count: real rows."""

    indices: np.ndarray
    features: dict[str, np.ndarray]
    count: int


def check_arguments(mesh: Mesh, batch_size: int, max_examples: int | None) -> None:
    """An evaluation's batch must split over the mesh's data axes; max_examples is positive or None."""
    ways = partitioning.data_parallel_size(mesh)
    if batch_size < 1 or batch_size % ways:
        raise ValueError(
            f"evaluation batch_size={batch_size} does not split over the {ways} data-parallel devices of mesh "
            f"{dict(mesh.shape)}; pick a multiple of {ways}"
        )
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples={max_examples} must be a positive number of examples, or None for all")


def padded_batches(dataset: tf.data.Dataset, batch_size: int) -> Iterator[Batch]:
    """`dataset` of (index, {name: [length]}) in batches of exactly `batch_size` rows (see the module doc)."""
    for indices, features in without_autotuning(dataset.batch(batch_size)).as_numpy_iterator():
        yield Batch(indices, padded(features, batch_size), len(indices))


def on_mesh(features: Mapping[str, np.ndarray], sharding: Sharding) -> dict[str, jax.Array]:
    """Global arrays of a batch that every process holds whole; each device gets its rows."""
    return {
        name: jax.make_array_from_callback(value.shape, sharding, lambda index, value=value: value[index])
        for name, value in features.items()
    }


def to_host(array: jax.Array) -> np.ndarray:
    """A (row-sharded) global array as one numpy array on every process."""
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def jit_on_rows(
    fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array], param_shardings: Any, rows: NamedSharding,
    rules: partitioning.Rules,
) -> Callable[[Any, Mapping[str, jax.Array]], jax.Array]:
    """`fn(params, batch) -> [b, ...]` jitted on the mesh of `rows`, its rows over the data axes."""

    def apply(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        with nn.logical_axis_rules(rules):
            return fn(params, batch)

    jitted = jax.jit(apply, in_shardings=(param_shardings, rows), out_shardings=rows)

    def run(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        with jax.set_mesh(rows.mesh):
            return jitted(params, batch)

    return run
