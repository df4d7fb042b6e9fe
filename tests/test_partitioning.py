"""Mesh construction and rule validation."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.partitioning import MeshConfig


def test_minus_one_takes_the_remaining_devices():
    mesh = partitioning.make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert partitioning.data_parallel_size(mesh) == 4


def test_single_device_mesh():
    mesh = partitioning.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    assert mesh.size == 1


@pytest.mark.parametrize(
    "config,message",
    [
        (MeshConfig(data=-1, fsdp=-1), "at most one mesh axis may be -1"),
        (MeshConfig(data=3, fsdp=-1), "does not divide 8"),
        (MeshConfig(data=2, fsdp=2), "has 4 devices but 8 are available"),
        (MeshConfig(data=0), "must be positive"),
    ],
)
def test_bad_mesh_shapes_explain_themselves(config, message):
    with pytest.raises(ValueError, match=message):
        partitioning.make_mesh(config)


def test_unknown_mesh_axis_in_rule_names_it_and_the_known_axes():
    rules = partitioning.DEFAULT_RULES + (("mlp", "modle"),)
    known = "known: data, fsdp, tensor, expert"
    with pytest.raises(ValueError, match=rf"unknown mesh axis 'modle' in rule for 'mlp'; {known}"):
        partitioning.make_mesh(MeshConfig(rules=rules))


def fake_devices(slices: int, per_slice: int) -> list[SimpleNamespace]:
    """Devices of a multi-slice job as JAX lists them: slice by slice, each with its slice_index."""
    return [SimpleNamespace(id=i, slice_index=i // per_slice, platform="cpu", device_kind="fake", process_index=0)
            for i in range(slices * per_slice)]


def slice_of(grid: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda device: device.slice_index, otypes=[int])(grid)


def test_multi_slice_grids_span_slices_only_along_dcn_axes():
    devices = fake_devices(slices=2, per_slice=8)
    grid = partitioning.device_grid(MeshConfig(data=-1, fsdp=4, tensor=2, dcn_data=2), devices)
    assert grid.shape == (2, 4, 2, 1)
    np.testing.assert_array_equal(slice_of(grid), np.broadcast_to(np.arange(2)[:, None, None, None], grid.shape))

    grid = partitioning.device_grid(MeshConfig(data=1, fsdp=-1, tensor=2, dcn_fsdp=2), devices)
    assert grid.shape == (1, 8, 2, 1)  # fsdp 8 = 4 within each slice x 2 slices
    np.testing.assert_array_equal(slice_of(grid), np.broadcast_to((np.arange(8) // 4)[None, :, None, None], grid.shape))
    assert sorted(d.id for d in grid.flat) == list(range(16))


def test_slices_and_dcn_settings_must_agree():
    with pytest.raises(ValueError, match=r"span 2 slice\(s\) but .* over 1 .*set MeshConfig.dcn_data"):
        partitioning.device_grid(MeshConfig(), fake_devices(2, 4))
    with pytest.raises(ValueError, match=r"span 1 slice\(s\)"):  # the emulated CPU devices are one slice
        partitioning.make_mesh(MeshConfig(dcn_data=2))
    with pytest.raises(ValueError, match=r"\{'data': \(1, 2\)\} \(size, slices\) do not divide"):
        partitioning.device_grid(MeshConfig(data=1, fsdp=-1, dcn_data=2), fake_devices(2, 4))
    with pytest.raises(ValueError, match="dcn_fsdp"):
        partitioning.device_grid(MeshConfig(dcn_fsdp=0), fake_devices(1, 4))


STAGED = {"data": 2, "fsdp": -1, "tensor": 1, "expert": 1, "stage": 2}


def test_the_mesh_is_an_ordered_mapping_of_axes_that_a_gin_file_can_extend():
    import gin

    gin.parse_config("import ptmjax.partitioning\nMeshConfig.axes = {'data': 2, 'fsdp': -1, 'tensor': 1, "
                     "'expert': 1, 'stage': 2}")
    try:
        config = MeshConfig()
    finally:
        gin.clear_config()
    mesh = partitioning.make_mesh(config)
    assert mesh.axis_names == ("data", "fsdp", "tensor", "expert", "stage")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 1, "expert": 1, "stage": 2}
    assert partitioning.data_parallel_size(mesh) == 4  # 'stage' does not split the batch
    assert hash(config) == hash(MeshConfig(axes=STAGED))


def test_the_shorthand_fields_and_the_same_axes_give_the_same_mesh():
    shorthand = partitioning.make_mesh(MeshConfig(data=2, fsdp=2, tensor=-1))
    as_data = partitioning.make_mesh(MeshConfig(axes={"data": 2, "fsdp": 2, "tensor": -1, "expert": 1}))
    assert shorthand.axis_names == as_data.axis_names
    np.testing.assert_array_equal(shorthand.device_ids, as_data.device_ids)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"axes": STAGED, "data": 4}, r"binds both axes and the shorthand \{'data': 4\}"),
        ({"axes": STAGED, "dcn_axes": {"stag": 2}}, r"dcn_axes names \['stag'\], not mesh axes; known: data, fsdp"),
        ({"dcn_axes": {"data": 2}}, "dcn_axes needs MeshConfig.axes"),
        ({"axes": {}}, "must map distinct axis names to sizes"),
    ],
)
def test_bad_axes_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message):
        MeshConfig(**options)


def test_a_rule_naming_an_axis_the_mesh_lacks_lists_the_mesh_axes():
    rules = partitioning.DEFAULT_RULES + (("mlp", "context"),)
    with pytest.raises(ValueError, match="unknown mesh axis 'context' .* known: data, fsdp, tensor, expert, stage"):
        partitioning.make_mesh(MeshConfig(axes=STAGED, rules=rules))


def test_dcn_axes_span_slices_along_named_axes():
    grid = partitioning.device_grid(MeshConfig(axes={**STAGED, "data": -1, "fsdp": 2}, dcn_axes={"stage": 2}),
                                    fake_devices(slices=2, per_slice=8))
    assert grid.shape == (4, 2, 1, 1, 2)
    np.testing.assert_array_equal(slice_of(grid), np.broadcast_to(np.arange(2), grid.shape))
