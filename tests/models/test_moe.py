"""The MoE layer against a plain per-token NumPy loop, dropping, aux losses, and T5 hooks.

The reference routes one token at a time: softmax over the router logits, the
top-k experts (top-1: raw probability; top-k: gates renormalised to sum to 1),
first choices of all tokens before second choices, each expert filling its
`capacity` slots in token order; the output is the gate-weighted sum of the
kept experts' gated-GELU feed-forward outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import count_params
from layers.moe_options import MoeOptions

from ptmjax.layers.moe import MoeBlock, expert_capacity
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.models.t5 import EncoderLayer

GROUPS, TOKENS, EMBED, D_FF, EXPERTS = 3, 10, 16, 24, 4


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def reference_moe(x: np.ndarray, params: dict, top_k: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 per-token loop: outputs [G, S, d] and a kept-choice count [G, S]."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    out, kept = np.zeros(x.shape), np.zeros(x.shape[:2], int)
    for g in range(x.shape[0]):
        logits = x[g] @ p["router"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        choices = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # [S, K]
        gates = np.take_along_axis(probs, choices, -1)
        if top_k > 1:
            gates /= gates.sum(-1, keepdims=True)
        load = [0] * probs.shape[1]
        for k in range(top_k):
            for s in range(x.shape[1]):
                e = choices[s, k]
                if load[e] >= capacity:
                    continue
                load[e] += 1
                kept[g, s] += 1
                hidden = gelu_tanh(x[g, s] @ p["wi_0"][e]) * (x[g, s] @ p["wi_1"][e])
                out[g, s] += gates[s, k] * (hidden @ p["wo"][e])
    return out, kept


def block(top_k: int = 1, train_cf: float = 1.25, eval_cf: float = 2.0, **kw) -> MoeBlock:
    options = MoeOptions(num_experts=EXPERTS, moe_top_k=top_k, moe_train_capacity_factor=train_cf,
                        moe_eval_capacity_factor=eval_cf, **{f"moe_{name}": value for name, value in kw.items()})
    return MoeBlock(options, D_FF, ("gelu", "linear"))


def init(module: MoeBlock, seed: int = 0) -> tuple[dict, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((GROUPS, TOKENS, EMBED)).astype(np.float32)
    params = nn.unbox(module.init(jax.random.key(seed), jnp.asarray(x))["params"])
    # A 30x larger router, so that routing is decisive (no near-ties between experts).
    params["router"] = params["router"] * 30.0
    return params, x


@pytest.mark.parametrize("top_k", [1, 2])
def test_matches_per_token_loop_when_nothing_is_dropped(top_k):
    module = block(top_k, eval_cf=EXPERTS / top_k)  # capacity = all tokens of the group
    params, x = init(module, seed=top_k)
    out, state = module.apply({"params": params}, jnp.asarray(x), mutable=["losses", "intermediates"])
    want, kept = reference_moe(x.astype(np.float64), params, top_k, TOKENS)
    assert (kept == top_k).all() and float(state["intermediates"]["dropped_fraction"][0]) == 0.0
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("top_k", [1, 2])
def test_small_capacity_drops_tokens_in_priority_order(top_k):
    module = block(top_k, train_cf=0.3)  # capacity = ceil(10 * k * 0.3 / 4) = 1 (top-1), 2 (top-2)
    capacity = expert_capacity(TOKENS, top_k, 0.3, EXPERTS)
    assert capacity == top_k
    params, x = init(module, seed=10 + top_k)
    out = module.apply({"params": params}, jnp.asarray(x), enable_dropout=True, mutable=["losses"])[0]
    want, kept = reference_moe(x.astype(np.float64), params, top_k, capacity)
    assert (kept == 0).any(), "the test should drop some tokens entirely"
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(out)[kept == 0], 0.0)


def test_dropped_tokens_pass_through_the_t5_block_residual():
    """In an encoder layer, x_out = x + attention + mlp; a dropped token's mlp term is exactly 0."""
    config = T5Config(
        vocab_size=64, d_model=EMBED, num_heads=2, head_dim=8, d_ff=D_FF, num_encoder_layers=1,
        num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
        num_experts=EXPERTS, moe_every=1, moe_eval_capacity_factor=0.1,
    )
    layer = EncoderLayer(config, use_moe=True)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 12, EMBED)), jnp.float32)
    bias = jnp.zeros((1, 2, 12, 12))
    variables = layer.init(jax.random.key(0), x, bias)
    y, state = layer.apply(variables, x, bias, capture_intermediates=True, mutable=["intermediates"])
    inner = state["intermediates"]
    attention, mlp = inner["attention"]["__call__"][0], inner["mlp"]["__call__"][0]
    mlp_zero = np.all(np.asarray(mlp) == 0.0, axis=-1)  # [b, s]
    assert 0 < mlp_zero.sum() < mlp_zero.size  # capacity 1 per expert: at most 4 of 12 tokens routed
    np.testing.assert_array_equal(np.asarray(y)[mlp_zero], np.asarray(x + attention)[mlp_zero])


