"""A tiny BERT trainer and its batches, for the progressive stacking and layer dropping tests."""

import jax
import numpy as np

from ptmjax import partitioning
from ptmjax.models import Bert, BertConfig
from ptmjax.training.callbacks.callback import StepEvent
from ptmjax.training.optimizers import adamw
from ptmjax.training.run_spec import RunSpec

CONFIG = BertConfig(
    vocab_size=96, d_model=32, num_heads=4, num_layers=4, d_ff=64, max_length=24, dropout_rate=0.1,
    attention_dropout_rate=0.0,
)
LENGTHS = {"inputs": 16, "targets": 16}


def trainer_and_batches(extra_state=(), config=CONFIG, mesh_config=None, devices=None, steps=4, optimizer=adamw):
    """A trainer of BERT `config` with `optimizer` (default AdamW) and `extra_state`, and `steps` random global
    batches."""
    spec = RunSpec(model=Bert(config), batch_size=8, task_feature_lengths=LENGTHS, optimizer=optimizer, pack=False,
                   mesh_config=mesh_config, extra_state=tuple(extra_state))
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config, devices or jax.devices()[:1]))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        tokens = rng.integers(3, config.vocab_size, (8, 16)).astype(np.int32)
        selected = rng.random((8, 16)) < 0.3
        batch = {"input_tokens": np.where(selected, 2, tokens).astype(np.int32), "target_tokens": tokens,
                 "loss_mask": selected.astype(np.int32), "token_type_ids": np.zeros((8, 16), np.int32),
                 "sentence_label": rng.integers(0, 2, 8).astype(np.int32)}
        batches.append(partitioning.global_batch(batch, trainer.mesh))
    return trainer, batches


def train(trainer, batches, callbacks=(), state=None, first_step=1):
    """The states (on the host) after each step, `callbacks` acting as in a run."""
    state = trainer.init_state(jax.random.key(0)) if state is None else state
    states = []
    for step, batch in enumerate(batches, first_step):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        event = StepEvent(step, state, metrics, batch, final=False)
        for callback in callbacks:
            callback.on_step(event)
        state = event.state
        states.append(jax.device_get(state))
    return states, state
