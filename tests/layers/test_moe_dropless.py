"""The dropless MoE layer (grouped matmuls, jax.lax.ragged_dot) equals the capacity-based layer when its
capacity drops nothing: outputs, sown losses and gradients, top-1 and top-2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from layers.moe_options import MoeOptions

from ptmjax.layers.moe import MoeBlock

GROUPS, TOKENS, EMBED, D_FF, EXPERTS = 3, 10, 16, 24, 4


def apply_and_grads(module: MoeBlock, params: dict, x: jnp.ndarray):
    """Outputs, sown losses and the gradients (params, x) of a fixed random projection of the outputs."""
    projection = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape), jnp.float32)

    def objective(params, x):
        out, state = module.apply({"params": params}, x, mutable=["losses"])
        aux = sum(jax.tree.leaves(state["losses"]))
        return jnp.sum(out * projection) + aux, (out, state["losses"])

    (_, (out, losses)), grads = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(params, x)
    return out, losses, grads


@pytest.mark.parametrize("top_k", [1, 2])
def test_dropless_equals_capacity_routing_that_drops_nothing(top_k):
    capacity = MoeBlock(MoeOptions(num_experts=EXPERTS, moe_top_k=top_k, moe_eval_capacity_factor=EXPERTS / top_k),
                        D_FF, ("gelu", "linear"))
    dropless = MoeBlock(MoeOptions(num_experts=EXPERTS, moe_top_k=top_k, moe_dropless=True), D_FF, ("gelu", "linear"))
    x = jnp.asarray(np.random.default_rng(top_k).standard_normal((GROUPS, TOKENS, EMBED)), jnp.float32)
    params = nn.unbox(capacity.init(jax.random.key(top_k), x)["params"])
    params["router"] = params["router"] * 30.0  # decisive routing: no near-ties between experts
    assert jax.tree.structure(nn.unbox(dropless.init(jax.random.key(0), x)["params"])) == jax.tree.structure(params)
    want, want_losses, want_grads = apply_and_grads(capacity, params, x)
    got, got_losses, got_grads = apply_and_grads(dropless, params, x)
    np.testing.assert_allclose(got, want, atol=1e-6 * float(jnp.max(jnp.abs(want))))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), got_losses, want_losses)
    for got_grad, want_grad in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(got_grad, want_grad, atol=1e-5 * float(jnp.max(jnp.abs(want_grad))))
