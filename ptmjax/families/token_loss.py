"""Token-level cross-entropy with label smoothing and z-loss."""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LossConfig:
    """How the per-token loss is formed and normalised.

    Attributes:
      z_loss: weight of `logsumexp(logits)**2`, keeping logits near zero.
      label_smoothing: probability mass spread over the other vocabulary ids.
      normalizing_factor: None divides the summed loss by the number of real
        target tokens in the (global, accumulated) batch; a number divides by
        that constant instead, as T5 did (e.g. 2048 * 114 = 233472).
      discriminator_weight: ELECTRA's weight of the replaced-token-detection
        loss against the generator's MLM loss (the paper's 50).
      logits_chunk_size: None computes all logits at once; a number of positions computes the
        output layer and the loss that many positions at a time, recomputing each chunk in the
        backward pass, so float32 logits never exist for the whole batch (T5, BART, GPT-2;
        ptmjax/families/chunked_logits.py).
      similarity_scale: a sentence encoder's MultipleNegativesRanking loss multiplies its cosine
        similarities by this (sentence-transformers' `scale`, 20: a temperature of 0.05).
    """

    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    normalizing_factor: float | None = None
    discriminator_weight: float = 50.0
    logits_chunk_size: int | None = None
    similarity_scale: float = 20.0

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.z_loss < 0:
            raise ValueError(f"z_loss must be >= 0, got {self.z_loss}")
        if self.normalizing_factor is not None and self.normalizing_factor <= 0:
            raise ValueError(f"normalizing_factor must be positive, got {self.normalizing_factor}")
        if self.discriminator_weight < 0:
            raise ValueError(f"discriminator_weight must be >= 0, got {self.discriminator_weight}")
        if not self.similarity_scale > 0:
            raise ValueError(f"similarity_scale must be > 0, got {self.similarity_scale}")
        if self.logits_chunk_size is not None and self.logits_chunk_size <= 0:
            raise ValueError(f"logits_chunk_size must be a positive number of positions, got {self.logits_chunk_size}")


def token_cross_entropy(
    logits: jax.Array, targets: jax.Array, z_loss: float = 0.0, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Per-token loss and z-loss terms, in float32.

    Args:
      logits: [batch, length, vocab].
      targets: [batch, length] integer ids.
    Returns:
      (loss, z) each [batch, length]; `loss` already includes the z-loss term.
      With label smoothing the loss is shifted by the entropy of the smoothed
      target, so that a perfect prediction scores zero.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    # -sum(soft * log_probs) with soft = one_hot * (confidence - low) + low summing to 1, written with the
    # target's logit gathered: no [..., vocab] one-hot product forward or backward (on XLA:CPU, GPT-2's
    # loss and its gradient took 354 against 513 ms, docs/performance_log.md). Out-of-range targets gather 0.
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1, mode="fill", fill_value=0.0)[..., 0]
    loss = log_z - (confidence - low) * target_logit
    if label_smoothing:
        entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
        loss = loss - low * jnp.sum(logits, axis=-1) - entropy
    z = z_loss * jnp.square(log_z)
    loss = loss + z
    return loss, z


def argmax_hits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """1.0 where the target is `jnp.argmax`'s choice, the first index of its logits' maximum; float32 [b, t].

    Written as "the target's logit is the maximum and no earlier index reaches it": on XLA:CPU that is a
    max, a gather and a boolean any, 2.2x faster than `jnp.argmax`'s reduction carrying indices (GPT-2's
    [4096, 50257] logits: 173 against 389 ms), and the max is the one `logsumexp` takes. Out-of-range
    targets never hit; NaN logits give no hits.
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1, mode="fill", fill_value=jnp.nan)
    positions = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    reached_before = jnp.any((logits == top) & (positions < targets[..., None]), axis=-1)
    return ((target_logit[..., 0] == top[..., 0]) & ~reached_before).astype(jnp.float32)
