"""The dropless MoE's grouped matmul with its rows split over the batch's devices equals the plain ragged dot,
forward and backward, and keeps each device's share of the rows only. Megablox's TPU kernels (TPU's grouped
product), run unsplit in Pallas's TPU interpret mode, equal the ragged dot too."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from ptmjax import partitioning
from ptmjax.layers.grouped_matmul import grouped_matmul, megablox_dot
from ptmjax.partitioning import MeshConfig

ROWS, IN, OUT = 64, 8, 12
# Groups that cross the 8-row slices' borders, and two empty ones (8 devices x 8 rows = 64).
GROUP_SIZES = np.array([5, 0, 19, 3, 0, 30, 6, 1], np.int32)


def loss_and_grads(rows, kernels, sizes, dot=None):
    def loss(rows, kernels):
        out = grouped_matmul(rows, kernels, sizes, dot)
        return jnp.sum(jnp.sin(out)), out

    (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(rows, kernels)
    return value, out, grads


def assert_equal_to_the_ragged_dot(got, want, rtol, atol):
    """(loss, outputs, gradients) of `loss_and_grads` against the ragged dot's; the loss summed in another order."""
    (got_value, got_out, got_grads), (want_value, want_out, want_grads) = got, want
    np.testing.assert_allclose(got_out, want_out, rtol=rtol, atol=atol)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-5)
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(got_grad, want_grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "mesh_config",
    [MeshConfig(data=1, fsdp=1, tensor=1, expert=8), MeshConfig(data=2, fsdp=2, tensor=2, expert=1)],
    ids=["expert8", "data2_fsdp2_tensor2"],
)
def test_split_rows_equal_the_plain_ragged_dot(mesh_config):
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((ROWS, IN)).astype(np.float32)
    kernels = rng.standard_normal((len(GROUP_SIZES), IN, OUT)).astype(np.float32)
    assert GROUP_SIZES.sum() == ROWS

    want = jax.jit(loss_and_grads)(rows, kernels, GROUP_SIZES)  # no mesh: plain
    mesh = partitioning.make_mesh(mesh_config)
    step = jax.jit(loss_and_grads)
    with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_config.rules):
        assert "shard_map" in str(jax.make_jaxpr(loss_and_grads)(rows, kernels, GROUP_SIZES))
        got = step(rows, kernels, GROUP_SIZES)
        compiled = step.lower(rows, kernels, GROUP_SIZES).compile().as_text()

    assert_equal_to_the_ragged_dot(got, want, rtol=1e-6, atol=1e-5)
    row_ways = 8 if mesh_config.expert == 8 else 4  # the batch axes: expert, or data x fsdp
    assert f"f32[{ROWS // row_ways},{OUT}]" in compiled  # each device's products are its share of the rows


def test_outside_a_mesh_and_with_uneven_rows_it_is_the_ragged_dot():
    rows, kernels = jnp.ones((3, IN)), jnp.ones((2, IN, OUT))
    sizes = jnp.array([1, 2], jnp.int32)
    want = jax.lax.ragged_dot(rows, kernels, sizes)
    np.testing.assert_array_equal(grouped_matmul(rows, kernels, sizes), want)
    mesh_config = MeshConfig(data=1, fsdp=1, tensor=1, expert=8)
    with jax.set_mesh(partitioning.make_mesh(mesh_config)), nn.logical_axis_rules(mesh_config.rules):
        np.testing.assert_array_equal(jax.jit(grouped_matmul)(rows, kernels, sizes), want)  # 3 rows, 8 devices


def test_megablox_equals_the_ragged_dot_on_rows_and_sizes_off_its_tiles():
    """200 rows (padded to 256 for the 128-row tiles), in 40 and out 72 (partial tiles), empty groups."""
    rng = np.random.default_rng(1)
    sizes = np.array([0, 77, 5, 0, 118], np.int32)
    rows = rng.standard_normal((int(sizes.sum()), 40)).astype(np.float32)
    kernels = rng.standard_normal((len(sizes), 40, 72)).astype(np.float32)
    want = jax.jit(loss_and_grads, static_argnums=3)(rows, kernels, sizes, jax.lax.ragged_dot)
    with pltpu.force_tpu_interpret_mode():
        got = jax.jit(loss_and_grads, static_argnums=3)(rows, kernels, sizes, megablox_dot)
    assert_equal_to_the_ragged_dot(got, want, rtol=1e-5, atol=5e-5)  # megablox's 128-wide tiles; outputs up to ~25
