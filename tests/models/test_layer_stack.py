"""Remat and scan over layers do not change the numbers; the scanned parameter layout and its conversion.

The reference is the plain model (unscanned, no remat) with the same weights:
its parameters are converted with `layer_stack.scan` for a scanned model.
Both models have MoE every other layer, so a scan step is a period of two
layers, and the loss includes the MoE auxiliary losses. (Each variant costs a
compile, so the two models split the options; tests/training/test_moe_training.py
trains a scanned, fully rematerialised GPT-2 on 8 devices.)
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import (
    GPT2,
    Albert,
    AlbertConfig,
    Bart,
    BartConfig,
    Bert,
    BertConfig,
    ElectraConfig,
    ElectraPretraining,
    ElectraPretrainingConfig,
    EncoderDecoder,
    GPT2Config,
    T5Config,
)

T5 = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=4, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0, num_experts=4, moe_every=2,
)
GPT = GPT2Config(
    vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=8, dropout_rate=0.0,
    attention_dropout_rate=0.0, num_experts=4, moe_every=2, moe_top_k=2,
)
CONFIGS = {"t5": T5, "gpt2": GPT}


def model_of(config):
    return EncoderDecoder(config) if isinstance(config, T5Config) else GPT2(config)


def batch_of(config) -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    tokens = lambda length: jnp.asarray(rng.integers(1, config.vocab_size, (2, length)), jnp.int32)  # noqa: E731
    if isinstance(config, T5Config):
        return {"encoder_input_tokens": tokens(8), "decoder_input_tokens": tokens(4)}
    return {"decoder_input_tokens": tokens(8)}


def loss(config, params, batch) -> tuple[jax.Array, jax.Array]:
    """Mean log-likelihood of the next (random) token plus the sown MoE losses, in training mode; and the logits."""
    logits, sown = model_of(config).apply({"params": params}, **batch, enable_dropout=True, mutable=["losses"])
    targets = jnp.roll(jnp.arange(logits.shape[1]), -1) % config.vocab_size
    nll = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[None, :, None], -1))
    return nll + sum(jnp.sum(x) for x in jax.tree.leaves(sown["losses"])), logits


@functools.lru_cache(maxsize=None)
def plain_params(name: str) -> dict:
    """N(0, 0.3^2) weights in the plain model's tree (drawn in numpy: running `init` costs a compile)."""
    config, rng = CONFIGS[name], np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: nn.unbox(model_of(config).init(jax.random.key(0), **batch_of(config))["params"]))
    return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), shapes)


@functools.lru_cache(maxsize=None)
def logits_and_grads(name: str, remat_policy: str = "none", scan_layers: bool = False):
    """Logits and parameter gradients (in the unscanned layout) of the plain weights under these options."""
    config = dataclasses.replace(CONFIGS[name], remat_policy=remat_policy, scan_layers=scan_layers)
    params = scan(plain_params(name), config) if scan_layers else plain_params(name)
    traced = jax.jit(jax.grad(functools.partial(loss, config), has_aux=True)).trace(params, batch_of(config))
    jaxpr = str(traced.jaxpr)
    assert ("checkpoint" in jaxpr or "remat" in jaxpr) == (remat_policy != "none")
    assert (" scan[" in jaxpr) == scan_layers
    grads, logits = traced.lower().compile()(params, batch_of(config))
    return np.asarray(logits), unscan(grads, config) if scan_layers else grads


@pytest.mark.parametrize(
    "name,remat_policy,scan_layers", [("t5", "save_dot_products", True), ("gpt2", "full", False)],
    ids=["t5_scan_remat_save_dot_products", "gpt2_remat_full"],
)
def test_remat_and_scan_keep_logits_and_gradients(name, remat_policy, scan_layers):
    want_logits, want_grads = logits_and_grads(name)
    logits, grads = logits_and_grads(name, remat_policy, scan_layers)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-6, atol=1e-6)  # measured: identical
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    # measured: at most 1.5e-8 apart, gradients up to 0.4
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7), grads, want_grads)
    assert np.abs(first_stack(want_grads)["layers_3"]["mlp"]["wo"]).max() > 0.0, "the last MoE layer should learn"


BART = BartConfig(vocab_size=64, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=3, d_ff=32,
                  max_length=16, pad_token_id=0, dropout_rate=0.0)
ALBERT = AlbertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=3, d_ff=32, max_length=16, embedding_size=8,
                      num_layer_groups=1, dropout_rate=0.0, attention_dropout_rate=0.0)
