"""Tables of parameters and their sharding, for terminals and notebooks.

Three ways in, one table out (`ShardingTable`):
- `inspect_arrays`: live jax.Arrays; reports each array's actual sharding.
- `inspect_layout`: abstract shapes plus logical axes, a mesh and rules;
  reports the layout those would get (no device is touched).
- `inspect_checkpoint`: a run folder; shapes and dtypes come from the Orbax
  checkpoint's metadata on disk, logical axes from the model rebuilt
  abstractly from the run's config.gin. Nothing is restored.

Bytes per device are the bytes of an array's largest shard
(`sharding.shard_shape(shape)` times the item size); a module's per-device
total is the sum of those, i.e. what the most loaded device holds.
"""

from __future__ import annotations

import dataclasses
import html
import io
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, Sharding

from ptmjax import gin_files, partitioning
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir, saved_mesh_shape
from ptmjax.tree_paths import leaves_by_path, path_name, shapes_by_path, subtree

OPT_STATE = "opt_state"
TOTAL = "total"


@dataclasses.dataclass(frozen=True)
class Row:
    """One array: where it is in the tree, its size, and how it is split."""

    path: str  # e.g. 'encoder/layers_0/attention/query/kernel'
    module: str  # the top-level subtree ('encoder', ...) or 'opt_state'
    shape: tuple[int, ...]
    dtype: str
    logical_axes: tuple[str | None, ...] | None  # None: no logical names known
    spec: PartitionSpec | None  # None: not a NamedSharding (see `sharding`)
    sharding: str  # the sharding in words, e.g. "P('fsdp', None)"
    total_bytes: int
    device_bytes: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Total:
    """Sums over the rows of one module (or of all rows, module 'total')."""

    module: str
    num_arrays: int
    num_elements: int
    total_bytes: int
    device_bytes: int


@dataclasses.dataclass(frozen=True)
class ShardingTable:
    """Rows of arrays on a mesh; prints as a rich table, shows as HTML in notebooks."""

    rows: tuple[Row, ...]
    mesh_shape: Mapping[str, int]
    title: str = "parameters"

    def row(self, path: str) -> Row:
        """The row of `path` ('encoder/relpos_bias/rel_embedding')."""
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(f"no row {path!r}; paths look like {self.rows[0].path!r}" if self.rows else path)

    def totals(self) -> list[Total]:
        """Per module in order of appearance (optimizer state last), then 'total'."""
        modules = list(dict.fromkeys(r.module for r in self.rows))
        modules.sort(key=lambda m: m == OPT_STATE)
        groups = [(m, [r for r in self.rows if r.module == m]) for m in modules]
        groups.append((TOTAL, list(self.rows)))
        return [
            Total(m, len(rs), sum(r.size for r in rs), sum(r.total_bytes for r in rs),
                  sum(r.device_bytes for r in rs))
            for m, rs in groups
        ]

    def total(self, module: str = TOTAL) -> Total:
        """The totals of one module, or of everything."""
        for entry in self.totals():
            if entry.module == module:
                return entry
        raise KeyError(f"no module {module!r}; known: {[t.module for t in self.totals()]}")

    @property
    def caption(self) -> str:
        mesh = ", ".join(f"{axis}={size}" for axis, size in self.mesh_shape.items())
        count = math.prod(self.mesh_shape.values())
        return f"mesh ({mesh}): {count} device{'' if count == 1 else 's'}"

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        arrays = Table(title=self.title, caption=self.caption)
        for name, justify in zip(_COLUMNS, _JUSTIFY, strict=True):
            arrays.add_column(name, justify=justify)
        for row in self.rows:
            arrays.add_row(*_cells(row))
        totals = Table(title=f"{self.title}: totals")
        for name, justify in zip(_TOTAL_COLUMNS, _TOTAL_JUSTIFY, strict=True):
            totals.add_column(name, justify=justify)
        entries = self.totals()
        for i, entry in enumerate(entries):
            totals.add_row(*_total_cells(entry), end_section=i == len(entries) - 2)
        return Group(arrays, totals)

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(file=io.StringIO(), width=200, color_system=None)
        console.print(self)
        return console.file.getvalue()

    def _repr_html_(self) -> str:
        def table(title: str, columns, justify, rows) -> str:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
            body = "".join(
                "<tr>" + "".join(
                    f'<td style="text-align:{j}">{html.escape(c)}</td>' for c, j in zip(r, justify, strict=True)
                ) + "</tr>"
                for r in rows
            )
            return (f"<table><caption>{html.escape(title)}</caption><thead><tr>{head}</tr></thead>"
                    f"<tbody>{body}</tbody></table>")

        return (
            table(f"{self.title} ({self.caption})", _COLUMNS, _JUSTIFY, [_cells(r) for r in self.rows])
            + table(f"{self.title}: totals", _TOTAL_COLUMNS, _TOTAL_JUSTIFY,
                    [_total_cells(t) for t in self.totals()])
        )


