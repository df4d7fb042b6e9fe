"""LAMB and LARS: each update equals a float64 NumPy computation of the paper's formula, biases and norms get
neither weight decay nor trust ratio, a scanned model's update equals the unscanned one's (trust ratios per
layer), and `train.optimizer = @lamb` / `@lars` trains the GPT-2 demo."""

import dataclasses
import json

import gin
import jax
import numpy as np
import optax
import pytest

from ptmjax import gin_files
from ptmjax.families.model_api import model_api
from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import GPT2, GPT2Config
from ptmjax.training import run
from ptmjax.training.optimizers import adamw, lamb, lars, on_unscanned_layout, weights_not_biases_or_norms

LR, WD, STEPS = 0.1, 0.3, 3
# Weights, biases and norms, and a zero kernel whose trust ratio must be 1 (||w|| = 0).
SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)}, "layer_norm": {"scale": (4,), "bias": (4,)},
          "embedder": {"embedding": (5, 3)}, "zero": {"kernel": (2, 2)}}
WEIGHTS = {"dense/kernel", "embedder/embedding", "zero/kernel"}


def tree(seed: int, scale: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    out = {m: {n: scale * rng.standard_normal(s) for n, s in leaves.items()} for m, leaves in SHAPES.items()}
    out["zero"]["kernel"] = np.zeros((2, 2)) if seed == 0 else out["zero"]["kernel"]
    return out


def flat(t: dict) -> dict:
    return {f"{m}/{n}": np.asarray(v, np.float64) for m, leaves in t.items() for n, v in leaves.items()}


def optax_run(tx) -> dict:
    """`STEPS` updates in float64 (in float32, Adam's bias correction 1 - 0.999^t alone is off by 1e-4)."""
    with jax.enable_x64(True):
        params = tree(0)
        state = tx.init(params)
        for step in range(STEPS):
            updates, state = tx.update(tree(step + 1, 0.1), state, params)
            params = optax.apply_updates(params, updates)
        return flat(params)


def trust_ratio(w: np.ndarray, u: np.ndarray, coefficient: float = 1.0) -> float:
    norm_w, norm_u = np.linalg.norm(w), np.linalg.norm(u)
    return 1.0 if norm_w == 0 or norm_u == 0 else coefficient * norm_w / norm_u


def numpy_adam(step, b1=0.9, b2=0.999, eps=1e-6) -> dict:
    """`STEPS` float64 updates `w[k] <- w[k] - LR * step(k, w[k], u)`, u Adam's bias-corrected direction."""
    w = flat(tree(0))
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    for t in range(1, STEPS + 1):
        g = flat(tree(t, 0.1))
        for k in w:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            w[k] = w[k] - LR * step(k, w[k], (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps))
    return w


def numpy_lamb() -> dict:
    """You et al. 2020, Algorithm 2 with Adam's bias correction, in float64."""
    def step(k, w, u):
        return trust_ratio(w, u + WD * w) * (u + WD * w) if k in WEIGHTS else u
    return numpy_adam(step)


def numpy_lars(momentum=0.9, coefficient=0.001) -> dict:
    """You et al. 2017, Algorithm 1 (the local rate folded into the update before momentum), in float64."""
    w = flat(tree(0))
    velocity = {k: np.zeros_like(x) for k, x in w.items()}
    for t in range(1, STEPS + 1):
        g = flat(tree(t, 0.1))
        for k in w:
            u = g[k]
            if k in WEIGHTS:
                u = u + WD * w[k]
                u = trust_ratio(w[k], u, coefficient) * u
            velocity[k] = momentum * velocity[k] + LR * u
            w[k] = w[k] - velocity[k]
    return w


def test_mask_selects_weights_not_biases_or_norms():
    assert {k for k, v in flat(weights_not_biases_or_norms(tree(0))).items() if v} == WEIGHTS


@pytest.mark.parametrize("optimizer, reference", [
    (lambda: lamb(LR, weight_decay=WD, max_grad_norm=None), numpy_lamb),
    (lambda: lars(LR, weight_decay=WD), numpy_lars),
], ids=["lamb", "lars"])
def test_update_equals_the_papers_formula_in_float64(optimizer, reference):
    got, want, start = optax_run(optimizer()), reference(), flat(tree(0))
    for k in want:
        assert not np.allclose(want[k], start[k]), f"{k} did not move; the comparison would prove nothing"
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-14, err_msg=k)
    # The zero kernel moved, so its trust ratio was 1, not 0.
    assert np.abs(got["zero/kernel"]).max() > 1e-3


