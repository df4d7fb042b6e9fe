"""Two processes of 4 CPU devices each run `ptmjax train --distributed` as two hosts of one 8-device job.

Each reads its own shard of the task. A SIGTERM to one of them stops both
after the same step with one checkpoint; rerunning both resumes. Losses equal
a single process training on the two shards' batches side by side, and the
evaluation of the whole validation split equals a single process's.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import gin
import jax
import numpy as np
import pytest

from ptmjax import gin_files, partitioning
from ptmjax.data import pipeline
from ptmjax.families.registry import family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.training.optimizers import adafactor
from ptmjax.training.schedules import rsqrt_with_warmup
from ptmjax.training.trainer import Trainer

RUN = ["--gin_file=runs/demo.gin", "--gin_bindings=train.task_feature_lengths = {'inputs': 64, 'targets': 16}",
       "--gin_bindings=train.batch_size = 16", "--gin_bindings=train.log_every = 1",
       "--gin_bindings=train.eval_every = 100000", "--gin_bindings=train.checkpoint_every = 100000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_hosts(model_dir, num_steps):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "ptmjax.train", "--distributed", "--num_cpu_devices=4", f"--model_dir={model_dir}",
             *RUN, f"--gin_bindings=train.num_steps = {num_steps}",
             f"--gin_bindings=initialize_distributed.coordinator_address = 'localhost:{port}'",
             "--gin_bindings=initialize_distributed.num_processes = 2",
             f"--gin_bindings=initialize_distributed.process_id = {process_id}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for process_id in range(2)
    ]


def finish(processes, timeout):
    outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    for p, output in zip(processes, outputs, strict=True):
        assert p.returncode == 0, output[-5000:]
    return outputs


def metrics(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def single_process_reference(num_steps):
    """Losses of one process feeding shard 0 and shard 1 side by side; evaluation of both shards' rows.

    Also returns the validation rows of each shard: host batches of 8 rows.
    """
    gin_files.parse_gin(["runs/demo.gin"], [b.removeprefix("--gin_bindings=") for b in RUN[1:]])
    try:
        model = gin.get_bindings("train")["model"]
        lengths = gin.query_parameter("train.task_feature_lengths")
        mesh_config = partitioning.MeshConfig()
        schedule = rsqrt_with_warmup()
        trainer = Trainer(model, adafactor(schedule), schedule, partitioning.make_mesh(mesh_config),
                          mesh_config.rules, LossConfig())
    finally:
        gin.clear_config()
    converter = family_of(model).feature_converter

    def dataset(split, batch_size, shard, shards, **kwargs):
        return pipeline.get_dataset("ptmjax_pretrain", split, lengths, batch_size, seed=0, shard_index=shard,
                                    num_shards=shards, feature_converter=converter, **kwargs).as_numpy_iterator()

    shards = [dataset("train", 8, i, 2, shuffle=True) for i in range(2)]
    state, losses = trainer.init_state(jax.random.key(0)), []
    for _ in range(num_steps):
        halves = [next(s) for s in shards]
        batch = {k: np.concatenate([h[k] for h in halves]) for k in halves[0]}
        state, step_metrics = trainer.train_step(state, partitioning.global_batch(batch, trainer.mesh),
                                                 jax.random.key(1))
        losses.append(float(step_metrics["loss"]))
    total, rows = None, []
    for shard in range(2):  # rows are packed per shard; how they are grouped into batches changes no sum
        batches = list(dataset("validation", 16, shard, 2, shuffle=False, num_epochs=1, pad_final_batch=True))
        rows.append(sum(int(b["decoder_loss_weights"].any(axis=1).sum()) for b in batches))
        for batch in batches:
            stats = trainer.eval_stats(state.params, partitioning.global_batch(batch, trainer.mesh))
            total = stats if total is None else total + stats
    return losses, float(total.metrics()["loss"]), rows


@pytest.mark.slow  # two processes, about 90 s; run with -m slow before changing multihost.py or the loop
def test_two_hosts_stop_together_resume_and_equal_one_process(tmp_path):
    model_dir = str(tmp_path / "run")
    hosts = start_hosts(model_dir, num_steps=100000)
    deadline = time.time() + 300
    while len(metrics(model_dir)) < 2:
        assert all(p.poll() is None for p in hosts), [p.communicate()[0][-3000:] for p in hosts]
        assert time.time() < deadline, "no metrics after 300 s"
        time.sleep(0.5)
    hosts[1].send_signal(signal.SIGTERM)  # the preemption of one host stops both
    outputs = finish(hosts, timeout=180)
    stopped = [re.search(r"SIGTERM: saved step (\d+)", output) for output in outputs]
    assert all(stopped), outputs
    step = int(stopped[0].group(1))
    assert int(stopped[1].group(1)) == step
    assert os.listdir(os.path.join(model_dir, "checkpoints")) == [str(step)]
    assert "Resolved config saved" in outputs[0] and "Resolved config saved" not in outputs[1]

    outputs = finish(start_hosts(model_dir, num_steps=step + 2), timeout=300)
    for output in outputs:
        assert f"Resumed from step {step}" in output and f"Training finished at step {step + 2}" in output
    eval_losses = {float(re.search(r"eval_loss: ([\d.]+)", output).group(1)) for output in outputs}
    assert len(eval_losses) == 1

    records = metrics(model_dir)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == list(range(1, step + 3)), "one record per step, from process 0"
    losses, eval_loss, rows = single_process_reference(step + 2)
    assert -(-rows[0] // 8) != -(-rows[1] // 8), f"shards of {rows} rows: both hosts have as many batches"
    np.testing.assert_allclose([r["loss"] for r in train_records], losses, rtol=2e-5)
    (final_eval,) = [r for r in records if "eval_loss" in r]
    np.testing.assert_allclose(final_eval["eval_loss"], eval_loss, rtol=2e-5)
