"""Training a scalar mix and a linear classifier on a frozen model's layer features.

The model runs once (`LayerReader`): its parameters never reach the optimizer, so only the mix
weights, gamma and the classifier train (full-batch Adam on the mean cross-entropy).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ptmjax.adapt.probing.scalar_mix import MixClassifier


def fit_mix_classifier(
    layers: np.ndarray, valid: np.ndarray, labels: np.ndarray, num_classes: int, steps: int = 100,
    learning_rate: float = 0.05, layer_norm: bool = False, seed: int = 0,
) -> tuple[Any, np.ndarray]:
    """layers [n, b, s, d], valid bool [b, s], labels int [b] -> (the head's parameters, loss before each step)."""
    head = MixClassifier(layers.shape[0], num_classes, layer_norm)
    layers, valid, labels = jnp.asarray(layers, jnp.float32), jnp.asarray(valid), jnp.asarray(labels)
    params = head.init(jax.random.key(seed), layers, valid)["params"]
    optimizer = optax.adam(learning_rate)

    def loss_fn(p: Any) -> jax.Array:
        logits = head.apply({"params": p}, layers, valid)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(p: Any, state: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    state, losses = optimizer.init(params), []
    for _ in range(steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return params, np.asarray(losses)
