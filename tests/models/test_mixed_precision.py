"""bf16 matmuls accumulate in float32, forward and backward (ptmjax/layers/mixed_precision.py).

The einsum and its gradients against float64 numpy on the same bf16-rounded inputs; the backward
pass's dots take bf16 operands only; float32, and bf16 off the CPU, is plain `jnp.einsum` / `lax.dot_general`;
bf16 T5 and GPT-2 track their float32 selves, and one bf16 training step on (data=2, fsdp=2,
tensor=2), with scanned and rematerialised layers, equals the step on one device; the remat policy
'save_dot_products' still keeps the weight matmuls' outputs; the MoE block's einsums likewise (expert mesh).
"""

import contextlib
import dataclasses
import io

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from layers.moe_options import MoeOptions

from ptmjax import partitioning
from ptmjax.families.model_api import model_api
from ptmjax.layers import mixed_precision
from ptmjax.layers.layer_stack import REMAT_POLICIES
from ptmjax.layers.moe import MoeBlock
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

# spec, shapes, and the backward einsums written out by hand (da, db), ellipsis spelt 'xy'
SPECS = {
    "matmul": ("ab,bc->ac", (5, 7), (7, 3), "ac,bc->ab", "ab,ac->bc"),
    "logits": ("bqhd,bhkd->bhqk", (2, 4, 3, 8), (2, 3, 5, 8), "bhqk,bhkd->bqhd", "bqhd,bhqk->bhkd"),
    "context": ("bhqk,bhkd->bqhd", (2, 3, 4, 5), (2, 3, 5, 8), "bqhd,bhkd->bhqk", "bhqk,bqhd->bhkd"),
    "experts": ("gecd,edf->gecf", (2, 3, 4, 8), (3, 8, 6), "gecf,edf->gecd", "gecd,gecf->edf"),
    "attend": ("...e,ve->...v", (2, 3, 8), (11, 8), "xyv,ve->xye", "xye,xyv->ve"),
}


def bf16_normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.bfloat16)


def f64(x: jax.Array) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32), np.float64)


def assert_bf16_close(got: jax.Array, want: np.ndarray) -> None:
    """Within bf16's rounding of each entry (2^-8 relative) plus float32 accumulation."""
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(f64(got), want, rtol=2**-8, atol=1e-5 * np.max(np.abs(want)))


