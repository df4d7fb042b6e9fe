"""Which mesh axis, if any, shards the sequence (context parallelism): read from the logical-axis rules and the
mesh in effect where a layer is traced (`nn.logical_axis_rules`, `jax.set_mesh`, as the Trainer sets them)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax

SEQUENCE_AXIS = "activation_length"  # the logical name of an activation's sequence dimension


def context_axis() -> str | tuple[str, ...] | None:
    """The mesh axis (or axes) that the rules map 'activation_length' to, if the mesh in effect splits it more than
    one way; None where the sequence stays whole (the default rules, no mesh, or an axis of size 1)."""
    axes = nn.logical_to_mesh_axes((SEQUENCE_AXIS,))[0]
    mesh = jax.sharding.get_abstract_mesh()
    if axes is None or mesh.empty:
        return None
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    missing = [name for name in names if name not in mesh.axis_names]
    if missing:
        raise ValueError(f"the rule for {SEQUENCE_AXIS!r} names mesh axes {missing} that the mesh "
                         f"{dict(mesh.shape)} lacks; add them to MeshConfig.axes or change the rule")
    if math.prod(mesh.shape[name] for name in names) == 1:
        return None
    return axes