def balanced_params(params: dict, scale: float) -> dict:
    """Router sending token s to expert s % E with the same confidence for every expert."""
    router = np.zeros((EMBED, EXPERTS), np.float32)
    router[:EXPERTS, :EXPERTS] = scale * np.eye(EXPERTS)
    return {**params, "router": jnp.asarray(router)}


@pytest.mark.parametrize("top_k", [1, 2])
def test_load_balancing_loss_is_one_when_balanced_and_num_experts_when_collapsed(top_k):
    module = block(top_k, load_balancing_loss_weight=0.5, router_z_loss_weight=0.0)
    params, _ = init(module)
    tokens = 2 * EXPERTS  # each expert is the first choice of exactly 2 tokens
    x = np.zeros((GROUPS, tokens, EMBED), np.float32)
    x[:, np.arange(tokens), np.arange(tokens) % EXPERTS] = 1.0
    _, state = module.apply({"params": balanced_params(params, 3.0)}, jnp.asarray(x), mutable=["losses"])
    np.testing.assert_allclose(float(state["losses"]["load_balancing_loss"][0]), 0.5 * 1.0, rtol=1e-6)
    # Every token to expert 0 with probability ~1: f_0 = P_0 = 1, loss = E.
    x[:] = 0.0
    x[..., 0] = 1.0
    _, state = module.apply({"params": balanced_params(params, 100.0)}, jnp.asarray(x), mutable=["losses"])
    np.testing.assert_allclose(float(state["losses"]["load_balancing_loss"][0]), 0.5 * EXPERTS, rtol=1e-6)


def test_aux_losses_match_hand_computation():
    module = block(2, load_balancing_loss_weight=1e-2, router_z_loss_weight=1e-3)
    params, x = init(module, seed=3)
    _, state = module.apply({"params": params}, jnp.asarray(x), mutable=["losses"])
    logits = x.astype(np.float64) @ np.asarray(params["router"], np.float64)  # [G, S, E]
    log_z = np.log(np.exp(logits).sum(-1))
    probs = np.exp(logits - log_z[..., None])
    first = np.eye(EXPERTS)[probs.argmax(-1)]  # [G, S, E]
    balance = EXPERTS * np.mean(np.sum(first.mean(1) * probs.mean(1), -1))
    np.testing.assert_allclose(float(state["losses"]["load_balancing_loss"][0]), 1e-2 * balance, rtol=1e-5)
    np.testing.assert_allclose(float(state["losses"]["router_z_loss"][0]), 1e-3 * np.mean(log_z**2), rtol=1e-5)


def test_training_uses_train_capacity_and_jitter_eval_is_deterministic():
    module = block(1, train_cf=0.3, eval_cf=4.0, jitter_noise=0.1)
    params, x = init(module)
    run = lambda train, seed: module.apply(  # noqa: E731
        {"params": params}, jnp.asarray(x), enable_dropout=train, rngs={"dropout": jax.random.key(seed)},
        mutable=["losses", "intermediates"],
    )
    (train_a, sa), (train_b, _), (eval_a, se), (eval_b, _) = run(True, 0), run(True, 1), run(False, 0), run(False, 1)
    assert float(sa["intermediates"]["dropped_fraction"][0]) > 0.5
    assert float(se["intermediates"]["dropped_fraction"][0]) == 0.0
    assert not np.allclose(np.asarray(train_a), np.asarray(train_b)), "jitter should depend on the rng"
    np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))


def initializer(config: T5Config | GPT2Config) -> Callable[[], dict]:
    """The model's `init` on a one-token batch, for eval_shape (never run)."""
    tokens = jnp.ones((1, 1), jnp.int32)
    if isinstance(config, T5Config):
        return lambda: EncoderDecoder(config).init(jax.random.key(0), tokens, tokens)["params"]
    return lambda: GPT2(config).init(jax.random.key(0), tokens)["params"]


