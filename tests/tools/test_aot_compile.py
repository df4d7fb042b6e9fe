"""`ptmjax compile`: the libtpu message, and the memory/FLOP report of a real compile (CPU here, TPU if libtpu)."""

import dataclasses
import sys

import gin
import jax
import numpy as np
import pytest

from ptmjax import cli, gin_files, partitioning
from ptmjax.tools import aot_compile as aot
from ptmjax.training import run
from ptmjax.training.run_spec import RunSpec

TINY = [
    "models/t5_1_1_tiny.gin", "runs/pretrain.gin", "mesh/dp_fsdp_tp.gin",
]
TINY_BINDINGS = [
    "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1",
    "train.batch_size = 8", "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
]


def spec_from(files, bindings) -> RunSpec:
    gin.clear_config()
    try:
        gin_files.parse_gin(files, bindings)
        return run.run_spec_from_gin()
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def cpu_compile():
    spec = spec_from(TINY, TINY_BINDINGS)
    return spec, aot.compile_train_step(spec, aot.get_topology("cpu"))


def shard_bytes(tree) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def test_without_libtpu_the_command_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
    previous = jax.config.jax_platforms
    try:
        with pytest.raises(SystemExit, match=r"needs libtpu .* `pip install -e '\.\[tpu\]'`"):
            cli.main(["compile", "--topology=v5p:2x2x1", *(f"--gin_file={f}" for f in TINY)])
    finally:
        jax.config.update("jax_platforms", previous)


def test_unknown_topology_names_the_known_generations():
    with pytest.raises(ValueError, match="unknown topology 'v9:4x4'.*v4, v5e, v5p, v6e"):
        aot.get_topology("v9:4x4")


def test_gin_without_a_model_names_the_missing_binding():
    gin.clear_config()
    with pytest.raises(ValueError, match="bind no train.model"):
        run.run_spec_from_gin()


def test_memory_report_is_the_executables_own_and_covers_the_sharded_state(cpu_compile):
    _, step = cpu_compile
    stats, m = step.compiled.memory_analysis(), step.report.memory
    assert (m.arguments, m.outputs, m.aliased, m.temporaries, m.generated_code) == (
        stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
        stats.temp_size_in_bytes, stats.generated_code_size_in_bytes,
    )
    assert m.total == m.arguments + m.outputs - m.aliased + m.temporaries + m.generated_code
    assert step.report.mesh_shape == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert step.report.num_devices == 8 and step.report.hbm_per_device is None and step.report.fits is None
    # Independently of XLA: the donated arguments are this device's shards of the state (less a few
    # bytes of placeholders the step never reads, which jit drops), the others its batch shard
    # (the rng key is dropped too: the tiny model has no dropout).
    state = shard_bytes(step.state)
    assert state - 1024 <= m.aliased <= state
    assert m.arguments - m.aliased == shard_bytes(step.batch)


def test_xla_flops_are_of_the_order_of_the_model_flops(cpu_compile):
    spec, step = cpu_compile
    report = step.report
    assert report.model_flops == aot.model_flops(spec) > 0
    assert report.xla_flops_per_device > 0
    assert 0.8 < report.xla_flops / report.model_flops < 1.6


def test_fits_against_hbm_and_the_compilers_out_of_memory(cpu_compile):
    report = cpu_compile[1].report
    total = report.memory.total
    assert dataclasses.replace(report, hbm_per_device=total).fits is True
    assert dataclasses.replace(report, hbm_per_device=total - 1).fits is False
    oom = dataclasses.replace(report, memory=None, compiler_error="RESOURCE_EXHAUSTED: Ran out of memory on HBM")
    assert oom.fits is False and "does not fit" in str(oom) and "RESOURCE_EXHAUSTED" in str(oom)
    text = str(report)
    for words in ("arguments", "temporaries", "generated code", "XLA cost_analysis", "model (flops.py)"):
        assert words in text


@pytest.mark.slow
def test_tiny_t5_compiles_for_a_tpu_topology():
    pytest.importorskip("libtpu")
    spec = spec_from(["models/t5_1_1_tiny.gin", "runs/pretrain.gin", "mesh/fsdp.gin"], TINY_BINDINGS)
    report = aot.compile_train_step(spec, aot.get_topology("v5e:2x2")).report
    assert report.device_kind == "TPU v5 lite" and report.num_devices == 4
    assert report.hbm_per_device == 16 * 2**30 and report.fits is True
    assert 0.8 < report.xla_flops / report.model_flops < 1.6

    huge = dataclasses.replace(spec, batch_size=4096, task_feature_lengths={"inputs": 512, "targets": 512})
    step = aot.compile_train_step(huge, aot.get_topology("v5e:2x2"))
    report = step.report
    assert step.compiled is None and report.fits is False and "RESOURCE_EXHAUSTED" in report.compiler_error


@pytest.mark.slow
def test_tiny_t5_compiles_for_two_slices_with_data_parallelism_over_dcn():
    pytest.importorskip("libtpu")
    bindings = [*TINY_BINDINGS, "MeshConfig.data = 2", "MeshConfig.dcn_data = 2"]
    spec = spec_from(["models/t5_1_1_tiny.gin", "runs/pretrain.gin", "mesh/fsdp.gin"], bindings)
    topology = aot.get_topology("v5e:2x2", num_slices=2)
    mesh = partitioning.make_mesh(spec.mesh_config, topology.devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1, "expert": 1}
    slices = np.vectorize(lambda device: device.slice_index)(mesh.devices)
    np.testing.assert_array_equal(slices, np.broadcast_to(np.arange(2)[:, None, None, None], slices.shape))
    report = aot.compile_train_step(spec, topology).report
    assert report.topology == "2 slices of v5e:2x2" and report.num_devices == 8
    assert report.hbm_per_device == 16 * 2**30 and report.fits is True

    one_slice_mesh = dataclasses.replace(spec, mesh_config=dataclasses.replace(spec.mesh_config, dcn_data=1))
    with pytest.raises(ValueError, match=r"span 2 slice\(s\) .* set MeshConfig.dcn_data"):
        aot.compile_train_step(one_slice_mesh, topology)
