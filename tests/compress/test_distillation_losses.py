"""The distillation losses against float64 NumPy written from the papers' formulas (Hinton et al., DistilBERT,
TinyBERT, MiniLM, BERT-PKD): values, zero where the student equals the teacher, no gradient into the
teacher, the chunked soft cross-entropy equal to the plain one in value and gradient; the layer maps against
the papers' examples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.compress import distillation_losses as losses
from ptmjax.compress.layer_maps import checked_layer_map, layer_map

RNG = np.random.default_rng(0)


def softmax64(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def f32(x):
    return jnp.asarray(x, jnp.float32)


def close(actual, expected, tol=2e-5):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_soft_cross_entropy_is_kl_at_temperature_times_its_square(temperature):
    student, teacher = RNG.normal(size=(2, 3, 11)) * 3, RNG.normal(size=(2, 3, 11)) * 3
    p, q = softmax64(teacher / temperature), softmax64(student / temperature)
    expected = temperature**2 * np.sum(p * (np.log(p) - np.log(q)), axis=-1)
    close(losses.soft_cross_entropy(f32(student), f32(teacher), temperature), expected)
    np.testing.assert_allclose(losses.soft_cross_entropy(f32(teacher), f32(teacher), temperature), 0, atol=1e-6)


def test_soft_cross_entropy_gradient_is_the_soft_targets_gradient_and_none_reaches_the_teacher():
    """d/ds of T² KL(softmax(t/T) || softmax(s/T)) = T (softmax(s/T) - softmax(t/T)) (Hinton et al., eq. 2)."""
    student, teacher, temperature = RNG.normal(size=(4, 7)), RNG.normal(size=(4, 7)), 3.0
    grad_s, grad_t = jax.grad(lambda s, t: losses.soft_cross_entropy(s, t, temperature).sum(), argnums=(0, 1))(
        f32(student), f32(teacher))
    close(grad_s, temperature * (softmax64(student / temperature) - softmax64(teacher / temperature)))
    assert not np.any(np.asarray(grad_t))


@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_chunked_soft_cross_entropy_equals_the_plain_one_and_its_gradients(chunk_size):
    """Each model's output layer applied chunk by chunk (length 6: chunk 4 pads it)."""
    hidden_s, hidden_t = f32(RNG.normal(size=(2, 6, 5))), f32(RNG.normal(size=(2, 6, 8)))
    out_s, out_t = f32(RNG.normal(size=(5, 13))), f32(RNG.normal(size=(8, 13)))

    def plain(w, h):
        return losses.soft_cross_entropy(h @ w, hidden_t @ out_t, 2.0)

    def chunked(w, h):
        return losses.chunked_soft_cross_entropy(lambda x: x @ w, h, lambda x: x @ out_t, hidden_t, 2.0, chunk_size)

    close(chunked(out_s, hidden_s), np.asarray(plain(out_s, hidden_s), np.float64), 1e-6)
    weights = f32(RNG.uniform(size=(2, 6)))
    for grad_c, grad_p in zip(jax.grad(lambda w, h: (chunked(w, h) * weights).sum(), argnums=(0, 1))(out_s, hidden_s),
                              jax.grad(lambda w, h: (plain(w, h) * weights).sum(), argnums=(0, 1))(out_s, hidden_s),
                              strict=True):
        close(grad_c, np.asarray(grad_p, np.float64), 1e-6)


def test_hidden_cosine_and_mse_with_a_projection():
    student, teacher, projection = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 3, 6)), RNG.normal(size=(4, 6))
    projected = student @ projection
    cosine = np.sum(projected * teacher, -1) / (np.linalg.norm(projected, axis=-1) * np.linalg.norm(teacher, axis=-1))
    close(losses.hidden_cosine(f32(projected), f32(teacher)), 1 - cosine)
    close(losses.hidden_mse(f32(student), f32(teacher), f32(projection)), np.mean((projected - teacher) ** 2, -1))
    close(losses.hidden_mse(f32(teacher), f32(teacher)), np.zeros((2, 3)))
    close(losses.hidden_cosine(f32(2 * teacher), f32(teacher)), np.zeros((2, 3)))  # the angle alone


