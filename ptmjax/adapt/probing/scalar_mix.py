"""ELMo's scalar mix (Peters et al., 2018): a task's learned weighting of a frozen model's layers.

mix = gamma * sum_k softmax(w)_k * h_k over the representations h_0 (embeddings) ... h_L, with w
initialised to 0 (an even mix) and gamma to 1. With `layer_norm` every h_k is first normalised over
its non-padding elements (all of batch, length and width at once), as AllenNLP's ScalarMix does.
`MixClassifier` mean-pools the mix over the non-padding tokens into a linear classifier.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import precision

Array = jax.Array
LAYER_NORM_EPSILON = 1e-12


def masked_mean(values: Array, valid: Array) -> Array:
    """values [..., b, s, d], valid bool [b, s] -> the mean over each row's valid tokens [..., b, d]."""
    weights = jnp.asarray(valid, values.dtype)[..., None]  # [b, s, 1]
    return jnp.sum(values * weights, axis=-2) / jnp.maximum(jnp.sum(weights, axis=-2), 1.0)


class ScalarMix(nn.Module):
    """layers [n, b, s, d] (and valid bool [b, s] for the layer norm) -> the mix [b, s, d]."""

    num_representations: int
    layer_norm: bool = False

    @nn.compact
    def __call__(self, layers: Array, valid: Array | None = None) -> Array:
        if layers.shape[0] != self.num_representations:
            raise ValueError(f"ScalarMix of {self.num_representations} representations got {layers.shape[0]} "
                             "(the leading axis of layers); build it with num_representations=layers + 1")
        weights = jax.nn.softmax(self.param("weights", nn.initializers.zeros, (self.num_representations,)))
        gamma = self.param("gamma", nn.initializers.ones, ())
        if self.layer_norm:
            valid = jnp.ones(layers.shape[1:3], bool) if valid is None else valid
            layers = _masked_layer_norm(layers, valid)
        return gamma * precision.einsum("n,nbsd->bsd", weights, layers)


def _masked_layer_norm(layers: Array, valid: Array) -> Array:
    """Each representation [b, s, d] normalised by the mean and variance of its valid elements."""
    mask = jnp.asarray(valid, layers.dtype)[None, :, :, None]  # [1, b, s, 1]
    count = jnp.sum(mask) * layers.shape[-1]
    mean = jnp.sum(layers * mask, axis=(1, 2, 3), keepdims=True) / count
    variance = jnp.sum(((layers - mean) * mask) ** 2, axis=(1, 2, 3), keepdims=True) / count
    return (layers - mean) / jnp.sqrt(variance + LAYER_NORM_EPSILON)


class MixClassifier(nn.Module):
    """A scalar mix of the layers, mean-pooled over valid tokens, then a linear layer: logits [b, classes]."""

    num_representations: int
    num_classes: int
    layer_norm: bool = False

    @nn.compact
    def __call__(self, layers: Array, valid: Array) -> Array:
        mixed = ScalarMix(self.num_representations, self.layer_norm, name="scalar_mix")(layers, valid)
        return nn.Dense(self.num_classes, name="classifier")(masked_mean(mixed, valid))
