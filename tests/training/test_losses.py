"""Cross-entropy with label smoothing and z-loss, and its gradient, against a float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.families.token_loss import LossConfig, token_cross_entropy


def reference_loss(logits, targets, z_loss, label_smoothing):
    """Straight from the definitions, in float64."""
    logits = logits.astype(np.float64)
    vocab = logits.shape[-1]
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    log_probs = logits - log_z[..., None]
    soft = np.full(logits.shape, label_smoothing / (vocab - 1))
    np.put_along_axis(soft, targets[..., None], 1.0 - label_smoothing, axis=-1)
    entropy_of_target = -np.sum(np.where(soft > 0, soft * np.log(np.where(soft > 0, soft, 1)), 0), -1)
    cross_entropy = -np.sum(soft * log_probs, -1)
    return cross_entropy - entropy_of_target + z_loss * log_z**2, z_loss * log_z**2


@pytest.mark.parametrize("z_loss,label_smoothing", [(0.0, 0.0), (1e-4, 0.0), (1e-3, 0.1)])
def test_matches_float64_reference(z_loss, label_smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, size=(3, 5))
    loss, z = token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), z_loss, label_smoothing)
    want_loss, want_z = reference_loss(logits, targets, z_loss, label_smoothing)
    np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(z), want_z, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("z_loss,label_smoothing", [(0.0, 0.0), (1e-3, 0.1)])
def test_gradient_matches_float64_reference(z_loss, label_smoothing):
    """d/dlogits of sum(loss) = softmax * (1 + 2 z_loss log_z) - smoothed target, in float64."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, size=(3, 5))
    gradient = jax.grad(lambda x: jnp.sum(token_cross_entropy(x, jnp.asarray(targets), z_loss, label_smoothing)[0]))(
        jnp.asarray(logits)
    )
    x = logits.astype(np.float64)
    log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x.max(-1, keepdims=True)
    soft = np.full(x.shape, label_smoothing / 10)
    np.put_along_axis(soft, targets[..., None], 1.0 - label_smoothing, axis=-1)
    want = np.exp(x - log_z) * (1 + 2 * z_loss * log_z) - soft
    np.testing.assert_allclose(np.asarray(gradient), want, rtol=1e-5, atol=1e-6)


def test_perfect_prediction_scores_zero_with_label_smoothing():
    vocab, smoothing = 7, 0.2
    targets = np.array([[3]])
    # The logits whose softmax is exactly the smoothed target distribution.
    probs = np.full(vocab, smoothing / (vocab - 1))
    probs[3] = 1 - smoothing
    loss, _ = token_cross_entropy(jnp.log(jnp.asarray(probs))[None, None], jnp.asarray(targets), 0.0, smoothing)
    assert abs(float(loss[0, 0])) < 1e-5


@pytest.mark.parametrize("kwargs", [{"label_smoothing": 1.0}, {"z_loss": -1.0}, {"normalizing_factor": 0.0}])
def test_bad_loss_config_names_the_value(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        LossConfig(**kwargs)
