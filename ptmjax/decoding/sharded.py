"""Decoding over a device mesh with the training layout: parameters where the logical-axis rules put
them, batch rows over the data axes (data, fsdp), heads over 'tensor', experts over 'expert'."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ptmjax import partitioning
from ptmjax.decoding.config import DecodeConfig, DecodeOutput
from ptmjax.decoding.generation_ids import GenerationIds

Array = jax.Array
Predict = Callable[[Any, Mapping[str, Array], DecodeConfig, GenerationIds, Array | None], DecodeOutput]


def jit_predict(
    predict: Predict, boxed_abstract_params: Any, mesh: Mesh, rules: partitioning.Rules, config: DecodeConfig,
    ids: GenerationIds,
) -> Callable[..., DecodeOutput]:
    """`predict` (ModelApi.predict) jitted on `mesh`: returns `run(params, batch, rng=None)`.

    `params` may be laid out anyhow (they are moved to the rules' shardings);
    the batch size must divide over the data axes.
    """
    partitioning.validate_rules(rules, mesh.axis_names)
    with jax.set_mesh(mesh):
        param_shardings = partitioning.logical_shardings(boxed_abstract_params, mesh, rules)
    rows = partitioning.batch_sharding(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def decode(params: Any, batch: Mapping[str, Array], rng: Array | None) -> DecodeOutput:
        with nn.logical_axis_rules(rules):
            return predict(params, batch, config, ids, rng)

    jitted = jax.jit(decode, in_shardings=(param_shardings, rows, replicated), out_shardings=rows)

    def run(params: Any, batch: Mapping[str, Array], rng: Array | None = None) -> DecodeOutput:
        batch_size, ways = len(next(iter(batch.values()))), partitioning.data_parallel_size(mesh)
        if batch_size % ways:
            raise ValueError(
                f"a batch of {batch_size} rows does not divide over the {ways} data-parallel devices of the mesh; "
                f"use a batch size that is a multiple of {ways}"
            )
        with jax.set_mesh(mesh):
            return jitted(params, batch, rng)

    return run