def test_excluding_biases_and_norms_changes_the_update():
    """optax.lamb applies decay and trust ratio to every tensor; ours must differ exactly on biases and norms."""
    ours = optax_run(lamb(LR, weight_decay=WD, max_grad_norm=None))
    everywhere = optax_run(optax.lamb(LR, weight_decay=WD, eps=1e-6))
    same = {k for k in ours if np.allclose(ours[k], everywhere[k], rtol=1e-12, atol=1e-14)}
    assert same == WEIGHTS



def numpy_adamw(decayed: set[str]) -> dict:
    """Loshchilov and Hutter's AdamW (decoupled decay, scaled by the rate as optax does) in float64; only the
    leaves in `decayed` decay."""
    return numpy_adam(lambda k, w, u: u + (WD * w if k in decayed else 0.0), eps=1e-8)


@pytest.mark.parametrize("decay_biases_and_norms", [True, False])
def test_adamw_decays_biases_and_norms_only_when_asked(decay_biases_and_norms):
    got = optax_run(adamw(LR, weight_decay=WD, max_grad_norm=None, decay_biases_and_norms=decay_biases_and_norms))
    want = numpy_adamw(set(flat(tree(0))) if decay_biases_and_norms else WEIGHTS)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-14, err_msg=k)

PLAIN = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=3, d_ff=32, max_length=16,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
SCANNED = dataclasses.replace(PLAIN, scan_layers=True)


@pytest.mark.parametrize("optimizer", [lambda: lamb(LR, weight_decay=0.01), lambda: lars(LR, weight_decay=0.01)],
                         ids=["lamb", "lars"])
@pytest.mark.slow
def test_scanned_update_equals_unscanned_update(optimizer):
    """The trainer hands a scanned model's optimizer the unscanned layout: one trust ratio per layer's tensor."""
    rng = np.random.default_rng(0)
    plain_abstract = model_api(GPT2(PLAIN)).abstract_params
    params = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), plain_abstract)
    for i in range(PLAIN.num_layers):  # layers of unequal scale: unequal trust ratios,
        params[f"layers_{i}"] = jax.tree.map(lambda x, factor=i + 1: factor * x, params[f"layers_{i}"])
    grads = [jax.tree.map(lambda a: 0.1 * rng.standard_normal(a.shape).astype(np.float32), plain_abstract)
             for _ in range(2)]
    for i in range(PLAIN.num_layers):  # and unequal gradients, so that no ratio is the same per layer
        for g in grads:
            g[f"layers_{i}"] = jax.tree.map(lambda x, factor=i + 1: x / factor**2, g[f"layers_{i}"])

    def two_steps(tx, to_layout, from_layout):
        p = to_layout(params)
        state = tx.init(p)
        for g in grads:
            updates, state = tx.update(to_layout(g), state, p)
            p = optax.apply_updates(p, updates)
        return from_layout(p)

    identity = lambda t: t  # noqa: E731
    want = two_steps(optimizer(), identity, identity)
    got = two_steps(on_unscanned_layout(optimizer(), model_api(GPT2(SCANNED)).scanning),
                    lambda t: scan(t, SCANNED), lambda t: unscan(t, SCANNED))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7), got, want)
    # One trust ratio over the stacked [layers, ...] tensors would give other updates.
    stacked = two_steps(optimizer(), lambda t: scan(t, SCANNED), lambda t: unscan(t, SCANNED))
    error = jax.tree.map(lambda s, w, p: np.abs(s - w).max() / np.abs(w - p).max(), stacked, want, params)
    assert max(jax.tree.leaves(error)) > 0.1


@pytest.mark.slow  # two short demo runs (about 15 s each on 2 cores)
@pytest.mark.parametrize("optimizer, rate", [("lamb", 5e-2), ("lars", 5.0)])
def test_gin_optimizer_trains_the_gpt2_demo(tmp_path, optimizer, rate):
    bindings = [
        f"train.optimizer = @{optimizer}", f"warmup_cosine.peak_learning_rate = {rate}",
        "train.task_feature_lengths = {'targets': 32}", "train.batch_size = 8", "train.num_steps = 30",
        "train.log_every = 10", "train.eval_every = 30", "train.eval_batches = 1", "train.checkpoint_every = 30",
        "train.show_progress = False", "warmup_cosine.warmup_steps = 5", "warmup_cosine.total_steps = 30",
    ]
    gin_files.parse_gin(["runs/gpt2_demo.gin"], bindings)
    try:
        result = run.train(str(tmp_path))
    finally:
        gin.clear_config()
    with open(tmp_path / "metrics.jsonl") as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3, losses
    assert np.isfinite(result.eval_metrics["eval_loss"])
