"""Tiny training runs for the reliability tests, and what they keep on disk."""

import json
import os

import jax
import numpy as np

from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import pretraining  # noqa: F401 - registers the built-in tasks
from ptmjax.training import run_spec
from ptmjax.training.run import TrainResult, train
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
)


def run(model_dir, num_steps: int, **settings) -> TrainResult:
    """A tiny T5 run: batch 8, a checkpoint and a metrics record every 2 steps, one evaluation at the end."""
    settings = {"log_every": 1, "checkpoint_every": 2, "eval_every": 1000, "eval_batches": 1, **settings}
    return train(
        str(model_dir), model=EncoderDecoder(CONFIG), task_feature_lengths={"inputs": 32, "targets": 8},
        batch_size=8, num_steps=num_steps, show_progress=False, **settings,
    )


def poison_steps(monkeypatch, steps: set[int]) -> None:
    """Makes the loss of these (1-based) train steps NaN: their input ids lie past the embedding table,
    which `jnp.take` fills with NaN."""

    class PoisonedTrainer(Trainer):
        calls = 0

        def train_step(self, state, batch, rng):
            PoisonedTrainer.calls += 1
            if PoisonedTrainer.calls in steps:
                batch = {**batch, "encoder_input_tokens": batch["encoder_input_tokens"] + 10**6}
            return super().train_step(state, batch, rng)

    monkeypatch.setattr(run_spec, "Trainer", PoisonedTrainer)


def records(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_losses(model_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(model_dir) if "loss" in r}


def saved_steps(model_dir) -> list[int]:
    return ModelDir(str(model_dir)).saved_steps()


def saved_checkpoint(model_dir, step: int) -> dict:
    """{'state': numpy tree, 'data': data position} of a saved step, read as saved."""
    return Checkpointer(ModelDir(str(model_dir)).checkpoints_path, read_only=True).read_back(step)


def all_finite(tree) -> bool:
    return all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(tree) if np.issubdtype(leaf.dtype, np.inexact))


def assert_trees_equal(a, b) -> None:
    """Bitwise equal, leaf by leaf."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
