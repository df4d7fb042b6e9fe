"""Transformer-XL training with its memory in the train state (`train.objective = @RecurrentMemory()`): each
step's memory is the model's own after the step's segment, a sharded run equals one device (memory included),
and runs killed and resumed equal an uninterrupted one bitwise, memory and data position included."""

import dataclasses
import functools

import gin
import jax
import numpy as np
import optax
import pytest
from reliability.reliability_helpers_a import assert_trees_equal, saved_checkpoint
from sharding_helpers import assert_updates_match, parameter_update

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.families.registry import TRANSFORMER_XL
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.transformer_xl import TransformerXL, TransformerXLConfig, empty_memory
from ptmjax.partitioning import MeshConfig
from ptmjax.tasks.documents import STDLIB_DOCUMENTS_TASK
from ptmjax.training import run
from ptmjax.training.recurrent_memory import MEMORY, RecurrentMemory
from ptmjax.training.trainer import Trainer

CONFIG = TransformerXLConfig(vocab_size=2100, d_model=16, num_heads=2, num_layers=2, d_ff=32, memory_length=6,
                             dropout_rate=0.1, attention_dropout_rate=0.1)
ROWS, SEGMENT, STEPS = 8, 8, 3
CONVERTER = {"SegmentStreamFeatureConverter.rows": ROWS, "SegmentStreamFeatureConverter.segment_length": SEGMENT}


def bind_converter():
    """Binds the converter's rows and segment length, as a run's gin file does (its class registered first)."""
    TRANSFORMER_XL.converter.load()
    for name, value in CONVERTER.items():
        gin.bind_parameter(name, value)


@functools.lru_cache(maxsize=None)
def host_batches():
    bind_converter()
    try:
        dataset = pipeline.get_dataset(STDLIB_DOCUMENTS_TASK, "validation", {"targets": 4096}, ROWS, seed=0,
                                       shuffle=False, pack=False, feature_converter=TRANSFORMER_XL.feature_converter)
        return [batch for _, batch in zip(range(STEPS), dataset.as_numpy_iterator(), strict=False)]
    finally:
        gin.clear_config()


def train(mesh_config, devices, learning_rate=0.01, config=CONFIG):
    objective = RecurrentMemory(ROWS)
    model = TransformerXL(config)
    mesh = partitioning.make_mesh(mesh_config, devices)
    trainer = Trainer(model, optax.sgd(learning_rate), lambda _: learning_rate, mesh, mesh_config.rules,
                      LossConfig(z_loss=0.0), extra_state=objective.extra_state(model), objective=objective)
    state = trainer.init_state(jax.random.key(0))
    start, metrics = jax.device_get(state), []
    for batch in host_batches():
        state, step_metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
        metrics.append(jax.device_get(step_metrics))
    return start, jax.device_get(state), metrics


def test_each_step_carries_the_memory_the_model_leaves():
    # Learning rate 0 and no dropout: the steps' memory is the model's chain of segments from the first parameters.
    plain = dataclasses.replace(CONFIG, dropout_rate=0.0, attention_dropout_rate=0.0)
    start, end, metrics = train(MeshConfig(), jax.devices()[:1], learning_rate=0.0, config=plain)
    model, memory = TransformerXL(plain), empty_memory(plain, ROWS)
    for batch, step_metrics in zip(host_batches(), metrics, strict=True):
        logits, memory = model.apply({"params": start.params}, batch["decoder_input_tokens"], memory,
                                     method="with_memory")
        targets = batch["decoder_target_tokens"]
        nll = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), targets[..., None], -1).mean()
        np.testing.assert_allclose(step_metrics["loss"], nll, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), end.extra[MEMORY], jax.device_get(memory))
    assert np.asarray(end.extra[MEMORY]["filled"]).tolist() == [CONFIG.memory_length] * ROWS


@pytest.mark.slow  # 2 to 3 minutes on a loaded 2-core CPU: two compilations of the step, one over 8 devices
def test_sharded_training_with_memory_equals_one_device():
    start, want, want_metrics = train(MeshConfig(), jax.devices()[:1])
    _, got, got_metrics = train(MeshConfig(data=2, fsdp=2, tensor=2), jax.devices())
    for g, w in zip(got_metrics, want_metrics, strict=True):
        np.testing.assert_allclose(g["loss"], w["loss"], rtol=2e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got.params, want.params)
    assert_updates_match(parameter_update(start.params, want.params), parameter_update(start.params, got.params))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got.extra[MEMORY], want.extra[MEMORY])
    assert np.abs(np.asarray(got.extra[MEMORY]["hidden"])).max() > 0


def txl_run(model_dir, num_steps, checkpoint_every):
    bind_converter()
    try:
        return run.train(
            str(model_dir), model=TransformerXL(CONFIG), mixture_or_task_name=STDLIB_DOCUMENTS_TASK,
            task_feature_lengths={"targets": 4096}, pack=False, batch_size=ROWS, num_steps=num_steps,
            objective=RecurrentMemory(ROWS), show_progress=False, log_every=1, eval_every=1000, eval_batches=1,
            checkpoint_every=checkpoint_every,
        )
    finally:
        gin.clear_config()


@pytest.mark.slow  # three short runs
def test_a_run_killed_and_resumed_equals_a_straight_one(tmp_path):
    txl_run(tmp_path / "straight", 5, checkpoint_every=5)
    txl_run(tmp_path / "resumed", 2, checkpoint_every=2)
    txl_run(tmp_path / "resumed", 5, checkpoint_every=5)
    straight, resumed = (saved_checkpoint(tmp_path / name, 5) for name in ("straight", "resumed"))
    assert np.asarray(straight["state"]["extra"][MEMORY]["filled"]).tolist() == [CONFIG.memory_length] * ROWS
    assert_trees_equal(straight["state"], resumed["state"])
    assert straight["data"] == resumed["data"]


def test_a_model_other_than_transformer_xl_is_refused():
    from ptmjax.models import GPT2, GPT2Config

    gpt2 = GPT2(GPT2Config(vocab_size=8, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_length=8))
    with pytest.raises(ValueError, match="RecurrentMemory trains a Transformer-XL, got GPT2"):
        RecurrentMemory(ROWS).extra_state(gpt2)
