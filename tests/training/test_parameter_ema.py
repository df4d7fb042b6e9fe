"""The EMA of the parameters (`train.ema_decay`): a float64 reference, its evaluation and folder, and a resume
after `kill -9` that ends bitwise equal to one run."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from reliability.reliability_helpers_a import assert_trees_equal, records, run, saved_checkpoint, train_losses

import ptmjax
from ptmjax import partitioning
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.optimizers import adafactor
from ptmjax.training.parameter_ema import ParameterEma
from ptmjax.training.run_spec import RunSpec
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import leaves_by_path

DECAY = 0.9
CONFIG = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)


def trainer_and_batches(extra_state, trainable=None, steps=4):
    spec = RunSpec(model=EncoderDecoder(CONFIG), batch_size=8, task_feature_lengths={"inputs": 12, "targets": 6},
                   optimizer=adafactor, pack=False, trainable=trainable)
    mesh = partitioning.make_mesh(spec.mesh_config)
    schedule = spec.schedule
    trainer = Trainer(spec.model, spec.optimizer(schedule), schedule, mesh, spec.mesh_config.rules,
                      num_microbatches=1, trainable=trainable, extra_state=extra_state)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        batch = {name: rng.integers(1, CONFIG.vocab_size, spec.shape, dtype=spec.dtype)
                 for name, spec in spec.abstract_batch(None).items()}
        batch["decoder_loss_weights"] = np.ones_like(batch["decoder_loss_weights"])
        batches.append(partitioning.global_batch(batch, mesh))
    return trainer, batches


@pytest.mark.parametrize("trainable", [None, (".*encoder.*",)])
def test_the_ema_equals_a_float64_reference_and_leaves_training_unchanged(trainable):
    trainer, batches = trainer_and_batches((ParameterEma(DECAY),), trainable)
    plain, _ = trainer_and_batches((), trainable)
    state, plain_state = trainer.init_state(jax.random.key(0)), plain.init_state(jax.random.key(0))
    rng = jax.random.key(1)
    trained = dict(leaves_by_path(jax.device_get(state.params)))
    trained = {path: value for path, value in trained.items() if path in trainer.trained_paths}
    reference = {path: np.asarray(value, np.float64) for path, value in trained.items()}
    for batch in batches:
        state, _ = trainer.train_step(state, batch, rng)
        plain_state, _ = plain.train_step(plain_state, batch, rng)
        for path, value in leaves_by_path(jax.device_get(state.params)):
            if path in reference:
                reference[path] = DECAY * reference[path] + (1 - DECAY) * np.asarray(value, np.float64)
    ema = dict(leaves_by_path(jax.device_get(state.extra["ema"])))
    assert sorted(ema) == sorted(trainer.trained_paths) == sorted(reference)
    if trainable is not None:
        assert all("encoder" in path for path in ema) and len(ema) < len(leaves_by_path(state.params))
    for path, want in reference.items():
        np.testing.assert_allclose(ema[path], want, rtol=2e-6, atol=1e-7, err_msg=path)
        assert ema[path].dtype == np.float32
    assert_trees_equal(jax.device_get(state.params), jax.device_get(plain_state.params))  # training unchanged
    moved = [path for path, want in reference.items() if not np.allclose(ema[path], trained[path])]
    assert moved, "the EMA did not move from the initial parameters"


@pytest.mark.slow
def test_a_run_evaluates_its_ema_and_keeps_it_as_a_model_folder(tmp_path):
    result = run(tmp_path / "run", num_steps=4, ema_decay=DECAY, eval_every=2)
    assert {"eval_loss", "eval_ema_loss", "eval_ema_accuracy"} <= set(result.eval_metrics)
    assert result.eval_metrics["eval_ema_loss"] != result.eval_metrics["eval_loss"]
    assert [r["step"] for r in records(tmp_path / "run") if "eval_ema_loss" in r] == [2, 4]
    saved = saved_checkpoint(tmp_path / "run", 4)["state"]
    folder = ModelDir(result.files["ema"])
    assert folder.saved_steps() == [4] and os.path.isfile(folder.config_path)
    assert_trees_equal(folder.read_params(saved["extra"]["ema"]), saved["extra"]["ema"])


@pytest.mark.slow
def test_resuming_a_run_without_an_ema_with_one_names_the_difference(tmp_path):
    run(tmp_path, num_steps=2)
    with pytest.raises(ValueError, match="extra/ema/.* is absent there"):
        run(tmp_path, num_steps=4, ema_decay=DECAY)


def test_a_bad_decay_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match=r"train.ema_decay=1.0 must be a number in \[0, 1\)"):
        run(tmp_path, num_steps=2, ema_decay=1.0)
    assert not os.path.exists(tmp_path / "checkpoints")


def start(model_dir) -> subprocess.Popen:
    bindings = [
        "train.num_steps = 12", "train.batch_size = 8", "train.log_every = 1", "train.eval_every = 1000",
        "train.eval_batches = 1", "train.checkpoint_every = 4", "train.show_progress = False",
        "train.task_feature_lengths = {'inputs': 32, 'targets': 8}", f"train.ema_decay = {DECAY}",
    ]
    command = [sys.executable, "-m", "ptmjax.train", "--gin_file=runs/demo.gin", f"--model_dir={model_dir}"]
    return subprocess.Popen(command + [f"--gin_bindings={b}" for b in bindings], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> None:
    _, errors = process.communicate(timeout=900)
    assert process.returncode == 0, errors[-3000:]


@pytest.mark.slow  # three `ptmjax train` processes
def test_an_ema_run_killed_and_resumed_ends_bitwise_equal_to_one_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finish(start(straight))
    process = start(killed)
    while max(train_losses(killed), default=0) < 6 if os.path.exists(killed / "metrics.jsonl") else True:
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert max(ModelDir(str(killed)).saved_steps(), default=0) < 12  # killed before its end
    finish(start(killed))
    want, got = saved_checkpoint(straight, 12), saved_checkpoint(killed, 12)
    assert sorted(got["state"]["extra"]) == ["ema"]
    assert_trees_equal(got["state"], want["state"])
    loaded = ptmjax.load(str(killed / "ema"))  # a model folder like the run's
    assert_trees_equal(jax.device_get(loaded.params), want["state"]["extra"]["ema"])