ENCODER_FAMILY = {  # BART and the encoder family; ALBERT shares one layer's parameters across its 3 layers
    "bart": (Bart, BART),
    "mbart": (Bart, dataclasses.replace(BART, pre_layer_norm=True, scale_embedding=True)),
    "bert": (Bert, BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                              dropout_rate=0.0, attention_dropout_rate=0.0)),
    "albert": (Albert, ALBERT),
    "albert_2_groups_of_2": (Albert, dataclasses.replace(ALBERT, num_layers=4, num_layer_groups=2)),
}
SLOW_SCANS = ("mbart", "bert")  # -m slow: their scanned stacks are BART's and ALBERT's, tested by default
ELECTRA = ElectraConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, embedding_size=8,
                        dropout_rate=0.0, attention_dropout_rate=0.0)


def gradient_gap(grads, want_grads) -> float:
    """The largest difference of two gradient trees, each array's relative to its largest entry (at least 1)."""
    gaps = jax.tree.map(lambda g, w: np.abs(g - w).max() / max(np.abs(w).max(), 1.0), grads, want_grads)
    return max(jax.tree.leaves(gaps))


@functools.lru_cache(maxsize=None)
def encoder_family_outputs_and_grads(name: str, remat_policy: str = "none", scan_layers: bool = False):
    """Outputs, and gradients in the unscanned layout, of `sum(sin(outputs))` at the plain model's init."""
    model_class, plain = ENCODER_FAMILY[name]
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 8)), jnp.int32)
    inputs = (tokens, tokens[:, :5]) if model_class is Bart else (tokens,)
    params = nn.unbox(jax.jit(model_class(plain).init)(jax.random.key(0), *inputs)["params"])
    config = dataclasses.replace(plain, remat_policy=remat_policy, scan_layers=scan_layers)
    model = model_class(config)
    if scan_layers:
        params = scan(params, config)
    objective = lambda p: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(model.apply({"params": p}, *inputs)))  # noqa: E731
    traced = jax.jit(jax.value_and_grad(objective)).trace(params)
    assert ("checkpoint" in str(traced.jaxpr) or "remat" in str(traced.jaxpr)) == (remat_policy != "none")
    assert (" scan[" in str(traced.jaxpr)) == scan_layers
    value, grads = traced.lower().compile()(params)
    outputs = jax.jit(model.apply)({"params": params}, *inputs)
    return float(value), jax.tree.leaves(outputs), unscan(grads, config) if scan_layers else grads


@pytest.mark.parametrize(
    "name,remat_policy,scan_layers",
    [("bart", "full", False), ("albert", "full", False),
     *(pytest.param(name, "none", True, marks=[pytest.mark.slow] if name in SLOW_SCANS else [])
       for name in ENCODER_FAMILY),
     ("bart", "full", True), ("albert_2_groups_of_2", "full", True)],
)
@pytest.mark.slow
def test_remat_and_scan_keep_bart_and_encoder_outputs_and_gradients(name, remat_policy, scan_layers):
    want_value, want_outputs, want_grads = encoder_family_outputs_and_grads(name)
    value, outputs, grads = encoder_family_outputs_and_grads(name, remat_policy, scan_layers)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    jax.tree.map(lambda o, w: np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5), outputs, want_outputs)
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    # Gradients reach ~20 here (BART's embedding), float32 sums of hundreds of terms that remat and scan
    # reorder: each array is compared relative to its largest entry.
    worst = gradient_gap(grads, want_grads)
    print(f"{name} remat={remat_policy} scan={scan_layers}: max gradient difference / scale = {worst:.1e}")
    assert worst < 1e-5


@pytest.mark.parametrize("name", ["bart", "albert_2_groups_of_2"])
def test_scan_of_bart_and_shared_encoder_layers_inverts(name):
    model_class, config = ENCODER_FAMILY[name]
    params = jax.tree.map(np.asarray, encoder_family_outputs_and_grads(name)[2])  # any tree of the plain layout
    scanned = scan(params, config)
    stacked = scanned["encoder"]["layers"] if model_class is Bart else scanned["layers"]
    depth = config.num_encoder_layers if model_class is Bart else config.num_layer_groups
    assert {x.shape[0] for x in jax.tree.leaves(stacked)} == {depth}
    jax.tree.map(np.testing.assert_array_equal, unscan(scanned, config), params)


