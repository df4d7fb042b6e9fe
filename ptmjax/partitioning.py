"""The device mesh, logical-axis rules, and the shardings they imply.

Model code names axes logically ('embed', 'heads', 'activation_batch', ...).
This module alone knows the mesh: a rule maps one logical name to an ordered
tuple of mesh axes (MaxText style), so data, FSDP, tensor and expert
parallelism are a choice of mesh shape and rules, never a model change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np
import optax
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")

# The axes a batch dimension is split over: every mesh axis that is not
# model parallel, so each device sees its own examples.
BATCH_MESH_AXES = ("data", "fsdp", "expert")

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

DEFAULT_RULES: Rules = (
    # Activations.
    ("activation_batch", BATCH_MESH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    # MoE expert side [group, expert, capacity, ...]: experts on 'expert', groups on the
    # other batch axes; moving between this and 'activation_batch' is an all-to-all.
    ("activation_expert", "expert"),
    ("activation_expert_group", ("data", "fsdp")),
    # Parameters: FSDP shards the model dimension, tensor parallelism the rest.
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("vocab", "tensor"),
    ("relpos_buckets", None),
    ("expert", "expert"),
    ("router_expert", None),  # the small MoE router kernel [embed, expert] is not expert-sharded
    ("layers", None),  # the stacked axis of scanned layers (ptmjax/layers/layer_stack.py)
    ("adapter", None),  # an adapter's bottleneck (ptmjax/adapt/adapters.py)
    ("prompt", None),  # the positions of a soft prompt or prefix (ptmjax/adapt/prompt_tuning.py, prefix_tuning.py)
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; at most one may be -1, meaning "the rest".

    Attributes:
      data: pure data parallelism (parameters replicated).
      fsdp: data parallelism with parameters and optimizer state sharded.
      tensor: tensor (model) parallelism over heads, mlp and vocab.
      expert: expert parallelism for Mixture-of-Experts layers.
      rules: logical-axis rules; each maps a logical name to mesh axes.
      dcn_data, dcn_fsdp: for a multi-slice TPU job, how many slices the data
        and the fsdp axis span (the slices are joined by the slower
        data-center network, DCN). Their product is the number of slices; the
        axes sizes above stay global, and every other axis stays within a
        slice, on the fast ICI links.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    rules: Rules = DEFAULT_RULES
    dcn_data: int = 1
    dcn_fsdp: int = 1

    def dcn_sizes(self) -> dict[str, int]:
        """How many slices each mesh axis spans (1 for the axes that stay within a slice)."""
        sizes = {axis: getattr(self, f"dcn_{axis}", 1) for axis in MESH_AXES}
        bad = {f"dcn_{a}": s for a, s in sizes.items() if not isinstance(s, int) or s < 1}
        if bad:
            raise ValueError(f"MeshConfig {bad}: the number of slices an axis spans must be an int >= 1")
        return sizes

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        """Resolves -1 against `num_devices` and checks the product."""
        sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
        bad = {a: s for a, s in sizes.items() if s == 0 or s < -1}
        if bad:
            raise ValueError(f"mesh axis sizes must be positive or -1, got {bad}")
        free = [a for a, s in sizes.items() if s == -1]
        if len(free) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {free}; fix all but one")
        fixed = math.prod(s for s in sizes.values() if s != -1)
        if free:
            if num_devices % fixed:
                raise ValueError(
                    f"mesh {sizes} cannot fill {num_devices} devices: the fixed axes "
                    f"multiply to {fixed}, which does not divide {num_devices}"
                )
            sizes[free[0]] = num_devices // fixed
        elif fixed != num_devices:
            raise ValueError(
                f"mesh {sizes} has {fixed} devices but {num_devices} are available; "
                "set one axis to -1 or make the product match"
            )
        return sizes


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the named mesh (data, fsdp, tensor, expert) over `devices`."""
    devices = list(jax.devices() if devices is None else devices)
    validate_rules(config.rules)
    return Mesh(device_grid(config, devices), MESH_AXES)


