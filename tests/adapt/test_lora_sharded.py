"""LoRA on a (data=2, fsdp=2, tensor=2) mesh: the init, forward and gradient equal one device's, and the LoRA
parameters are laid out as their kernels' logical axes say."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from lora_test_models import BASE_MODELS, batch, with_random_lora

from ptmjax import partitioning
from ptmjax.adapt.lora import lora
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig

MESH = partitioning.MeshConfig(data=2, fsdp=2, tensor=2)


def one_layer(model: nn.Module) -> nn.Module:
    """`model` with one layer per stack (the test compiles four programs of it)."""
    c = model.config
    encoder_decoder = hasattr(c, "num_encoder_layers")
    stacks = {"num_encoder_layers": 1, "num_decoder_layers": 1} if encoder_decoder else {"num_layers": 1}
    return model.clone(config=dataclasses.replace(c, **stacks))


def loss_and_grads(api, params, rows):
    def loss(p):
        token_loss, _, _ = api.loss(p, rows, LossConfig(z_loss=0.0))
        return token_loss

    return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize("name", ["t5", pytest.param("gpt2", marks=pytest.mark.slow)])  # T5 has all three attentions
def test_sharded_lora_equals_one_device(name):
    api = model_api(lora(one_layer(BASE_MODELS[name]), rank=4, alpha=16.0))
    rows = batch(name, rows=8)
    mesh, rules = partitioning.make_mesh(MESH), MESH.rules
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, rules)

    def under_rules(fun):
        def run(*args):
            with nn.logical_axis_rules(rules):
                return fun(*args)

        return run

    single_params = nn.unbox(jax.jit(api.init)(jax.random.key(0)))
    with jax.set_mesh(mesh):
        sharded_params = jax.jit(under_rules(lambda k: nn.unbox(api.init(k))), out_shardings=shardings)(
            jax.random.key(0)
        )
    jax.tree.map(np.testing.assert_array_equal, sharded_params, single_params)
    query = (sharded_params["encoder"] if name == "t5" else sharded_params)["layers_0"]["attention"]["query"]
    assert query["lora_a"].sharding.spec == PartitionSpec("fsdp", None)
    assert query["lora_b"].sharding.spec == PartitionSpec(None, "tensor", None)

    params = with_random_lora(single_params)
    single_loss, single_grads = jax.jit(lambda p, r: loss_and_grads(api, p, r))(params, rows)
    replicated = NamedSharding(mesh, PartitionSpec())
    step = jax.jit(
        under_rules(lambda p, r: loss_and_grads(api, p, r)),
        in_shardings=(shardings, partitioning.batch_sharding(mesh)), out_shardings=(replicated, shardings),
    )
    with jax.set_mesh(mesh):
        loss, grads = step(jax.device_put(params, shardings), rows)
    assert len(loss.sharding.device_set) == 8
    np.testing.assert_allclose(loss, single_loss, rtol=1e-6)
    largest = max(float(np.abs(g).max()) for g in jax.tree.leaves(single_grads))
    jax.tree.map(lambda g, s: np.testing.assert_allclose(g, s, rtol=1e-4, atol=1e-5 * largest), grads, single_grads)
