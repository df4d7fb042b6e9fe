"""Helpers shared by the sharded-training tests: mesh presets from gin files, and the layout check."""

from __future__ import annotations

import gin
import jax
import numpy as np
from flax import linen as nn

from ptmjax import gin_files
from ptmjax.partitioning import MeshConfig


def mesh_preset(name: str) -> MeshConfig:
    """The MeshConfig that gin_configs/mesh/{name}.gin binds; leaves gin cleared."""
    gin_files.parse_gin([f"mesh/{name}.gin"])
    try:
        return MeshConfig()
    finally:
        gin.clear_config()


def assert_laid_out_by_rules(trainer, state) -> None:
    """Each parameter's actual sharding is what its logical axes and the trainer's rules say.

    Unless the mesh is pure data parallel, some parameter must really be split.
    """
    sharded = 0
    leaves = jax.tree_util.tree_leaves_with_path(state.params)
    logical = jax.tree.leaves(trainer.logical_axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert len(leaves) == len(logical)
    for (path, param), axes in zip(leaves, logical, strict=True):
        want = nn.logical_to_mesh_axes(tuple(axes), trainer.rules)
        assert param.sharding.spec == want, f"{jax.tree_util.keystr(path)}: {param.sharding.spec} != {want}"
        shard_shape = param.sharding.shard_shape(param.shape)
        for dim, mesh_axes in enumerate(want):
            names = (mesh_axes,) if isinstance(mesh_axes, str) else (mesh_axes or ())
            ways = int(np.prod([trainer.mesh.shape[n] for n in names]))
            assert shard_shape[dim] * ways == param.shape[dim]
        sharded += shard_shape != param.shape
    if trainer.mesh.shape["data"] != trainer.mesh.size:
        assert sharded > 0, "no parameter is actually sharded"