_COLUMNS = ("path", "shape", "dtype", "logical axes", "PartitionSpec", "bytes", "bytes/device")
_JUSTIFY = ("left", "left", "left", "left", "left", "right", "right")
_TOTAL_COLUMNS = ("module", "arrays", "elements", "bytes", "bytes/device")
_TOTAL_JUSTIFY = ("left", "right", "right", "right", "right")


def format_bytes(num: int) -> str:
    """'2,048 B', '1.50 KiB', ... in powers of 1024."""
    if num < 1024:
        return f"{num:,} B"
    value, unit = float(num), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):  # noqa: B007 - the last unit is used below
        value /= 1024
        if value < 1024:
            break
    return f"{value:,.2f} {unit}"


def _cells(row: Row) -> tuple[str, ...]:
    axes = "-" if row.logical_axes is None else "(" + ", ".join(str(a) for a in row.logical_axes) + ")"
    return (row.path, str(row.shape), row.dtype, axes, row.sharding,
            format_bytes(row.total_bytes), format_bytes(row.device_bytes))


def _spec_words(spec: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(axes) for axes in spec) + ")"


def _total_cells(entry: Total) -> tuple[str, ...]:
    return (entry.module, f"{entry.num_arrays:,}", f"{entry.num_elements:,}",
            format_bytes(entry.total_bytes), format_bytes(entry.device_bytes))


def make_row(path: str, module: str, shape: tuple[int, ...], dtype: Any,
             logical_axes: tuple[str | None, ...] | None, sharding: Sharding) -> Row:
    """A row for an array of `shape` and `dtype` laid out by `sharding`."""
    itemsize = np.dtype(dtype).itemsize
    try:
        shard = sharding.shard_shape(tuple(shape))
    except ValueError as error:
        raise ValueError(
            f"{path} of shape {tuple(shape)} does not split evenly under {sharding}: {error}; "
            "change the mesh shape or the logical-axis rule for that dimension"
        ) from error
    spec = sharding.spec if isinstance(sharding, NamedSharding) else None
    words = _spec_words(spec) if spec is not None else type(sharding).__name__
    return Row(path, module, tuple(shape), str(np.dtype(dtype)), logical_axes, spec, words,
               math.prod(shape) * itemsize, math.prod(shard) * itemsize)


