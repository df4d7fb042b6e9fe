"""Context-parallel attention (ptmjax/layers/context_parallel.py) on the 8 emulated devices equals attention on
one device: for each mask kind (causal, bidirectional, prefix LM, packed segments, T5's relative bias) and each
form ('all_gather', 'ring'), the outputs at real positions and the gradients of the queries, keys, values and
bias table, on (data=2, context=4) and (data=2, context=2, tensor=2). The reference builds its mask here, from
the rules written out in NumPy, and attends with a dense softmax on one device."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.context_parallel import ContextMask, context_parallel_attention
from ptmjax.layers.relative_position import PositionBias, relative_position_bucket
from ptmjax.layers.sequence_sharding import context_axis
from ptmjax.partitioning import CONTEXT_RULES, MeshConfig

BATCH, HEADS, LENGTH, HEAD_DIM, BUCKETS = 2, 4, 16, 8, 32
MESHES = {
    "data2_context4": {"data": 2, "fsdp": 1, "context": 4, "tensor": 1, "expert": 1},
    "data2_context2_tensor2": {"data": 2, "fsdp": 1, "context": 2, "tensor": 2, "expert": 1},
}
PACKED = np.array([[1] * 5 + [2] * 7 + [3] * 2 + [0] * 2, [1] * 9 + [2] * 7])
PADDED = np.array([[1] * 13 + [0] * 3, [1] * 16])
PREFIX = np.arange(LENGTH)[None] < np.array([[6], [11]])  # crosses block boundaries of 4 and 8
SEGMENT_POSITIONS = np.array([list(range(5)) + list(range(7)) + [0, 1, 0, 0], list(range(9)) + list(range(7))])
# kind -> (segment ids, causal, prefix, relative-bias positions [b|1, l] or None, bidirectional bias)
MASKS = {
    "causal": (np.ones_like(PADDED), True, None, None, False),
    "bidirectional": (PADDED, False, None, None, False),
    "prefix_lm": (PADDED, True, PREFIX, None, False),
    "packed_causal": (PACKED, True, None, None, False),
    "packed_bidirectional": (PACKED, False, None, None, False),
    "t5_encoder_packed": (PACKED, False, None, SEGMENT_POSITIONS, True),
    "t5_decoder": (PADDED, True, None, np.arange(LENGTH)[None], False),
}


def allowed(segment_ids, causal, prefix):
    """[b, 1, q, k] bool, each rule written out for every (query, key) pair."""
    b, n = segment_ids.shape
    out = np.zeros((b, 1, n, n), bool)
    for row in range(b):
        for q in range(n):
            for k in range(n):
                same = segment_ids[row, q] == segment_ids[row, k] != 0
                order = k <= q or (prefix is not None and prefix[row, q] and prefix[row, k])
                out[row, 0, q, k] = same and (order or not causal)
    return out


def inputs(kind, seed=0):
    ids, causal, prefix, positions, bidirectional = MASKS[kind]
    rng = np.random.default_rng(seed)
    q, k, v, d_out = (jnp.asarray(rng.normal(size=(BATCH, HEADS, LENGTH, HEAD_DIM)), jnp.float32) for _ in range(4))
    table = jnp.asarray(rng.normal(size=(BUCKETS, HEADS)), jnp.float32)
    return (q, k, v, table, d_out), (ids, causal, prefix, positions, bidirectional)


def context_mask(table, ids, causal, prefix, positions, bidirectional):
    ids = jnp.asarray(ids, jnp.int32)
    bias = None if positions is None else PositionBias(
        table, jnp.asarray(positions), jnp.asarray(positions), BUCKETS, 128, bidirectional)
    return ContextMask.of(AttentionMask(None, ids, ids, causal), None if prefix is None else jnp.asarray(prefix), bias)


def reference_loss(q, k, v, table, d_out, ids, causal, prefix, positions, bidirectional):
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    if positions is not None:
        relative = positions[:, None, :] - positions[:, :, None]
        buckets = relative_position_bucket(relative, bidirectional, BUCKETS, 128)
        logits = logits + jnp.moveaxis(table[buckets], -1, 1)
    logits = jnp.where(allowed(ids, causal, prefix), logits, -1e10)
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, -1), v)
    return jnp.sum(out * d_out * (ids > 0)[:, None, :, None]), out


def sharded_loss(form, q, k, v, table, d_out, ids, causal, prefix, positions, bidirectional):
    out = context_parallel_attention(q, k, v, context_mask(table, ids, causal, prefix, positions, bidirectional), form)
    return jnp.sum(out * d_out * (ids > 0)[:, None, :, None]), out


def mesh_of(name):
    return partitioning.make_mesh(MeshConfig(axes=MESHES[name], rules=CONTEXT_RULES))


def run_sharded(form, mesh_name, arrays, facts):
    grad = jax.value_and_grad(lambda *a: sharded_loss(form, *a, *facts), argnums=(0, 1, 2, 3), has_aux=True)
    with jax.set_mesh(mesh_of(mesh_name)), nn.logical_axis_rules(CONTEXT_RULES):
        return jax.jit(grad)(*arrays)


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("form", ["all_gather", "ring"])
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_sharded_attention_equals_one_device(kind, form, mesh_name):
    arrays, facts = inputs(kind)
    (_, want), want_grads = jax.value_and_grad(reference_loss, argnums=(0, 1, 2, 3), has_aux=True)(*arrays, *facts)
    (_, got), got_grads = run_sharded(form, mesh_name, arrays, facts)
    real = (facts[0] > 0)[:, None, :, None]
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=2e-6)
    for name, g, w in zip(("query", "key", "value", "table"), got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, err_msg=name)
    if facts[3] is not None:
        assert np.abs(want_grads[3]).max() > 0.1  # the bias really trains


def compiled_text(form, kind):
    arrays, facts = inputs(kind)
    with jax.set_mesh(mesh_of("data2_context4")), nn.logical_axis_rules(CONTEXT_RULES):
        return jax.jit(lambda *a: sharded_loss(form, *a, *facts)[1]).lower(*arrays).compile().as_text()


def test_ring_passes_blocks_and_skips_the_future_where_causal():
    """The ring sends keys and values around (collective-permute) and gathers nothing; a causal ring steps
    through a conditional (the skipped future blocks), a bidirectional one does not."""
    causal, bidirectional = compiled_text("ring", "causal"), compiled_text("ring", "bidirectional")
    for text in (causal, bidirectional):
        assert "collective-permute" in text and "all-gather" not in text
    assert "conditional" in causal and "conditional" not in bidirectional
    assert "all-gather" in compiled_text("all_gather", "causal")


def test_folded_mask_equals_the_reference_mask():
    """Off a context axis, a ContextMask folds into the bias the other kernels read: the same mask."""
    for kind in ("prefix_lm", "packed_causal", "t5_encoder_packed"):
        (_, _, _, table, _), (ids, causal, prefix, positions, bidirectional) = inputs(kind)
        bias = context_mask(table, ids, causal, prefix, positions, bidirectional).dense_bias(jnp.float32)
        want = np.broadcast_to(allowed(ids, causal, prefix), bias.shape)
        np.testing.assert_array_equal(np.asarray(bias) > -1e9, want)


@pytest.mark.parametrize("make, message", [
    (lambda q, mask: context_parallel_attention(q, q, q, mask, "rings"),
     r"context_parallel_attention='rings' is unknown; use one of \['all_gather', 'ring'\]"),
    (lambda q, mask: context_parallel_attention(q[:, :, :14], q[:, :, :14], q[:, :, :14], mask, "ring"),
     r"the sequence length 14 does not divide over mesh axes \('context',\) \(4 ways\); pad it to a multiple of 4"),
])
def test_bad_values_are_refused_in_one_line(make, message):
    (q, _, _, table, _), facts = inputs("causal")
    with jax.set_mesh(mesh_of("data2_context4")), nn.logical_axis_rules(CONTEXT_RULES):
        with pytest.raises(ValueError, match=message) as error:
            make(q, context_mask(table, *facts))
    assert "\n" not in str(error.value)


def test_a_dense_bias_and_a_missing_axis_are_refused_in_one_line():
    (q, _, _, table, _), facts = inputs("causal")
    mask = context_mask(table, *facts).replace(bias=jnp.zeros((1, 1, LENGTH, LENGTH)))
    with jax.set_mesh(mesh_of("data2_context4")), nn.logical_axis_rules(CONTEXT_RULES):
        with pytest.raises(ValueError, match=r"reads no dense bias .* give T5's relative-position bias as "
                                             r"ContextMask.position_bias$"):
            context_parallel_attention(q, q, q, mask, "ring")
    without_context = partitioning.make_mesh(MeshConfig(data=8))
    with jax.set_mesh(without_context), nn.logical_axis_rules(CONTEXT_RULES):
        with pytest.raises(ValueError, match=r"the rule for 'activation_length' names mesh axes \['context'\] that "
                                             r"the mesh .* lacks; add them to MeshConfig.axes or change the rule$"):
            context_axis()