@pytest.mark.parametrize("name,experts", [("switch_base_8", 8), ("switch_base_16", 16)])
@pytest.mark.slow
def test_switch_base_param_count(name, experts, t5_config):
    config = t5_config(name)
    assert (config.num_experts, config.moe_every, config.moe_top_k) == (experts, 2, 1)
    assert (config.moe_train_capacity_factor, config.moe_eval_capacity_factor) == (1.25, 2.0)
    dense = t5_config("t5_1_1_base")
    # 6 MoE layers per stack; each adds E - 1 gated-GELU experts and a [768, E] router.
    extra = 12 * ((experts - 1) * 3 * 768 * 2048 + 768 * experts)
    assert count_params(initializer(config)) == count_params(initializer(dense)) + extra
    assert count_params(initializer(dense)) == 247_577_856


@pytest.mark.parametrize("name,experts,params", [("switch_tiny_8", 8, 821_248), ("switch_tiny_16", 16, 1_215_488)])
def test_tiny_switch_versions_param_count(name, experts, params, t5_config):
    config = t5_config(name)
    assert (config.num_experts, config.moe_every, config.moe_top_k) == (experts, 2, 1)
    # 2 MoE layers (layer 1 of each stack); each adds E - 1 gated-GELU experts and a [64, E] router.
    extra = 2 * ((experts - 1) * 3 * 64 * 128 + 64 * experts)
    assert count_params(initializer(config)) == count_params(initializer(t5_config("t5_1_1_tiny"))) + extra == params


def test_switch_tiny_tree_and_config_errors(t5_config):
    config = t5_config("switch_tiny")
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: EncoderDecoder(config).init(jax.random.key(0), tokens, tokens))["params"]
    for stack in ("encoder", "decoder"):
        assert "router" not in shapes[stack]["layers_0"]["mlp"]
        moe = shapes[stack]["layers_1"]["mlp"]
        assert moe["router"].names == ("embed", "router_expert")
        assert moe["wi_0"].names == ("expert", "embed", "mlp") and moe["wi_0"].value.shape[0] == config.num_experts
        assert moe["wo"].names == ("expert", "mlp", "embed")
    with pytest.raises(ValueError, match="num_experts must be 0"):
        t5_config("switch_tiny", num_experts=1)
    with pytest.raises(ValueError, match="moe_top_k=5"):
        t5_config("switch_tiny", moe_top_k=5)
    with pytest.raises(ValueError, match="selects no layer"):
        t5_config("switch_tiny", moe_every=3)


def test_gpt2_moe_tiny_tree_count_and_config_errors(gin_config):
    config, dense = gin_config("gpt2_moe_tiny", GPT2Config), gin_config("gpt2_tiny", GPT2Config)
    assert (config.num_experts, config.moe_every, config.moe_top_k) == (4, 2, 1)
    shapes = jax.eval_shape(initializer(config))
    assert set(shapes["layers_0"]["mlp"]) == {"wi", "wo"} and "bias" in shapes["layers_0"]["mlp"]["wi"]
    moe = shapes["layers_1"]["mlp"]
    assert moe["router"].names == ("embed", "router_expert") and moe["router"].value.shape == (64, 4)
    assert moe["wi"].names == ("expert", "embed", "mlp") and moe["wi"].value.shape == (4, 64, 256)
    assert moe["wo"].names == ("expert", "mlp", "embed")
    # Layer 1's biased MLP (64x256 + 256 + 256x64 + 64) becomes 4 bias-free experts and a 64x4 router.
    dense_mlp, moe_mlp = 2 * 64 * 256 + 256 + 64, 4 * 2 * 64 * 256 + 64 * 4
    assert count_params(initializer(config)) == count_params(initializer(dense)) - dense_mlp + moe_mlp == 345_792
    with pytest.raises(ValueError, match="GPT2Config.moe_top_k=5"):
        gin_config("gpt2_moe_tiny", GPT2Config, moe_top_k=5)
    with pytest.raises(ValueError, match="GPT2Config.moe_every=3 selects no layer"):
        gin_config("gpt2_moe_tiny", GPT2Config, moe_every=3)


def test_moe_config_refuses_export_to_hugging_face(gin_config):
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_gpt2, hf_t5

    dense = T5Config(
        vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2,
        num_decoder_layers=2, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
    )
    hf_t5.to_hf_config(dense)  # a dense config exports
    with pytest.raises(ValueError, match="num_experts=4"):
        hf_t5.to_hf_config(dataclasses.replace(dense, num_experts=4))
    hf_gpt2.to_hf_config(gin_config("gpt2_tiny", GPT2Config))
    with pytest.raises(ValueError, match="GPT2Config.num_experts=4"):
        hf_gpt2.to_hf_config(gin_config("gpt2_moe_tiny", GPT2Config))
