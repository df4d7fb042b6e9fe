"""Mesh construction and rule validation."""

import jax
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