@pytest.mark.slow
def test_joint_electra_scans_both_stacks():
    """The generator and the discriminator scan together; the joint model equals the plain one (samples too)."""
    discriminator = ELECTRA
    plain = ElectraPretrainingConfig(generator=dataclasses.replace(discriminator, d_model=8, num_heads=1),
                                     discriminator=discriminator)
    scanned = plain.with_scan_layers(True)
    assert (scanned.generator.scan_layers, scanned.discriminator.scan_layers, scanned.scan_layers) == (True,) * 3
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 8)), jnp.int32)
    mask = jnp.asarray(np.random.default_rng(1).random((2, 8)) < 0.3, jnp.int32)
    params = nn.unbox(jax.jit(ElectraPretraining(plain).init)(
        {"params": jax.random.key(0), "sample": jax.random.key(1)}, tokens, tokens, mask)["params"])

    def run(config, params):
        apply = lambda p: ElectraPretraining(config).apply({"params": p}, tokens, tokens, mask,  # noqa: E731
                                                           rngs={"sample": jax.random.key(2)})
        objective = lambda p: jnp.sum(jnp.sin(apply(p).discriminator_logits))  # noqa: E731
        return jax.jit(apply)(params), jax.jit(jax.grad(objective))(params)

    want_outputs, want_grads = run(plain, params)
    outputs, grads = run(scanned, scan(params, scanned))
    np.testing.assert_array_equal(outputs.is_replaced, want_outputs.is_replaced)
    np.testing.assert_allclose(outputs.discriminator_logits, want_outputs.discriminator_logits, rtol=1e-5, atol=1e-5)
    worst = gradient_gap(unscan(grads, scanned), want_grads)
    print(f"joint ELECTRA scanned: max gradient difference / scale = {worst:.1e}")
    assert worst < 1e-5
    with pytest.raises(ValueError, match="generator.scan_layers=True but discriminator.scan_layers=False"):
        ElectraPretrainingConfig(generator=scanned.generator, discriminator=discriminator)
def first_stack(tree: dict) -> dict:
    """The encoder stack of T5, the only stack of GPT-2."""
    return tree.get("encoder", tree)


@pytest.mark.parametrize("name", CONFIGS)
def test_scanned_tree_stacks_periods_on_a_layers_axis(name):
    config = CONFIGS[name]
    scanned_config = dataclasses.replace(config, scan_layers=True)
    batch = batch_of(config)
    boxed = jax.eval_shape(lambda: model_of(scanned_config).init(jax.random.key(0), **batch)["params"])
    plain = plain_params(name)
    converted = scan(plain, config)
    is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731
    assert jax.tree.map(np.shape, converted) == jax.tree.map(lambda b: b.value.shape, boxed, is_leaf=is_box)
    stacks = [boxed["encoder"], boxed["decoder"]] if name == "t5" else [boxed]
    depths = [config.num_encoder_layers, config.num_decoder_layers] if name == "t5" else [config.num_layers]
    for stack, depth in zip(stacks, depths, strict=True):
        assert not any(key.startswith("layers_") for key in stack)
        assert set(stack["layers"]) >= {"layers_0", "layers_1"}  # a period: dense layer, MoE layer
        assert "router" in stack["layers"]["layers_1"]["mlp"] and "router" not in stack["layers"]["layers_0"]["mlp"]
        for box in jax.tree.leaves(stack["layers"], is_leaf=is_box):
            assert box.names[0] == "layers" and box.value.shape[0] == depth // 2
    # The conversion is exact both ways and numpy stays numpy.
    host = jax.tree.map(np.asarray, plain)
    back = unscan(scan({"params": host}, config), config)["params"]
    jax.tree.map(np.testing.assert_array_equal, back, host)
    scanned_host = scan(host, config)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(scanned_host))
    # Step 1 of the scan is the second period: layers 2 and 3.
    np.testing.assert_array_equal(
        first_stack(scanned_host)["layers"]["layers_1"]["mlp"]["wo"][1], first_stack(host)["layers_3"]["mlp"]["wo"]
    )


def test_dense_scan_has_no_period_level():
    config = dataclasses.replace(GPT, num_experts=0, num_layers=3)
    tree = {f"layers_{i}": {"w": np.full((2,), i)} for i in range(3)} | {"decoder_norm": {"scale": np.ones(2)}}
    scanned = scan(tree, config)
    np.testing.assert_array_equal(scanned["layers"]["w"], [[0, 0], [1, 1], [2, 2]])
    assert set(scanned) == {"layers", "decoder_norm"}


def test_options_are_gin_selectable_and_checked():
    gin.clear_config()
    try:
        gin.parse_config(["GPT2Config.remat_policy = 'save_dot_products'", "GPT2Config.scan_layers = True"])
        config = GPT2Config(vocab_size=8, d_model=8, num_heads=2, num_layers=2, d_ff=8, max_length=4)
    finally:
        gin.clear_config()
    assert (config.remat_policy, config.scan_layers) == ("save_dot_products", True)
    with pytest.raises(ValueError, match="remat_policy='dots' is unknown"):
        dataclasses.replace(GPT, remat_policy="dots")
    with pytest.raises(ValueError, match="the encoder stack has 3 layers.*scan_layers=False"):
        dataclasses.replace(T5, num_encoder_layers=3, scan_layers=True)
    odd = dataclasses.replace(T5, num_encoder_layers=3)  # unscanned, any depth works, but it has no scanned layout
    with pytest.raises(ValueError, match="the encoder stack has 3 layers"):
        scan(plain_params("t5"), odd)
    with pytest.raises(ValueError, match="already scanned"):
        scan(scan(plain_params("gpt2"), GPT), GPT)
    with pytest.raises(ValueError, match="already unscanned"):
        unscan(plain_params("gpt2"), GPT)
