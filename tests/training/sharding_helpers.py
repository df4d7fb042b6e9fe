"""Helpers shared by the sharded-training tests: mesh presets from gin files, the layout check, and the relative
comparison of parameter updates."""

from __future__ import annotations

import gin
import jax
import numpy as np
from flax import linen as nn

from ptmjax import gin_files
from ptmjax.partitioning import MeshConfig
from ptmjax.tree_paths import leaves_by_path


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


def parameter_update(before, after) -> dict[str, np.ndarray]:
    """{path: after - before} in float64, for parameter trees `before` and `after` (host or device arrays)."""
    start = dict(leaves_by_path(before))
    return {path: np.asarray(value, np.float64) - np.asarray(start[path], np.float64)
            for path, value in leaves_by_path(after)}


def relative_update_differences(want: dict[str, np.ndarray], got: dict[str, np.ndarray],
                                floor: float = 1e-6) -> list[tuple[str, float]]:
    """[(path, max |got - want| / max |want|)], largest first, over the parameters whose update `want` moves by
    more than `floor`. An atol on parameters cannot see a wrong update of a parameter that barely moves; this can
    (XLA's SPMD partitioner once gave sharded first updates 41-100% off one device's, docs/testing.md)."""
    off = {path: float(np.max(np.abs(got[path] - update)) / np.max(np.abs(update)))
           for path, update in want.items() if np.max(np.abs(update)) > floor}
    return sorted(off.items(), key=lambda item: -item[1])


def assert_updates_match(want: dict[str, np.ndarray], got: dict[str, np.ndarray], tolerance: float = 1e-2,
                         context: str = "") -> None:
    """Every parameter's update in `got` within `tolerance` of the largest entry of its update in `want`."""
    off = relative_update_differences(want, got)
    assert off and off[0][1] < tolerance, f"{context}: largest relative update differences: {off[:5]}"
