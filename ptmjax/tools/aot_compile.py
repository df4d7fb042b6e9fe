"""Ahead-of-time compilation of the real training step for a TPU topology, on any host.

`compile_train_step` builds the Trainer that `ptmjax train` builds from the
same gin files, but on a mesh over a topology's compile-only devices (libtpu's
compiler through `jax.experimental.topologies`; no TPU is needed). It lowers
the Trainer's jitted train step on its abstract state and an abstract batch
(ShapeDtypeStructs with their shardings: nothing is allocated) and compiles
it. The report has the per-device memory of XLA's memory analysis against the
chip's HBM, XLA's FLOP count next to the model FLOPs, and whether the step
fits. The topology 'cpu' compiles for this host's devices through the same
path.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import time
from collections.abc import Mapping
from typing import Any

import jax

from ptmjax import partitioning
from ptmjax.families.registry import family_of
from ptmjax.tools.inspection import format_bytes
from ptmjax.training import run
from ptmjax.training.run_spec import RunSpec

GiB = 2**30
# HBM per chip, from Google Cloud's TPU system-architecture pages
# (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e). The compiler's own limit is a
# little lower: v4 30.75, v5e 15.75, v5p 95.74, v6e 31.25 GiB, as its out-of-memory
# errors state.
CHIP_HBM_BYTES = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}
# v4 and v5p chips have two TensorCores; 'megacore' makes each chip one JAX device (as on a TPU VM).
MEGACORE = ("v4", "v5p")
LIBTPU_REQUIREMENT = "libtpu==0.0.42.*"  # what jax 0.10.2's `jax[tpu]` extra pins
CPU_TOPOLOGY = "cpu"


class LibtpuMissingError(RuntimeError):
    """Compiling for a TPU topology needs libtpu's compiler, which is not installed."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """The devices to compile for, and each one's HBM (None: unknown, e.g. the CPU)."""

    name: str
    devices: tuple[jax.Device, ...]
    hbm_per_device: int | None

    @property
    def device_kind(self) -> str:
        return self.devices[0].device_kind


def get_topology(name: str, num_slices: int = 1) -> Topology:
    """'v5p:4x4x8' (generation:chips per dimension) or 'cpu' (this host's CPU devices).

    num_slices: a multi-slice TPU job of that many copies of the topology, joined by
    DCN; its devices carry their `slice_index`.
    """
    if name == CPU_TOPOLOGY:
        if num_slices != 1:
            raise ValueError(f"num_slices={num_slices} needs a TPU topology, not {CPU_TOPOLOGY!r}")
        return Topology(name, tuple(jax.devices("cpu")), None)
    if num_slices < 1:
        raise ValueError(f"num_slices={num_slices} must be at least 1")
    generation, _, shape = name.partition(":")
    if generation not in CHIP_HBM_BYTES or not re.fullmatch(r"\d+(x\d+){1,2}", shape):
        raise ValueError(
            f"unknown topology {name!r}; write generation:shape with a generation of "
            f"{', '.join(CHIP_HBM_BYTES)}, e.g. 'v5p:4x4x8' or 'v5e:16x16', or 'cpu' for this host"
        )
    _require_libtpu(name)
    # libtpu's lockfile (/tmp/libtpu_lockfile) lets one process own the local chips; compiling
    # for a topology owns none, so it need not wait for another compile or a TPU VM's training job.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    chip_config = {"chip_config_name": "megacore"} if generation in MEGACORE else {}
    devices = topologies.get_topology_desc(
        topology_name=name, platform="tpu", num_slices=num_slices, **chip_config
    ).devices
    chips = math.prod(int(n) for n in shape.split("x")) * num_slices
    label = name if num_slices == 1 else f"{num_slices} slices of {name}"
    return Topology(label, tuple(devices), CHIP_HBM_BYTES[generation] * chips // len(devices))


def _require_libtpu(topology: str) -> None:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise LibtpuMissingError(
            f"compiling for the TPU topology {topology!r} needs libtpu (the TPU compiler; no TPU is needed), "
            f"which is not installed. Install it with `pip install -e '.[tpu]'` (or `pip install "
            f"'{LIBTPU_REQUIREMENT}'`), or pass --topology={CPU_TOPOLOGY} to compile for this host's CPU"
        ) from None


@dataclasses.dataclass(frozen=True)
class MemoryUse:
    """Bytes per device, from the compiled executable's `memory_analysis()`."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse donated argument buffers (the train state)
    temporaries: int
    generated_code: int

    @classmethod
    def of(cls, compiled: jax.stages.Compiled) -> MemoryUse:
        stats = compiled.memory_analysis()
        return cls(stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
                   stats.temp_size_in_bytes, stats.generated_code_size_in_bytes)

    @property
    def total(self) -> int:
        """What a device needs, as XLA accounts it: arguments, outputs not aliased to them, temporaries, code."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What compiling one train step for one topology showed.

    Exactly one of `memory` (the compile succeeded) and `compiler_error` (XLA
    ran out of device memory while compiling, which means the step does not
    fit) is set.
    """

    topology: str
    device_kind: str
    num_params: int
    mesh_shape: Mapping[str, int]
    batch_shapes: Mapping[str, tuple[int, ...]]
    hbm_per_device: int | None
    memory: MemoryUse | None
    compiler_error: str | None
    xla_flops_per_device: float | None
    model_flops: float | None  # one step over the global batch (ptmjax.models.flops); None: not a T5
    lower_seconds: float
    compile_seconds: float

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def fits(self) -> bool | None:
        """Whether the step fits in HBM; None on devices of unknown memory."""
        if self.memory is None:
            return False
        return None if self.hbm_per_device is None else self.memory.total <= self.hbm_per_device

    @property
    def xla_flops(self) -> float | None:
        """XLA's FLOPs of the whole step (per device times devices)."""
        return None if self.xla_flops_per_device is None else self.xla_flops_per_device * self.num_devices

    def __str__(self) -> str:
        mesh = ", ".join(f"{axis}={size}" for axis, size in self.mesh_shape.items())
        batch = ", ".join(f"{name} {list(shape)}" for name, shape in self.batch_shapes.items())
        lines = [
            f"train step compiled for {self.topology}: {self.num_devices} x {self.device_kind}, mesh ({mesh})",
            f"  parameters: {self.num_params:,}",
            f"  batch: {batch}",
            f"  lowered in {self.lower_seconds:.1f} s, compiled in {self.compile_seconds:.1f} s",
        ]
        hbm = "unknown" if self.hbm_per_device is None else format_bytes(self.hbm_per_device)
        if self.memory is None:
            lines.append(f"does not fit: XLA ran out of memory compiling it (HBM per device {hbm}):")
            lines.append(f"  {self.compiler_error}")
            return "\n".join(lines)
        m = self.memory
        lines.append("memory per device (XLA memory_analysis):")
        for label, value in (("arguments", m.arguments), ("outputs", m.outputs),
                             ("aliased, subtracted", m.aliased), ("temporaries", m.temporaries),
                             ("generated code", m.generated_code), ("total", m.total)):
            lines.append(f"  {label:20s} {format_bytes(value):>12s}")
        verdict = {True: "fits", False: "does NOT fit", None: "fit unknown"}[self.fits]
        share = "" if self.hbm_per_device is None else f" ({m.total / self.hbm_per_device:.1%})"
        lines.append(f"  {'HBM per device':20s} {hbm:>12s}{share}: {verdict}")
        lines.append("FLOPs of one step (all devices):")
        lines.append(f"  {'XLA cost_analysis':20s} {_flops(self.xla_flops)}")
        ratio = ""
        if self.model_flops and self.xla_flops:
            ratio = f" (XLA / model = {self.xla_flops / self.model_flops:.2f})"
        lines.append(f"  {'model (flops.py)':20s} {_flops(self.model_flops)}{ratio}")
        return "\n".join(lines)


def _flops(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def model_flops(spec: RunSpec) -> float | None:
    """The model FLOPs of one step, where its family has a formula (T5; see ptmjax/models/flops.py)."""
    flops = family_of(spec.model).flops
    return None if flops is None else flops(spec.model, spec.batch_size, spec.task_feature_lengths)


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """A compiled train step, its report, and the abstract arguments it was lowered on.

    state, batch and rng are ShapeDtypeStructs carrying their shardings;
    `compiled` is None when XLA ran out of memory.
    """

    report: CompileReport
    compiled: jax.stages.Compiled | None
    state: Any
    batch: dict[str, jax.ShapeDtypeStruct]
    rng: jax.ShapeDtypeStruct


def compile_train_step(spec: RunSpec, topology: Topology) -> CompiledStep:
    """Lowers and compiles the Trainer's train step for `topology`; nothing is allocated."""
    mesh = partitioning.make_mesh(spec.mesh_config, topology.devices)
    trainer = spec.trainer(mesh)
    state = trainer.sharded_abstract_state
    batch = spec.abstract_batch(trainer.batch_sharding)
    rng = _with_sharding(jax.eval_shape(jax.random.key, 0), trainer.replicated)

    start = time.perf_counter()
    lowered = trainer.lower_train_step(state, batch, rng)
    lowered_at = time.perf_counter()
    compiled, memory, error, flops = None, None, None, None
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        error = str(e).strip().splitlines()[0]
    compiled_at = time.perf_counter()
    if compiled is not None:
        memory = MemoryUse.of(compiled)
        flops = compiled.cost_analysis().get("flops")
    report = CompileReport(
        topology=topology.name, device_kind=topology.device_kind,
        num_params=sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)), mesh_shape=dict(mesh.shape),
        batch_shapes={name: x.shape for name, x in batch.items()}, hbm_per_device=topology.hbm_per_device,
        memory=memory, compiler_error=error, xla_flops_per_device=flops, model_flops=model_flops(spec),
        lower_seconds=lowered_at - start, compile_seconds=compiled_at - lowered_at,
    )
    return CompiledStep(report, compiled, state, batch, rng)


def _with_sharding(value: Any, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)


def main(args: argparse.Namespace) -> int:
    """`ptmjax compile` (parser in ptmjax/cli.py): prints the report; exit code 1 when the step does not fit."""
    # Compile-only: local accelerators are never used (on a TPU VM a running job may hold them).
    jax.config.update("jax_platforms", "cpu")
    if args.num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    from ptmjax.gin_files import parse_gin

    try:
        topology = get_topology(args.topology, args.num_slices)
    except LibtpuMissingError as error:
        raise SystemExit(f"ptmjax compile: {error}") from None
    parse_gin(args.gin_file, args.gin_bindings)
    report = compile_train_step(run.run_spec_from_gin(), topology).report
    print(report)
    return 1 if report.fits is False else 0
