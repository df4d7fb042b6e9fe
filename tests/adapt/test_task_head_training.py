"""Training the fine-tuning heads with the Trainer on batches from each family's feature converter (tiny
synthetic tasks, the last row the pipeline's all-zero padding): the loss falls, and the first step of a
classifier is that of the mean per-example cross-entropy over the real rows (jax.grad of that mean, by
SGD). The sharded steps are in test_task_head_sharding.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf

from ptmjax import partitioning
from ptmjax.families.registry import family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import AlbertConfig, BertConfig, ElectraConfig, GPT2Config
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

SMALL = {"vocab_size": 64, "d_model": 32, "num_heads": 4, "num_layers": 2, "d_ff": 64, "max_length": 16,
         "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
MODELS = {
    "bert_sequence": EncoderForSequenceClassification(BertConfig(**SMALL, nsp_head=False), num_labels=3),
    "roberta_regression": EncoderForSequenceClassification(
        BertConfig(**SMALL, pad_token_id=1, positions_after_padding=True, nsp_head=False), num_labels=1
    ),
    "albert_tokens": EncoderForTokenClassification(AlbertConfig(**SMALL, embedding_size=16), num_labels=4),
    "electra_span": EncoderForQuestionAnswering(ElectraConfig(**SMALL, embedding_size=16)),
    "gpt2_sequence": GPT2ForSequenceClassification(GPT2Config(**SMALL), num_labels=2, pad_token_id=63),
}
STEPS, LR = 8, 3e-3
LENGTH, BATCH = 12, 8


def synthetic_examples(name: str, count: int) -> tuple[list[dict], dict[str, tf.DType]]:
    """A learnable task per head: the label is a function of the tokens."""
    rng = np.random.default_rng(0)
    examples = []
    for _ in range(count):
        n = int(rng.integers(6, LENGTH + 1))
        tokens = rng.integers(2, 60, n).astype(np.int32)
        types = (np.arange(n) >= 3).astype(np.int32)
        if name.endswith("tokens"):
            tags = np.where(np.arange(n) % 3 == 1, -1, tokens % 4).astype(np.int32)
            examples.append({"inputs": tokens, "tags": tags})
        elif name.endswith("span"):
            start = int(rng.integers(3, n))
            tokens[start] = 61  # the answer starts at the marker token
            end = min(start + 1, n - 1)
            examples.append({"inputs": tokens, "token_type_ids": types, "answer_start": start, "answer_end": end})
        elif name.endswith("regression"):
            examples.append({"inputs": tokens, "label": np.float32(np.mean(tokens > 30))})
        else:
            examples.append({"inputs": tokens, "token_type_ids": types, "label": int(tokens[0] % 3 if "bert" in name
                                                                                        else tokens[0] > 30)})
    scalars = {"label": tf.float32 if name.endswith("regression") else tf.int32, "answer_start": tf.int32,
               "answer_end": tf.int32}
    return examples, scalars


@functools.cache
def host_batch(name: str) -> dict[str, np.ndarray]:
    examples, scalars = synthetic_examples(name, BATCH - 1)
    signature = {key: tf.TensorSpec([], scalars[key]) if key in scalars else tf.TensorSpec([None], tf.int32)
                 for key in examples[0]}
    ds = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)
    converter = family_of(MODELS[name]).feature_converter(pack=False)
    batch = next(converter(ds, {"inputs": LENGTH}).batch(BATCH).as_numpy_iterator())
    # the pipeline pads a short last batch with all-zero rows
    return {name: np.concatenate([value, np.zeros_like(value[:1])]) for name, value in batch.items()}


@functools.cache
def train(name: str, mesh_config: MeshConfig | None = None, steps: int = STEPS, optimizer: str = "adam"):
    """`steps` steps of `optimizer` on one batch, on `mesh_config` (default: one device) -> (initial params,
    params after the first step, per-step metrics)."""
    single_device = mesh_config is None
    mesh_config = mesh_config or MeshConfig()
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    tx, loss_config = getattr(optax, optimizer)(LR), LossConfig(z_loss=0.0)
    run = Trainer(MODELS[name], tx, lambda _: LR, mesh, mesh_config.rules, loss_config)
    state = run.init_state(jax.random.key(0))
    initial = jax.device_get(state.params)
    batch = partitioning.global_batch(host_batch(name), mesh)
    metrics = []
    for step in range(steps):
        state, step_metrics = run.train_step(state, batch, jax.random.key(step))
        metrics.append(jax.device_get(step_metrics))
        if step == 0:
            first = jax.device_get(state.params)
    return initial, first, metrics


@pytest.mark.parametrize("name", ["albert_tokens", "bert_sequence", "electra_span", "gpt2_sequence"])
def test_training_lowers_the_loss(name):
    losses = [float(m["loss"]) for m in train(name)[2]]
    assert losses[-1] < 0.7 * losses[0], losses


def test_classifier_optimises_the_mean_per_example_cross_entropy():
    model, batch = MODELS["bert_sequence"], host_batch("bert_sequence")
    real = batch["example_weight"] > 0
    assert real.sum() == BATCH - 1
    initial, first, metrics = train("bert_sequence", steps=1, optimizer="sgd")  # Adam would magnify rounding

    def mean_cross_entropy(p):
        logits = model.apply({"params": p}, jnp.asarray(batch["input_tokens"]), jnp.asarray(batch["token_type_ids"]))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[real], jnp.asarray(batch["label"][real]))
        return jnp.mean(ce)

    want_loss, grads = jax.value_and_grad(mean_cross_entropy)(initial)
    np.testing.assert_allclose(float(metrics[0]["loss"]), float(want_loss), rtol=1e-6)
    want_params = jax.tree.map(lambda p, g: p - LR * g, initial, grads)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-8), first, want_params)
    changed = jax.tree.map(lambda g, p: np.max(np.abs(g - p)), first, initial)
    assert max(jax.tree.leaves(changed)) > 1e-5  # the step moved the parameters
