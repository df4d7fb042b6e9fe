"""SpanBERT's span boundary head and loss against float64 NumPy of the paper's formula, and its demo run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_runs import train_from_cli
from flax import linen as nn
from scipy.special import erf

from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import BertConfig, SpanBert

CONFIG = BertConfig(vocab_size=50, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, nsp_head=False,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
MAX_POSITIONS = 4


def batch() -> dict[str, np.ndarray]:
    """Two rows of 12: spans 2..4 and 6..10 (its position 5 lies past the table), and 3..3 and 6..7."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 50, size=(2, 12)).astype(np.int32)
    loss_mask = np.zeros((2, 12), np.int32)
    left, right, position = (np.zeros((2, 12), np.int32) for _ in range(3))
    for row, (start, end) in [(0, (2, 4)), (0, (6, 10)), (1, (3, 3)), (1, (6, 7))]:
        loss_mask[row, start:end + 1] = 1
        left[row, start:end + 1], right[row, start:end + 1] = start - 1, end + 1
        position[row, start:end + 1] = np.arange(1, end - start + 2)
    loss_mask[1, 0] = 1  # a selected token at the row's edge: MLM only
    inputs = np.where(loss_mask == 1, 49, tokens)
    return {"input_tokens": inputs, "target_tokens": tokens, "loss_mask": loss_mask, "span_left": left,
            "span_right": right, "span_position": position}


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def layer_norm(x, p, eps=1e-12):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def numpy_sbo_logits(params, hidden, b):
    """float64 NumPy of h = LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}])), y = LN(GeLU(W2 h)), y E^T + bias."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    head, table = p["span_boundary_head"], p["embeddings"]["token_embedder"]["embedding"]
    rows = np.arange(hidden.shape[0])[:, None]
    position_table = head["position_embedder"]["embedding"]
    h0 = np.concatenate([hidden[rows, b["span_left"]], hidden[rows, b["span_right"]],
                         position_table[np.clip(b["span_position"] - 1, 0, MAX_POSITIONS - 1)]], axis=-1)
    w1 = head["dense_1"]["kernel"].reshape(3 * CONFIG.d_model, CONFIG.d_model)
    h = layer_norm(gelu(h0 @ w1 + head["dense_1"]["bias"]), head["layer_norm_1"])
    y = layer_norm(gelu(h @ head["dense_2"]["kernel"] + head["dense_2"]["bias"]), head["layer_norm_2"])
    return y @ table.T + head["bias"]


@pytest.fixture(scope="module")
def model_and_params():
    model = SpanBert(CONFIG, max_span_positions=MAX_POSITIONS)
    return model, nn.unbox(model_api(model).init(jax.random.key(0)))


def test_sbo_logits_and_loss_equal_float64_numpy(model_and_params):
    model, params = model_and_params
    b = batch()
    out = model.apply({"params": params}, **{k: b[k] for k in ("input_tokens", "span_left", "span_right",
                                                               "span_position")})
    hidden = np.asarray(model.apply({"params": params}, b["input_tokens"], method="encode"), np.float64)
    sbo_logits = numpy_sbo_logits(params, hidden, b)
    on_span = (b["span_position"] >= 1) & (b["span_position"] <= MAX_POSITIONS)
    np.testing.assert_array_equal(out.span_boundary_weights, on_span)
    np.testing.assert_allclose(np.where(on_span[..., None], out.span_boundary_logits, 0),
                               np.where(on_span[..., None], sbo_logits, 0), atol=2e-5)

    targets, weights = b["target_tokens"], b["loss_mask"].astype(np.float64)
    nll = lambda logits: -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]  # noqa: E731
    mlm, sbo = nll(np.asarray(out.mlm_logits, np.float64)), nll(sbo_logits)
    sbo_weights = weights * on_span
    want = (np.sum(mlm * weights) + np.sum(sbo * sbo_weights)) / weights.sum()
    token_loss, batch_loss, stats = model_api(model).loss(params, {k: jnp.asarray(v) for k, v in b.items()},
                                                          LossConfig(z_loss=0.0))
    metrics = jax.device_get(stats.metrics())
    assert sbo_weights.sum() == 10 and weights.sum() == 12  # 1 past the table, 1 at the edge: MLM only
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)
    np.testing.assert_allclose(token_loss, want * weights.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["sbo_loss"], np.sum(sbo * sbo_weights) / sbo_weights.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["mlm_loss"], np.sum(mlm * weights) / weights.sum(), rtol=1e-5)
    assert float(batch_loss) == 0.0


def test_the_sbo_head_shares_the_token_table_and_refuses_nsp(model_and_params):
    model, params = model_and_params
    assert "decoder" not in params["span_boundary_head"]  # logits against embeddings/token_embedder
    assert params["span_boundary_head"]["dense_1"]["kernel"].shape == (3, 16, 16)
    with pytest.raises(ValueError, match="nsp_head = False"):
        model_api(SpanBert(BertConfig(vocab_size=50, d_model=16, num_heads=2, num_layers=1, d_ff=32))).init(
            jax.random.key(0))


@pytest.mark.slow  # a gin training run from the CLI
def test_spanbert_demo_trains_from_the_cli(tmp_path):
    records = train_from_cli("runs/spanbert_demo.gin", tmp_path, 6)
    train = [r for r in records if "sbo_loss" in r]
    assert len(train) == 3 and all(np.isfinite([r["loss"], r["mlm_loss"], r["sbo_loss"]]).all() for r in train)
    # loss = MLM + SBO per MLM token; the SBO leaves out spans at a row's edge, so its share is at most its mean.
    assert all(r["mlm_loss"] + 1.0 < r["loss"] <= r["mlm_loss"] + r["sbo_loss"] + 1e-4 for r in train), train
    assert any("eval_sbo_loss" in r for r in records)