def attention_probs(batch, heads, length, key_mask):
    scores = RNG.normal(size=(batch, heads, length, length)) * 2
    return softmax64(np.where(key_mask[:, None, None, :] > 0, scores, -np.inf))


def test_attention_kl_and_mse_per_query_averaged_over_heads_masked_keys_left_out():
    key_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.float32)
    student, teacher = attention_probs(2, 3, 5, key_mask), attention_probs(2, 3, 5, key_mask)
    kept = key_mask[:, None, None, :] > 0
    logs = np.where(kept, np.log(np.where(kept, teacher, 1)) - np.log(np.where(kept, student, 1)), 0)
    close(losses.attention_kl(f32(student), f32(teacher), f32(key_mask)), np.mean(np.sum(teacher * logs, -1), 1))
    close(losses.attention_mse(f32(student), f32(teacher), f32(key_mask)),
          np.mean(np.sum((student - teacher) ** 2 * kept, -1), 1))
    np.testing.assert_allclose(losses.attention_kl(f32(teacher), f32(teacher), f32(key_mask)), 0, atol=1e-6)


def test_minilm_value_relation_kl_between_heads_of_different_widths():
    key_mask = np.array([[1, 1, 1, 0]], np.float32)
    student, teacher = RNG.normal(size=(1, 2, 4, 3)), RNG.normal(size=(1, 2, 4, 8))

    def relation64(v):
        scores = np.einsum("bhqd,bhkd->bhqk", v, v) / np.sqrt(v.shape[-1])
        return softmax64(np.where(key_mask[:, None, None, :] > 0, scores, -np.inf))

    rs, rt = relation64(student), relation64(teacher)
    close(losses.value_relation(f32(student), f32(key_mask)), rs)
    kept = key_mask[:, None, None, :] > 0
    expected = np.mean(np.sum(np.where(kept, rt * (np.log(np.where(kept, rt, 1)) - np.log(np.where(kept, rs, 1))),
                                       0), -1), 1)
    relation = losses.attention_kl(losses.value_relation(f32(student), f32(key_mask)),
                                   losses.value_relation(f32(teacher), f32(key_mask)), f32(key_mask))
    close(relation, expected)


def test_patient_states_sum_the_normalised_cls_distances_over_layers():
    student, teacher = RNG.normal(size=(3, 4, 6)), RNG.normal(size=(3, 4, 6))
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    close(losses.patient_states(f32(student), f32(teacher)), np.sum((unit(student) - unit(teacher)) ** 2, (-2, -1)))
    close(losses.patient_states(f32(3 * teacher), f32(teacher)), np.zeros(3))


@pytest.mark.parametrize("kind, student, teacher, expected", [
    ("uniform", 4, 12, [2, 5, 8, 11]),  # TinyBERT's g(m) = 3m
    ("uniform", 6, 12, [1, 3, 5, 7, 9, 11]),  # BERT-PKD-skip
    ("last", 6, 12, [6, 7, 8, 9, 10, 11]),  # BERT-PKD-last
    ("alternate", 6, 12, [0, 2, 4, 6, 8, 10]),
    ("uniform", 12, 12, list(range(12))),
])
def test_layer_maps_give_the_papers_examples(kind, student, teacher, expected):
    assert layer_map(kind, student, teacher) == expected


def test_layer_maps_refuse_what_cannot_map_in_one_line():
    with pytest.raises(ValueError, match="unknown layer map 'skipp': use one of uniform, last, alternate"):
        layer_map("skipp", 6, 12)
    with pytest.raises(ValueError, match="a student of 13 layers cannot map onto a teacher of 12"):
        layer_map("uniform", 13, 12)
    assert checked_layer_map([0, 2, 4, 7, 9, 11], 6, 12) == [0, 2, 4, 7, 9, 11]  # DistilBERT's list
    with pytest.raises(ValueError, match=r"layer map \[0, 12\] must give each of the student's 2 layers"):
        checked_layer_map([0, 12], 2, 12)
