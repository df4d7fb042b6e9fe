"""What a student is trained to match in a frozen teacher: the knowledge-distillation losses of DistilBERT,
TinyBERT, MiniLM and BERT-PKD.

Each loss takes the student's and the teacher's arrays for the same batch and returns one value per position
(or per example), float32, zero where the student matches the teacher; the objective weights them by the
batch's loss weights and sums them as it sums the token loss. Every loss treats the teacher as a constant
(its gradient is stopped).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ptmjax.families.chunked_logits import map_over_chunks
from ptmjax.layers import precision

Array = jax.Array


def _teacher(x: Array) -> Array:
    return jax.lax.stop_gradient(x.astype(jnp.float32))


def soft_cross_entropy(student_logits: Array, teacher_logits: Array, temperature: float = 1.0) -> Array:
    """KL(teacher || student) of the distributions softmax(logits / T), times T² so that its gradients keep
    their size as T changes (Hinton et al.); [..., vocab] -> [...]. Its gradient equals that of the soft
    cross-entropy, which differs from it by the teacher's entropy, a constant."""
    teacher = jax.nn.log_softmax(_teacher(teacher_logits) / temperature, axis=-1)
    student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    return temperature**2 * jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)


def chunked_soft_cross_entropy(
    student_logits_fn: Callable[[Array], Array], student_hidden: Array, teacher_logits_fn: Callable[[Array], Array],
    teacher_hidden: Array, temperature: float, chunk_size: int,
) -> Array:
    """`soft_cross_entropy` of both models' output layers applied to their final hidden states [b, t, width],
    `chunk_size` positions at a time (ptmjax/families/chunked_logits.py), so that neither model's
    [b, t, vocab] logits exist at once, in the forward or the backward pass; -> [b, t]."""

    def chunk(student: Array, teacher: Array) -> tuple[Array]:
        return (soft_cross_entropy(student_logits_fn(student), teacher_logits_fn(teacher), temperature),)

    return map_over_chunks(chunk, (student_hidden, teacher_hidden), chunk_size)[0]


def hidden_cosine(student: Array, teacher: Array) -> Array:
    """1 - cos(student, teacher) of each position's hidden state (DistilBERT's cosine embedding loss);
    [..., width] -> [...]. The widths must be equal."""
    s, t = student.astype(jnp.float32), _teacher(teacher)
    norms = jnp.linalg.norm(s, axis=-1) * jnp.linalg.norm(t, axis=-1)
    return 1.0 - jnp.sum(s * t, axis=-1) / jnp.maximum(norms, 1e-12)


def hidden_mse(student: Array, teacher: Array, projection: Array | None = None) -> Array:
    """The mean squared difference of each position's hidden state, the student's first mapped to the
    teacher's width by the learned `projection` [student width, teacher width] where they differ (TinyBERT's
    W_h); [..., width] -> [...]."""
    s = student.astype(jnp.float32)
    if projection is not None:
        s = precision.matmul(s, projection.astype(jnp.float32))
    return jnp.mean(jnp.square(s - _teacher(teacher)), axis=-1)


def attention_kl(student_probs: Array, teacher_probs: Array, key_mask: Array | None = None) -> Array:
    """KL(teacher || student) of each query's attention distribution, averaged over the heads (MiniLM's
    self-attention transfer; TinyBERT's attention loss compares the same matrices by squared error:
    `attention_mse`); [b, heads, q, k] -> [b, q]. The head counts must be equal. `key_mask` [b, k] (1 where a
    key may be attended) drops the masked keys' terms, where both distributions are zero."""
    t = _teacher(teacher_probs)
    terms = t * (jnp.log(jnp.maximum(t, 1e-30)) - jnp.log(jnp.maximum(student_probs.astype(jnp.float32), 1e-30)))
    if key_mask is not None:
        terms = terms * key_mask[:, None, None, :]
    return jnp.mean(jnp.sum(terms, axis=-1), axis=1)


def attention_mse(student_probs: Array, teacher_probs: Array, key_mask: Array | None = None) -> Array:
    """The squared difference of the attention matrices, summed over keys and averaged over the heads
    (TinyBERT); [b, heads, q, k] -> [b, q]. `key_mask` as `attention_kl`'s."""
    terms = jnp.square(student_probs.astype(jnp.float32) - _teacher(teacher_probs))
    if key_mask is not None:
        terms = terms * key_mask[:, None, None, :]
    return jnp.mean(jnp.sum(terms, axis=-1), axis=1)


def value_relation(values: Array, key_mask: Array | None = None) -> Array:
    """MiniLM's value relation: softmax(V Vᵀ / sqrt(head width)) of each head's values [b, heads, t, d],
    -> [b, heads, t, t], keys outside `key_mask` [b, t] left out of each softmax. Its KL between student
    and teacher is `attention_kl` of the two relations, so head widths may differ."""
    v = values.astype(jnp.float32)
    scores = precision.einsum("bhqd,bhkd->bhqk", v, v) / jnp.sqrt(jnp.float32(v.shape[-1]))
    if key_mask is not None:
        scores = jnp.where(key_mask[:, None, None, :] > 0, scores, -1e30)
    return jax.nn.softmax(scores, axis=-1)


def patient_states(student: Array, teacher: Array) -> Array:
    """BERT-PKD's patient loss: the squared distance between the unit-normalised [CLS] states of each mapped
    layer pair, summed over the layers; [b, layers, width] -> [b]."""
    unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    return jnp.sum(jnp.square(unit(student.astype(jnp.float32)) - unit(_teacher(teacher))), axis=(-2, -1))
