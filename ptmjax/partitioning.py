"""The device mesh, logical-axis rules, and the shardings they imply.

Model code names axes logically ('embed', 'heads', 'activation_batch', ...).
This module alone knows the mesh: a rule maps one logical name to an ordered
tuple of mesh axes (MaxText style), so data, FSDP, tensor and expert
parallelism are a choice of mesh shape and rules, never a model change.

The mesh is data: `MeshConfig.axes` is an ordered mapping from axis name to
size (`MeshConfig.dcn_axes` the slices each spans), so a new axis is a name in
a mesh gin file plus the rules that use it. The four fields `data`, `fsdp`,
`tensor` and `expert` (with `dcn_data`, `dcn_fsdp`) are the shorthand the
presets in gin_configs/mesh/ bind: the mesh of MESH_AXES in that order.
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

MESH_AXES = ("data", "fsdp", "tensor", "expert")  # the shorthand fields' axes, in mesh order

# The axes a batch dimension is split over (those of them the mesh has): every
# mesh axis that is not model parallel, so each device sees its own examples.
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




def with_rule(rules: Rules, logical: str, mesh_axes: MeshAxes) -> Rules:
    """`rules` with `logical` mapped to `mesh_axes` instead."""
    if logical not in dict(rules):
        raise ValueError(f"no rule for {logical!r} to replace; known: {', '.join(name for name, _ in rules)}")
    return tuple((name, mesh_axes if name == logical else axes) for name, axes in rules)


# Context parallelism: activations' sequence dimension split over a 'context' mesh axis (gin_configs/mesh/cp.gin;
# attention across it in ptmjax/layers/context_parallel.py). Bound in gin as %CONTEXT_RULES.
CONTEXT_RULES: Rules = with_rule(DEFAULT_RULES, "activation_length", "context")
gin.constant("CONTEXT_RULES", CONTEXT_RULES)


@gin.configurable
def pipeline_rules(stage_axis: str = "stage", rules: Rules = DEFAULT_RULES) -> Rules:
    """`rules` with the logical 'layers' axis (a scanned stack's) on `stage_axis`, which makes that axis the
    pipeline's stages (ptmjax/layers/pipeline.py; gin_configs/mesh/pp.gin)."""
    return tuple((name, stage_axis if name == "layers" else axes) for name, axes in rules)


def optimizer_rules(rules: Rules, mesh: Mesh) -> Rules:
    """The rules for the optimizer's view of the parameters (scanned layers unscanned, optimizers.py).

    Where `rules` put the logical 'layers' axis on a mesh axis of size > 1 (pipeline stages), the
    optimizer sees each layer alone, which that axis cannot split; its 'embed' dimension then takes the
    stage axis after its own, so each layer's optimizer state is split over the stages, not copied on
    each, and 'layers' goes on no axis. `rules` otherwise.
    """
    stage = dict(rules).get("layers")
    if not isinstance(stage, str) or mesh.shape.get(stage, 1) == 1:
        return rules
    embed = dict(rules)["embed"]
    embed = () if embed is None else (embed,) if isinstance(embed, str) else tuple(embed)
    return with_rule(with_rule(rules, "embed", (*embed, stage)), "layers", None)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; at most one may be -1, meaning "the rest".

    Attributes:
      axes: the mesh as an ordered mapping {axis name: size}, e.g. {'data': -1,
        'fsdp': 1, 'tensor': 1, 'expert': 1, 'stage': 4}; every axis a rule names
        must be in it. None: the mesh of the four shorthand fields below, which
        must then be the only ones bound (they stay at their defaults otherwise).
      dcn_axes: with `axes`, how many slices each axis spans (absent: 1); see dcn_data.
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
    axes: tuple[tuple[str, int], ...] | None = None
    dcn_axes: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("axes", "dcn_axes"):  # a gin dict becomes ordered pairs, so the config stays hashable
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, tuple(value.items()))
        if self.axes is None:
            if self.dcn_axes is not None:
                raise ValueError("MeshConfig.dcn_axes needs MeshConfig.axes; with the shorthand fields bind dcn_data "
                                 "and dcn_fsdp")
            return
        names = [name for name, _ in self.axes]
        if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"MeshConfig.axes={dict(self.axes)!r} must map distinct axis names to sizes")
        shorthand = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.name in (*MESH_AXES, "dcn_data", "dcn_fsdp") and getattr(self, f.name) != f.default}
        if shorthand:
            raise ValueError(f"MeshConfig binds both axes and the shorthand {shorthand}; put those sizes in "
                             f"MeshConfig.axes instead")
        unknown = sorted(set(dict(self.dcn_axes or ())) - set(names))
        if unknown:
            raise ValueError(f"MeshConfig.dcn_axes names {unknown}, not mesh axes; known: {', '.join(names)}")

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axis names, in mesh order."""
        return MESH_AXES if self.axes is None else tuple(name for name, _ in self.axes)

    def requested_sizes(self) -> dict[str, int]:
        """{axis: size} as configured, -1 unresolved."""
        return {axis: getattr(self, axis) for axis in MESH_AXES} if self.axes is None else dict(self.axes)

    def dcn_sizes(self) -> dict[str, int]:
        """How many slices each mesh axis spans (1 for the axes that stay within a slice)."""
        if self.axes is None:
            sizes = {axis: getattr(self, f"dcn_{axis}", 1) for axis in MESH_AXES}
            prefix = "dcn_"
        else:
            sizes = {axis: dict(self.dcn_axes or ()).get(axis, 1) for axis in self.axis_names}
            prefix = ""
        bad = {f"{prefix}{a}": s for a, s in sizes.items() if not isinstance(s, int) or s < 1}
        if bad:
            raise ValueError(f"MeshConfig {bad}: the number of slices an axis spans must be an int >= 1")
        return sizes

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        """Resolves -1 against `num_devices` and checks the product."""
        sizes = self.requested_sizes()
        bad = {a: s for a, s in sizes.items() if not isinstance(s, int) or s == 0 or s < -1}
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
    """Builds the named mesh of `config.axis_names` over `devices`."""
    devices = list(jax.devices() if devices is None else devices)
    validate_rules(config.rules, config.axis_names)
    return Mesh(device_grid(config, devices), config.axis_names)


def device_grid(config: MeshConfig, devices: Sequence[Any]) -> np.ndarray:
    """The devices arranged as the mesh (e.g. [data, fsdp, tensor, expert]), topology-aware where JAX knows how.

    Across the slices of a multi-slice TPU job, the grid is one block per slice
    along the axes that span several slices (`dcn_*` > 1; mesh_utils.create_hybrid_device_mesh).
    """
    sizes = config.axis_sizes(len(devices))
    names = config.axis_names
    shape = tuple(sizes[a] for a in names)
    dcn = config.dcn_sizes()
    slices = {getattr(d, "slice_index", 0) for d in devices}
    if math.prod(dcn.values()) != len(slices):
        spread = " x ".join(f"{a}={n}" for a, n in dcn.items() if n > 1) or "1"
        raise ValueError(
            f"the devices span {len(slices)} slice(s) but MeshConfig spreads the mesh over "
            f"{math.prod(dcn.values())} ({spread}); set MeshConfig.dcn_data (data parallel across slices) or "
            f"dcn_fsdp (or MeshConfig.dcn_axes) so that they multiply to {len(slices)}"
        )
    if len(slices) > 1:
        indivisible = {a: (sizes[a], dcn[a]) for a in names if sizes[a] % dcn[a]}
        if indivisible:
            raise ValueError(f"mesh axes {indivisible} (size, slices) do not divide over their slices")
        within_slice = tuple(sizes[a] // dcn[a] for a in names)
        return mesh_utils.create_hybrid_device_mesh(
            within_slice, tuple(dcn[a] for a in names), devices, allow_split_physical_axes=True
        )
    try:
        return mesh_utils.create_device_mesh(shape, devices)
    except (AssertionError, NotImplementedError, ValueError):
        # Non-TPU or unusual topologies: a plain row-major layout.
        return np.asarray(devices).reshape(shape)


def validate_rules(rules: Rules, axis_names: Sequence[str] = MESH_AXES) -> None:
    """Raises if a rule names a mesh axis that is not one of `axis_names` (the mesh's)."""
    for logical, mesh_axes in rules:
        names = (mesh_axes,) if isinstance(mesh_axes, str) else (mesh_axes or ())
        for name in names:
            if name not in axis_names:
                raise ValueError(
                    f"unknown mesh axis {name!r} in rule for {logical!r}; "
                    f"known: {', '.join(axis_names)} (a new axis goes in MeshConfig.axes)"
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


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch is split over: those of BATCH_MESH_AXES the mesh has."""
    return tuple(axis for axis in BATCH_MESH_AXES if axis in mesh.axis_names)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a [batch, ...] array: batch split over the data-like axes."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways a batch is split."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


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
