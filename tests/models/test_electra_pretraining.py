"""ElectraPretraining: replacement sampling, gradient isolation, shared embeddings, and the corrupted sequence."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import numpy_boxed_variables
from scipy import stats

from ptmjax import partitioning
from ptmjax.models.electra import (
    ElectraConfig,
    ElectraDiscriminator,
    ElectraGenerator,
    ElectraPretraining,
    ElectraPretrainingConfig,
)

DISCRIMINATOR = ElectraConfig(  # every sharded dimension divides by 2, for the (data, fsdp, tensor) = 2^3 mesh
    vocab_size=16, embedding_size=8, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=8,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
CONFIG = ElectraPretrainingConfig(
    generator=dataclasses.replace(DISCRIMINATOR, d_model=8, d_ff=16),
    discriminator=DISCRIMINATOR,
)
TARGETS = jnp.array([[3, 4, 5, 6, 7, 8], [9, 10, 11, 0, 0, 0]], jnp.int32)  # row 1 padded (pad_token_id 0)
LOSS_MASK = jnp.array([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 1, 0]], jnp.int32)  # [1, 4] is padding: never replaced
MASK_ID = 1
INPUTS = jnp.where(LOSS_MASK == 1, MASK_ID, TARGETS)
MODEL = ElectraPretraining(CONFIG)


@functools.cache
def initial_params() -> dict:
    return numpy_boxed_variables(lambda: MODEL.init(jax.random.PRNGKey(0), INPUTS, TARGETS, LOSS_MASK))["params"]


def params_with_generator_bias(bias: np.ndarray) -> dict:
    """Init params whose generator output bias is `bias` [vocab] (random init gives a near-uniform softmax)."""
    params = jax.tree.map(lambda x: x, initial_params())  # a mutable copy of the nested dicts
    params["generator"]["mlm_head"]["bias"] = params["generator"]["mlm_head"]["bias"].replace_boxed(jnp.asarray(bias))
    return params


PEAKED = np.random.default_rng(0).normal(0.0, 1.5, CONFIG.discriminator.vocab_size).astype(np.float32)


@jax.jit
def run(params: dict, key: jax.Array):
    return MODEL.apply({"params": params}, INPUTS, TARGETS, LOSS_MASK, rngs={"sample": key})


@jax.jit
def corrupt(params: dict, generator_logits: jax.Array, key: jax.Array) -> jax.Array:
    """`ElectraPretraining.corrupt` alone: the corrupted tokens [b, s] that __call__ gives the discriminator."""
    rngs = {"sample": key}
    return MODEL.apply({"params": params}, generator_logits, TARGETS, LOSS_MASK, rngs=rngs, method=MODEL.corrupt)


def test_sampled_tokens_follow_the_generator_softmax_and_never_padding():
    params = params_with_generator_bias(PEAKED)
    keys = jax.random.split(jax.random.PRNGKey(1), 10000)
    logits = run(params, keys[0]).generator_logits
    corrupted = np.asarray(jax.vmap(corrupt, in_axes=(None, None, 0))(params, logits, keys))  # [n, b, s]
    probs = np.asarray(jax.nn.softmax(logits[0, 3]), np.float64)
    probs[CONFIG.discriminator.pad_token_id] = 0.0  # padding is never sampled: the rest renormalised
    probs /= probs.sum()
    observed = np.bincount(corrupted[:, 0, 3], minlength=len(probs))
    assert observed[CONFIG.discriminator.pad_token_id] == 0
    support = probs > 0
    chi2 = stats.chisquare(observed[support], len(keys) * probs[support])
    print(f"chi-square {chi2.statistic:.1f} on {support.sum() - 1} dof, p = {chi2.pvalue:.3f}")
    assert chi2.pvalue > 1e-3


def test_positions_outside_the_loss_mask_and_padding_are_never_replaced():
    params = params_with_generator_bias(PEAKED)
    keep = (np.asarray(LOSS_MASK) == 0) | (np.asarray(TARGETS) == 0)
    replaced = []
    for key in jax.random.split(jax.random.PRNGKey(2), 30):
        out = run(params, key)
        corrupted = np.asarray(corrupt(params, out.generator_logits, key))  # the same draw as inside __call__
        np.testing.assert_array_equal(corrupted[keep], np.asarray(TARGETS)[keep])
        np.testing.assert_array_equal(out.is_replaced, corrupted != np.asarray(TARGETS))
        replaced.append(np.asarray(out.is_replaced)[~keep])
    assert np.mean(replaced) > 0.5  # the masked real positions do get replaced
    assert out.generator_logits.dtype == jnp.float32 and out.generator_logits.shape == (2, 6, 16)
    assert out.discriminator_logits.dtype == jnp.float32 and out.discriminator_logits.shape == (2, 6)
    assert out.is_replaced.dtype == bool


def test_discriminator_reads_the_corrupted_sequence_and_a_correct_sample_is_not_replaced():
    bias = np.zeros(16, np.float32)
    bias[7] = 1e4  # the generator always samples token 7, which is the target at [0, 4]
    params = params_with_generator_bias(bias)
    out = run(params, jax.random.PRNGKey(3))
    corrupted = jnp.where((LOSS_MASK == 1) & (TARGETS != 0), 7, TARGETS)
    np.testing.assert_array_equal(out.is_replaced, corrupted != TARGETS)
    assert not out.is_replaced[0, 4] and out.is_replaced[0, 1]
    standalone = {**params["discriminator"], "embeddings": params["embeddings"]}
    reference = jax.jit(ElectraDiscriminator(CONFIG.discriminator).apply)({"params": standalone}, corrupted)
    np.testing.assert_allclose(out.discriminator_logits, reference, atol=1e-6)


def test_no_gradient_reaches_the_generator_through_the_sample():
    params = params_with_generator_bias(PEAKED)
    weights = jax.random.normal(jax.random.PRNGKey(4), TARGETS.shape)

    @jax.jit
    @jax.grad
    def grad(p):
        return jnp.sum(run(p, jax.random.PRNGKey(5)).discriminator_logits * weights)

    grads = grad(params)
    norms = {name: max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[name])) for name in grads}
    assert norms["generator"] == 0.0 and norms["discriminator"] > 0 and norms["embeddings"] > 0, norms


def test_the_embeddings_are_one_parameter_shared_by_both_models():
    params = params_with_generator_bias(PEAKED)
    assert sorted(params) == ["discriminator", "embeddings", "generator"]
    assert "embeddings" not in params["generator"] and "embeddings" not in params["discriminator"]
    out = run(params, jax.random.PRNGKey(6))
    generator = {**params["generator"], "embeddings": params["embeddings"]}
    standalone = jax.jit(ElectraGenerator(CONFIG.generator).apply)({"params": generator}, INPUTS)
    np.testing.assert_allclose(out.generator_logits, standalone, atol=1e-6)
    moved = jax.tree.map(lambda x: x, params)
    table = moved["embeddings"]["token_embedder"]["embedding"]
    moved["embeddings"]["token_embedder"]["embedding"] = table.replace_boxed(table.unbox() * 2.0)
    out2 = run(moved, jax.random.PRNGKey(6))
    assert not np.allclose(out.generator_logits, out2.generator_logits)
    assert not np.allclose(out.discriminator_logits, out2.discriminator_logits)


def test_dropout_runs_and_inputs_are_checked():
    params = initial_params()
    rngs = {"sample": jax.random.PRNGKey(7), "dropout": jax.random.PRNGKey(8)}
    config = ElectraPretrainingConfig(
        generator=dataclasses.replace(CONFIG.generator, dropout_rate=0.1),
        discriminator=dataclasses.replace(DISCRIMINATOR, dropout_rate=0.1),
    )
    out = jax.eval_shape(
        lambda: ElectraPretraining(config).apply(
            {"params": params}, INPUTS, TARGETS, LOSS_MASK, enable_dropout=True, rngs=rngs
        )
    )
    assert out.discriminator_logits.shape == TARGETS.shape
    with pytest.raises(ValueError, match="loss_mask"):
        jax.eval_shape(lambda: MODEL.apply({"params": params}, INPUTS, TARGETS, LOSS_MASK[:, :3], rngs=rngs))
    with pytest.raises(ValueError, match="embed_dim"):
        ElectraPretrainingConfig(
            generator=dataclasses.replace(CONFIG.generator, embedding_size=4), discriminator=DISCRIMINATOR
        )
    with pytest.raises(ValueError, match="dropout_rate"):
        ElectraPretrainingConfig(generator=config.generator, discriminator=DISCRIMINATOR)


def test_sharded_over_data_fsdp_tensor_equals_single_device():
    params = {"params": params_with_generator_bias(PEAKED)}
    mesh_config = partitioning.MeshConfig(data=2, fsdp=2, tensor=2)
    mesh = partitioning.make_mesh(mesh_config)
    sharded_params = jax.device_put(params, partitioning.logical_shardings(params, mesh, mesh_config.rules))
    assert len(sharded_params["params"]["embeddings"]["token_embedder"]["embedding"].value.sharding.device_set) == 8
    key = jax.random.PRNGKey(9)
    with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_config.rules):
        sharded = jax.jit(lambda p: MODEL.apply(p, INPUTS, TARGETS, LOSS_MASK, rngs={"sample": key}))(sharded_params)
    single = run(params["params"], key)
    np.testing.assert_array_equal(sharded.is_replaced, single.is_replaced)
    np.testing.assert_allclose(sharded.generator_logits, single.generator_logits, atol=2e-5)
    np.testing.assert_allclose(sharded.discriminator_logits, single.discriminator_logits, atol=2e-5)
