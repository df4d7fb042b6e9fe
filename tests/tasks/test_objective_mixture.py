"""The objective tasks and their mixture: each yields T5 batches; the gin run trains the tiny T5 on the mixture."""

import json
import math

import gin
import jax
import numpy as np
import optax
import pytest

from ptmjax import gin_files, partitioning
from ptmjax.data import pipeline
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.tasks import objective_mixture
from ptmjax.training.run import train
from ptmjax.training.trainer import Trainer

LENGTHS = {"inputs": 64, "targets": 32}
BATCH = 8


def first_batch(name: str, lengths=LENGTHS) -> dict[str, np.ndarray]:
    dataset = pipeline.get_dataset(name, "train", lengths, BATCH, seed=0, shuffle=False)
    return next(dataset.as_numpy_iterator())


@pytest.mark.parametrize("name", objective_mixture.OBJECTIVES)  # the mixture: in the run below
def test_each_task_yields_t5_batches(name):
    lengths = {"inputs": 64, "targets": 64} if name == objective_mixture.MASS_TASK else LENGTHS  # MASS: half the inputs
    batch = first_batch(name, lengths)
    assert set(batch) == set(pipeline.ENCDEC_FEATURES + pipeline.PACKING_FEATURES)
    for key, value in batch.items():
        length = lengths["inputs" if key.startswith("encoder") else "targets"]
        assert value.shape == (BATCH, length) and value.dtype == np.int32, key
    assert batch["decoder_loss_weights"].sum() > 0 and batch["encoder_input_tokens"].max() < 2100


@pytest.fixture
def gin_run():
    """runs/objective_mixture.gin, shrunk to 3 steps of small batches and one layer per stack (compile time)."""
    bindings = {
        "train.num_steps": 3, "train.batch_size": BATCH, "train.show_progress": False,
        "train.task_feature_lengths": LENGTHS, "train.log_every": 1, "train.eval_every": 3,
        "train.eval_batches": 1, "train.checkpoint_every": 3,
        "T5Config.num_encoder_layers": 1, "T5Config.num_decoder_layers": 1,
    }
    gin_files.parse_gin(["runs/objective_mixture.gin"], [f"{name} = {value!r}" for name, value in bindings.items()])
    yield
    gin.clear_config()


@pytest.mark.slow  # a full gin training run (about 50 s); the mixture's sampling is tested above
def test_gin_run_trains_the_tiny_t5_on_the_mixture(gin_run, tmp_path):
    result = train(str(tmp_path / "run"))
    with open(result.files["metrics"]) as f:
        losses = [record["loss"] for record in map(json.loads, f) if "loss" in record]
    assert result.step == 3 and len(losses) == 3 and all(map(math.isfinite, losses))
    assert math.isfinite(result.eval_metrics["eval_loss"])
    with open(result.files["config"]) as f:
        assert "ptmjax_objective_mixture" in f.read()

    # The same model on one device: the loss falls on a repeated batch of the mixture (UL2, BART, PEGASUS, T5).
    mesh_config = partitioning.MeshConfig()
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1])
    schedule = optax.constant_schedule(3e-3)
    trainer = Trainer(EncoderDecoder(T5Config()), optax.adam(schedule), schedule, mesh, mesh_config.rules)
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(first_batch(objective_mixture.OBJECTIVE_MIXTURE), mesh)
    repeated = []
    for _ in range(5):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        repeated.append(float(metrics["loss"]))
    assert all(map(math.isfinite, repeated)) and repeated[-1] < repeated[0] - 0.1, repeated