def device_grid(config: MeshConfig, devices: Sequence[Any]) -> np.ndarray:
    """The devices arranged as the mesh [data, fsdp, tensor, expert], topology-aware where JAX knows how.

    Across the slices of a multi-slice TPU job, the grid is one block per slice
    along the axes with `dcn_*` > 1 (mesh_utils.create_hybrid_device_mesh).
    """
    sizes = config.axis_sizes(len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    dcn = config.dcn_sizes()
    slices = {getattr(d, "slice_index", 0) for d in devices}
    if math.prod(dcn.values()) != len(slices):
        raise ValueError(
            f"the devices span {len(slices)} slice(s) but MeshConfig spreads the mesh over "
            f"{math.prod(dcn.values())} (dcn_data={config.dcn_data} x dcn_fsdp={config.dcn_fsdp}); "
            f"set MeshConfig.dcn_data (data parallel across slices) or dcn_fsdp so that they multiply to {len(slices)}"
        )
    if len(slices) > 1:
        indivisible = {a: (sizes[a], dcn[a]) for a in MESH_AXES if sizes[a] % dcn[a]}
        if indivisible:
            raise ValueError(f"mesh axes {indivisible} (size, slices) do not divide over their slices")
        within_slice = tuple(sizes[a] // dcn[a] for a in MESH_AXES)
        return mesh_utils.create_hybrid_device_mesh(
            within_slice, tuple(dcn[a] for a in MESH_AXES), devices, allow_split_physical_axes=True
        )
    try:
        return mesh_utils.create_device_mesh(shape, devices)
    except (AssertionError, NotImplementedError, ValueError):
        # Non-TPU or unusual topologies: a plain row-major layout.
        return np.asarray(devices).reshape(shape)


def validate_rules(rules: Rules) -> None:
    """Raises if a rule names a mesh axis that does not exist."""
    for logical, mesh_axes in rules:
        names = (mesh_axes,) if isinstance(mesh_axes, str) else (mesh_axes or ())
        for name in names:
            if name not in MESH_AXES:
                raise ValueError(
                    f"unknown mesh axis {name!r} in rule for {logical!r}; "
                    f"known: {', '.join(MESH_AXES)}"
                )


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree of nn.Partitioned (abstract) values.

    Checks that every sharded dimension divides evenly, naming the offender.
    """
    specs = nn.get_partition_spec(boxed_tree)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    values = nn.unbox(boxed_tree)
    for path, value, sharding in zip(
        _paths(values), jax.tree.leaves(values), jax.tree.leaves(shardings), strict=True
    ):
        _check_divisible(path, value.shape, sharding.spec, mesh)
    return shardings


def optimizer_state_shardings(
    tx: optax.GradientTransformation, abstract_opt_state: Any, abstract_params: Any,
    param_shardings: Any, mesh: Mesh,
) -> Any:
    """Optimizer state follows its parameter where it has the parameter's shape.

    Full-size moments (Adam's mu/nu, Adafactor's unfactored v) take the
    parameter's sharding, which is ZeRO sharding under FSDP rules; factored
    row/column statistics and scalars are small and stay replicated.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def follow(leaf, param, sharding):
        return sharding if leaf.shape == param.shape else replicated

    return optax.tree_map_params(
        tx, follow, abstract_opt_state, abstract_params, param_shardings,
        transform_non_params=lambda _: replicated,
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a [batch, ...] array: batch split over the data-like axes."""
    return NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways a batch is split."""
    return math.prod(mesh.shape[a] for a in BATCH_MESH_AXES)


def global_batch(host_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each host's slice of the batch into global arrays on the mesh."""
    sharding = batch_sharding(mesh)
    return {
        name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
        for name, value in host_batch.items()
    }


def _paths(tree: Any) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _check_divisible(path: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> None:
    for dim, (size, axes) in enumerate(zip(shape, spec, strict=False)):  # a spec may be shorter
        names = (axes,) if isinstance(axes, str) else (axes or ())
        ways = math.prod(mesh.shape[a] for a in names)
        if size % ways:
            raise ValueError(
                f"parameter {path} dimension {dim} has size {size}, which does not "
                f"divide over mesh axes {names} of total size {ways}; change the mesh "
                "shape or the logical-axis rule for that dimension"
            )