def inspect_arrays(params: Any, logical_axes: Any = None, opt_state: Any = None,
                   title: str = "parameters", opt_state_mirrors: tuple[Any, Any] | None = None) -> ShardingTable:
    """The table of live arrays, with the sharding each one actually has.

    Args:
      params: a tree of jax.Arrays (e.g. `state.params`).
      logical_axes: the same tree with a PartitionSpec or tuple of logical
        names per parameter (e.g. `Trainer.logical_axes`), or None.
      opt_state: optionally the optimizer state; its leaves get rows under
        'opt_state', with the logical axes of the parameter they mirror.
      opt_state_mirrors: (parameters, logical axes) that the optimizer state
        mirrors, if not `params` itself: `Trainer.optimizer_view` (a scanned
        model's optimizer sees its layers unscanned).
    """
    names = _logical_by_path(params, logical_axes)
    mirrors = _mirror_table(params, names, opt_state_mirrors)
    leaves = leaves_by_path(params) + [(f"{OPT_STATE}/{p}", v) for p, v in leaves_by_path(opt_state)]
    rows, mesh_shape = [], None
    for path, value in leaves:
        if not isinstance(value, jax.Array):
            raise TypeError(
                f"{path} is a {type(value).__name__}, not a jax.Array; pass the arrays of a "
                "restored or initialised state, or use inspect_layout for abstract shapes"
            )
        if isinstance(value.sharding, NamedSharding) and mesh_shape is None:
            mesh_shape = dict(value.sharding.mesh.shape)
        axes = _mirrored_axes(path, value.shape, names, mirrors)
        rows.append(make_row(path, _module(path), value.shape, value.dtype, axes, value.sharding))
    return ShardingTable(tuple(rows), mesh_shape or {"devices": len(jax.devices())}, title)


def inspect_layout(abstract_params: Any, logical_axes: Any, mesh: Mesh | AbstractMesh,
                   rules: partitioning.Rules, abstract_opt_state: Any = None,
                   title: str = "parameters", opt_state_mirrors: tuple[Any, Any] | None = None) -> ShardingTable:
    """The table of the layout `rules` give shapes on `mesh`; nothing is allocated.

    Arguments are like `inspect_arrays`, with ShapeDtypeStructs (or anything
    with .shape and .dtype) for arrays. An AbstractMesh needs no devices.
    Optimizer-state leaves of their parameter's shape follow its sharding,
    the rest are replicated, as `partitioning.optimizer_state_shardings` does.
    """
    partitioning.validate_rules(rules, mesh.axis_names)
    names = _logical_by_path(abstract_params, logical_axes)
    rows, mirrors = [], _mirror_table(abstract_params, names, opt_state_mirrors)
    leaves = leaves_by_path(abstract_params) + [(f"{OPT_STATE}/{p}", v) for p, v in leaves_by_path(abstract_opt_state)]
    for path, value in leaves:
        axes = _mirrored_axes(path, tuple(value.shape), names, mirrors)
        spec = nn.logical_to_mesh_axes(axes, rules) if axes is not None else PartitionSpec()
        sharding = NamedSharding(mesh, spec)
        rows.append(make_row(path, _module(path), tuple(value.shape), value.dtype, axes, sharding))
    return ShardingTable(tuple(rows), dict(mesh.shape), title)