def dots(jaxpr) -> list:
    """Every dot_general in a jaxpr, its sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        found += [eqn] if eqn.primitive.name == "dot_general" else []
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr | jax.extend.core.Jaxpr):
                    found += dots(getattr(sub, "jaxpr", sub))
    return found


def operand_dtypes(fn, *args) -> set:
    return {tuple(str(v.aval.dtype) for v in eqn.invars) for eqn in dots(jax.make_jaxpr(fn)(*args).jaxpr)}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_bf16_einsum_and_gradients_match_float64(name):
    spec, a_shape, b_shape, da_spec, db_spec = SPECS[name]
    a, b = bf16_normal(0, a_shape), bf16_normal(1, b_shape)
    out, vjp = jax.vjp(jax.jit(lambda a, b: mixed_precision.einsum(spec, a, b)), a, b)
    explicit = spec.replace("...", "xy")
    assert_bf16_close(out, np.einsum(explicit, f64(a), f64(b)))
    g = bf16_normal(2, out.shape)
    da, db = vjp(g)
    assert_bf16_close(da, np.einsum(da_spec, f64(g), f64(b)))
    assert_bf16_close(db, np.einsum(db_spec, f64(a), f64(g)))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_bf16_backward_dots_take_bf16_operands_only(name):
    spec, a_shape, b_shape = SPECS[name][:3]
    a, b = bf16_normal(0, a_shape), bf16_normal(1, b_shape)

    def loss(einsum):
        return jax.grad(lambda a, b: jnp.sum(einsum(a, b).astype(jnp.float32) ** 2), (0, 1))

    got = operand_dtypes(loss(lambda a, b: mixed_precision.einsum(spec, a, b)), a, b)
    assert got == {("bfloat16", "bfloat16")}
    # plain autodiff of a float32-output dot: a float32 cotangent meets a bf16 operand
    plain = operand_dtypes(loss(lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)), a, b)
    assert ("float32", "bfloat16") in plain or ("bfloat16", "float32") in plain
    preferred = {
        eqn.params["preferred_element_type"]
        for eqn in dots(jax.make_jaxpr(loss(lambda a, b: mixed_precision.einsum(spec, a, b)))(a, b).jaxpr)
    }
    assert preferred == {np.dtype("float32")}


def test_dot_general_matches_float64_in_bf16_and_is_lax_dot_general_in_float32():
    """Batch dims, two contracting dims in either order, free dims on both sides."""
    a, b = bf16_normal(0, (3, 4, 5, 6)), bf16_normal(1, (6, 3, 2, 4))
    numbers = (((1, 3), (3, 0)), ((0,), (1,)))
    out, vjp = jax.vjp(lambda a, b: mixed_precision.dot_general(a, b, numbers), a, b)
    assert_bf16_close(out, np.einsum("bced,dbfc->bef", f64(a), f64(b)))
    g = bf16_normal(2, out.shape)
    da, db = vjp(g)
    assert_bf16_close(da, np.einsum("bef,dbfc->bced", f64(g), f64(b)))
    assert_bf16_close(db, np.einsum("bced,bef->dbfc", f64(a), f64(g)))
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    np.testing.assert_array_equal(mixed_precision.dot_general(a, b, numbers), jax.lax.dot_general(a, b, numbers))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_float32_is_plain_einsum_bit_for_bit(name):
    spec, *shapes = SPECS[name][:3]
    a, b = (np.random.default_rng(seed).standard_normal(shape).astype(np.float32) for seed, shape in enumerate(shapes))

    def value_and_grads(einsum):
        return jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(jnp.sin(einsum(spec, a, b))), (0, 1)))(a, b)

    jax.tree.map(np.testing.assert_array_equal, value_and_grads(mixed_precision.einsum), value_and_grads(jnp.einsum))
    # a float32 operand makes it plain einsum too (bf16 promoted as jnp.einsum promotes)
    np.testing.assert_array_equal(
        mixed_precision.einsum(spec, a, jnp.asarray(b, jnp.bfloat16)), jnp.einsum(spec, a, jnp.asarray(b, jnp.bfloat16))
    )


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_bf16_off_the_cpu_is_plain_einsum_and_dot_general(monkeypatch, platform):
    """TPUs and GPUs accumulate bf16 matmuls in float32 themselves: their layers get the plain dots."""
    monkeypatch.setattr(mixed_precision, "target_platform", lambda: platform)
    spec, a_shape, b_shape = SPECS["logits"][:3]
    a, b = bf16_normal(0, a_shape), bf16_normal(1, b_shape)
    einsum = jax.make_jaxpr(lambda a, b: mixed_precision.einsum(spec, a, b))(a, b)
    assert str(einsum) == str(jax.make_jaxpr(lambda a, b: jnp.einsum(spec, a, b))(a, b))
    numbers = (((3,), (3,)), ((0,), (0,)))
    dot = jax.make_jaxpr(lambda a, b: mixed_precision.dot_general(a, b, numbers))(a, b)
    assert str(dot) == str(jax.make_jaxpr(lambda a, b: jax.lax.dot_general(a, b, numbers))(a, b))
    assert "custom_vjp" not in str(einsum) + str(dot)


@pytest.mark.parametrize("spec, a_shape, b_shape", [
    ("ab,bc->a", (2, 3), (3, 4)),  # c summed within b
    ("aa,ab->b", (2, 2), (2, 3)),  # repeated index
    ("ab,bc", (2, 3), (3, 4)),  # implicit output
    ("...a,a->a", (2, 3), (3,)),  # ellipsis summed away
    ("...a,...a->...", (2, 3), (3,)),  # ellipsis of different lengths (broadcasting)
    ("ab,bc->ac", (2, 3), (4, 5)),  # b has two sizes
])
def test_unsupported_specs_are_refused_by_name(spec, a_shape, b_shape):
    with pytest.raises(ValueError, match=f"cannot take spec '{spec.replace('.', '[.]')}'"):
        mixed_precision.einsum(spec, jnp.ones(a_shape, jnp.bfloat16), jnp.ones(b_shape, jnp.bfloat16))


T5 = T5Config(
    vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=True, dropout_rate=0.0,
)  # tied: the logits are Embed.attend
GPT = GPT2Config(vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0)
ROWS, LENGTH = 4, 12


def token_batch(config, rows: int = ROWS) -> dict[str, jax.Array]:
    rng = np.random.default_rng(3)
    names = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")
    names = names if isinstance(config, T5Config) else names[1:]
    return {n: jnp.asarray(rng.integers(1, config.vocab_size, (rows, LENGTH)), jnp.int32) for n in names}


def loss_and_grads(config, dtype: str):
    model = (EncoderDecoder if isinstance(config, T5Config) else GPT2)(dataclasses.replace(config, dtype=dtype))
    api = model_api(model)
    params = jax.tree.map(lambda box: box.value, api.init(jax.random.key(0)), is_leaf=lambda x: hasattr(x, "value"))
    batch = token_batch(config)
    inputs = {k: v for k, v in batch.items() if k != "decoder_target_tokens"}

    def loss(params):
        logits = api.family.target_logits(model.apply({"params": params}, **inputs)).astype(jnp.float32)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["decoder_target_tokens"]))

    return jax.jit(jax.value_and_grad(loss))(params), (loss, params)


@pytest.mark.parametrize("config", [T5, GPT], ids=["t5", "gpt2"])
def test_bf16_model_tracks_float32_and_its_backward_dots_are_bf16(config):
    (want_loss, want_grads), _ = loss_and_grads(config, "float32")
    (got_loss, got_grads), (loss, params) = loss_and_grads(config, "bfloat16")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-3)  # measured 1.8e-4 (T5), 1.4e-5 (GPT-2)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    # measured 1.8e-2 (T5), 9.9e-3 (GPT-2) of the largest gradient entry
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=3e-2 * scale), got_grads, want_grads)
    assert operand_dtypes(jax.grad(loss), params) == {("bfloat16", "bfloat16")}


def sharded_step(config, mesh_config: MeshConfig, single_device: bool, rows: int = ROWS):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    model = (EncoderDecoder if isinstance(config, T5Config) else GPT2)(config)
    schedule = optax.constant_schedule(0.1)
    trainer = Trainer(model, optax.sgd(schedule), schedule, mesh, mesh_config.rules)
    state = trainer.init_state(jax.random.key(0))
    batch = {**token_batch(config, rows), "decoder_loss_weights": jnp.ones((rows, LENGTH), jnp.int32)}
    state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
    return float(metrics["loss"]), jax.device_get(state.params)


@pytest.mark.parametrize("config", [T5, GPT], ids=["t5", "gpt2"])
@pytest.mark.slow
def test_bf16_step_sharded_with_scan_and_remat_equals_one_device(config):
    config = dataclasses.replace(config, dtype="bfloat16", scan_layers=True, remat_policy="save_dot_products")
    want_loss, want_params = sharded_step(config, MeshConfig(), single_device=True)
    loss, params = sharded_step(config, MeshConfig(data=2, fsdp=2, tensor=2), single_device=False)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)  # measured 1.0e-7 (T5), 2.3e-7 (GPT-2)
    # measured: parameters within 9.8e-5 (T5), 6.5e-5 (GPT-2) absolute after the step
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4), params, want_params)


def test_save_dot_products_keeps_the_bf16_weight_matmuls_only():
    """The layer stacks' 'save_dot_products' keeps a bf16 weight matmul's output (bf16, as a plain dot's) and
    recomputes the attention einsum (batch dims), as it does for plain einsums."""
    x, w, k = bf16_normal(0, (2, 4, 8)), bf16_normal(1, (8, 6)), bf16_normal(2, (2, 5, 6))

    def layer(x, w, k, einsum):
        h = jnp.tanh(einsum("bqe,ef->bqf", x, w))
        return jnp.sum(jnp.tanh(einsum("bqf,bkf->bqk", h, k)).astype(jnp.float32))

    def saved(einsum):
        policy = REMAT_POLICIES["save_dot_products"]
        fn = jax.checkpoint(lambda x, w, k: layer(x, w, k, einsum), policy=policy)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            jax.ad_checkpoint.print_saved_residuals(fn, x, w, k)
        return [line.split()[0] for line in printed.getvalue().splitlines()]

    want = ["bf16[2,4,8]", "bf16[8,6]", "bf16[2,5,6]", "bf16[2,4,6]"]  # x, w, k and x @ w
    assert saved(jnp.einsum) == want
    assert saved(mixed_precision.einsum) == want


def moe_output_and_grads(dtype: str, x: jax.Array):
    """A top-2 MoE block (capacity path, nothing dropped) on x; its output and gradients, and the loss."""
    options = MoeOptions(num_experts=4, moe_top_k=2, moe_eval_capacity_factor=4.0)
    module = MoeBlock(options, 24, ("gelu", "linear"), dtype=jnp.dtype(dtype))
    params = jax.tree.map(lambda box: box.value, module.init(jax.random.key(0), x)["params"],
                          is_leaf=lambda v: hasattr(v, "value"))
    weights = jnp.asarray(np.random.default_rng(4).standard_normal(x.shape), jnp.float32)

    def loss(params, x):
        out = module.apply({"params": params}, x, mutable=["intermediates", "losses"])[0]
        return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(params, x)
    return out, grads, (loss, params)


def test_bf16_moe_experts_track_float32_and_their_backward_dots_are_bf16():
    """The same bf16-rounded tokens, so the float32 router routes them alike in both."""
    x = bf16_normal(5, (3, 10, 16))
    want, want_grads, _ = moe_output_and_grads("float32", x.astype(jnp.float32))
    got, got_grads, (loss, params) = moe_output_and_grads("bfloat16", x)
    np.testing.assert_allclose(f64(got), want, atol=2e-2 * float(jnp.max(jnp.abs(want))))  # measured 5.5e-3
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    # measured 9.7e-3 of the largest gradient entry
    jax.tree.map(lambda g, w: np.testing.assert_allclose(f64(g), w, atol=2e-2 * scale), got_grads, want_grads)
    # the router stays float32 x float32; every other dot is bf16 x bf16
    dtypes = operand_dtypes(jax.grad(lambda p, x: loss(p, x)[0], (0, 1)), params, x)
    assert dtypes == {("bfloat16", "bfloat16"), ("float32", "float32")}


@pytest.mark.slow
def test_bf16_moe_step_on_the_expert_mesh_equals_one_device():
    """Top-2 experts in every layer, 8 experts over (expert=8)."""
    config = dataclasses.replace(T5, dtype="bfloat16", num_experts=8, moe_every=1, moe_top_k=2)
    want_loss, want_params = sharded_step(config, MeshConfig(), single_device=True, rows=8)
    loss, params = sharded_step(config, MeshConfig(expert=8), single_device=False, rows=8)
    # measured 1.6e-4 relative and parameters within 2.0e-4 absolute after the step, as before the einsums
    # accumulated in float32 (the bf16 expert-side partial sums meet in a different order)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-3)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-3, atol=5e-4), params, want_params)
