"""Training a scalar mix and a linear classifier on a frozen model's layer features.

The model runs once (`LayerReader`): its parameters never reach the optimizer, so only the mix
weights, gamma and the classifier train (full-batch Adam on the mean cross-entropy). `mix_probe` does so
on mean-pooled layers (`ptmjax probe`): without the layer norm, the mean of the mix is the mix of the
means (both are linear), so this is the `MixClassifier` of the whole rows.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class MixProbe:
    """A fitted scalar mix: its softmax-normalised layer weights and gamma, and accuracies (0-100)."""

    weights: list[float]
    gamma: float
    train_accuracy: float
    accuracy: float


def mix_probe(
    train: np.ndarray, train_labels: np.ndarray, validation: np.ndarray, validation_labels: np.ndarray,
    steps: int = 300, learning_rate: float = 0.05,
) -> MixProbe:
    """Mean-pooled layers, train [layers + 1, n, d] and validation [layers + 1, m, d] -> the fitted mix."""
    num_classes = int(max(train_labels.max(), validation_labels.max())) + 1
    rows = {"train": train[:, :, None], "validation": validation[:, :, None]}  # one pooled "token" a row
    valid = {split: np.ones(x.shape[1:3], bool) for split, x in rows.items()}
    params, _ = fit_mix_classifier(rows["train"], valid["train"], train_labels, num_classes, steps, learning_rate)
    head = MixClassifier(train.shape[0], num_classes)

    def accuracy(split: str, labels: np.ndarray) -> float:
        logits = head.apply({"params": params}, jnp.asarray(rows[split], jnp.float32), jnp.asarray(valid[split]))
        return 100.0 * float(np.mean(np.asarray(logits).argmax(-1) == labels))

    mix = params["scalar_mix"]
    return MixProbe(np.asarray(jax.nn.softmax(mix["weights"])).tolist(), float(mix["gamma"]),
                    accuracy("train", train_labels), accuracy("validation", validation_labels))