def inspect_checkpoint(model_dir: str, mesh_axes: Mapping[str, int] | None = None, *,
                       rules: partitioning.Rules | None = None, step: int | None = None,
                       include_opt_state: bool = False, num_devices: int | None = None) -> ShardingTable:
    """The layout a run's checkpoint would have on a mesh, read without restoring it.

    Args:
      model_dir: a run folder written by `ptmjax train` (config.gin, checkpoints/).
      mesh_axes: mesh axis sizes to report, e.g. {'fsdp': 4, 'tensor': 2}; axes
        not named are 1 and one may be -1 (default: the run's own MeshConfig).
      rules: logical-axis rules (default: the run's).
      step: which checkpoint (default: the newest).
      include_opt_state: add rows for the optimizer state.
      num_devices: how many devices a -1 axis fills (default: as many as the
        checkpoint was saved from, else jax.device_count()). The mesh is
        abstract, so it may be larger than this machine.

    Note: parses the run's config.gin into gin's global config and clears
    gin's config afterwards.
    """
    folder = ModelDir(model_dir)
    step = folder.checkpoint_step(step)
    model, mesh_config = gin_files.read_model_config(folder)
    if mesh_axes is not None:
        known = mesh_config.axis_names
        unknown = set(mesh_axes) - set(known)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; known: {', '.join(known)}")
        sizes = {axis: int(mesh_axes.get(axis, 1)) for axis in known}
        mesh_config = (dataclasses.replace(mesh_config, **sizes) if mesh_config.axes is None
                       else dataclasses.replace(mesh_config, axes=tuple(sizes.items())))
    if rules is not None:
        mesh_config = dataclasses.replace(mesh_config, rules=tuple(rules))

    api = model_api(model)
    plain = api.unscanned()  # a scanned model's optimizer state mirrors its unscanned twin's parameters
    mirrors = None if plain is api else (plain.abstract_params, plain.logical_axes)
    on_disk = folder.state_metadata(step)
    folder.check_params(api.abstract_params, step)
    params = folder.params_metadata(step)  # with those from the base of a run that saves only what it trains
    if folder.base() is not None:  # its base may hold parameters the model leaves out (a pre-training head)
        params = subtree(params, shapes_by_path(api.abstract_params).keys())
    if num_devices is None:
        sizes = list(mesh_config.requested_sizes().values())
        saved_mesh = saved_mesh_shape(on_disk)  # a -1 axis fills as many devices as the run saved from
        if -1 not in sizes:
            num_devices = math.prod(sizes)
        else:
            num_devices = jax.device_count() if saved_mesh is None else math.prod(saved_mesh.values())
    sizes = mesh_config.axis_sizes(num_devices)
    mesh = AbstractMesh(tuple(sizes.values()), tuple(sizes))
    return inspect_layout(
        params, api.logical_axes, mesh, mesh_config.rules,
        on_disk.get(OPT_STATE) if include_opt_state else None,
        title=f"{os.path.basename(folder.path)} step {step}", opt_state_mirrors=mirrors,
    )


def _module(path: str) -> str:
    return path.split("/", 1)[0]


def _is_axes(x: Any) -> bool:
    return x is None or isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def _logical_by_path(params: Any, logical_axes: Any) -> dict[str, tuple[str | None, ...]]:
    """Maps each parameter path to its logical names; checks the two trees match."""
    if logical_axes is None:
        return {}
    flat = jax.tree_util.tree_leaves_with_path(logical_axes, is_leaf=_is_axes)
    names = {path_name(p): tuple(v) for p, v in flat if v is not None}
    missing = [p for p, _ in leaves_by_path(params) if p not in names]
    if missing:
        raise ValueError(
            f"logical_axes has no entry for {missing[:3]} (of {len(missing)}); pass the logical "
            "axes of these very params, e.g. Trainer.logical_axes or nn.get_partition_spec(boxed)"
        )
    return names


def _mirror_table(params: Any, names: Mapping[str, tuple[str | None, ...]],
                  opt_state_mirrors: tuple[Any, Any] | None) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """Path -> (shape, logical names) of the parameters that optimizer-state leaves may mirror."""
    if opt_state_mirrors is not None:
        params, names = opt_state_mirrors[0], _logical_by_path(*opt_state_mirrors)
    return {path: (shape, names[path]) for path, shape in shapes_by_path(params).items() if path in names}


def _mirrored_axes(path: str, shape: tuple[int, ...], names: Mapping[str, tuple[str | None, ...]],
                   mirrors: Mapping[str, tuple[tuple[int, ...], tuple]]) -> tuple[str | None, ...] | None:
    """A parameter's names; an optimizer leaf gets those of the parameter it mirrors.

    An optimizer leaf mirrors a parameter when its path ends with the
    parameter's path and its shape is the parameter's shape (Adam's mu/nu,
    Adafactor's unfactored v); factored statistics and counts mirror none.
    """
    if not path.startswith(OPT_STATE + "/"):
        return names.get(path)
    for param_path, (param_shape, axes) in mirrors.items():
        if path.endswith("/" + param_path) and param_shape == tuple(shape):
            return axes
    return None
