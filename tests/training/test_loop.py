"""The loop end to end: resuming after a stop reproduces an uninterrupted run."""

import json
import os
import threading
import types

import jax
import numpy as np
import pytest
from tensorboard_helpers import tensorboard_scalars

from ptmjax import partitioning
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.tasks import pretraining  # noqa: F401 - registers the built-in tasks
from ptmjax.training import run_spec, step_clock
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run import train
from ptmjax.training.schedules import rsqrt_with_warmup
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
)


def run(model_dir, num_steps, log_every=1):
    return train(
        str(model_dir), model=EncoderDecoder(CONFIG), task_feature_lengths={"inputs": 32, "targets": 8},
        batch_size=8, num_steps=num_steps, log_every=log_every, eval_every=2, eval_batches=1,
        checkpoint_every=2, show_progress=False,
    )


def records(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(model_dir):
    return {r["step"]: r["loss"] for r in records(model_dir) if "loss" in r}


def final_params(model_dir):
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"))
    state, data = checkpointer.restore(*_targets())
    return jax.device_get(state.params), data


def _targets():
    """The abstract state and shardings the loop's default settings produce."""
    schedule = rsqrt_with_warmup()
    config = partitioning.MeshConfig()
    trainer = Trainer(EncoderDecoder(CONFIG), adafactor(schedule), schedule,
                      partitioning.make_mesh(config), config.rules)
    return trainer.abstract_state, trainer.state_shardings


@pytest.mark.slow
def test_stop_and_resume_equals_one_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = run(straight, num_steps=4)
    run(resumed, num_steps=2)
    again = run(resumed, num_steps=4)

    assert result.step == again.step == 4
    want, got = train_losses(straight), train_losses(resumed)
    assert sorted(got) == [1, 2, 3, 4]
    np.testing.assert_allclose([got[s] for s in range(1, 5)], [want[s] for s in range(1, 5)], rtol=1e-6)
    (want_params, want_data), (got_params, got_data) = final_params(straight), final_params(resumed)
    assert want_data == got_data == {"batches_consumed": 4}
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got_params, want_params)
    assert again.eval_metrics == result.eval_metrics
    for name in ("config", "metrics", "loss_curve"):
        assert os.path.exists(result.files[name]), name


@pytest.mark.slow  # a gin training run; text-file tasks train by default in tests/reliability (registered in Python)
def test_text_files_task_from_gin_alone(tmp_path):
    """runs/text_files.gin trains on local files with no Python written."""
    import gin

    from ptmjax import gin_files

    lines = [f"Line {i} of a small local corpus about packing, sharding and checkpoints." for i in range(400)]
    (tmp_path / "train.txt").write_text("\n".join(lines))
    (tmp_path / "valid.txt").write_text("\n".join(lines[:80]))
    gin_files.parse_gin(
        ["runs/demo.gin", "runs/text_files.gin"],
        [
            f"register_text_files_task.train_pattern = '{tmp_path / 'train.txt'}'",
            f"register_text_files_task.validation_pattern = '{tmp_path / 'valid.txt'}'",
            "train.num_steps = 2", "train.batch_size = 8", "train.show_progress = False",
            "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
        ],
    )
    try:
        result = train(str(tmp_path / "run"))
    finally:
        gin.clear_config()
    assert result.step == 2 and result.eval_metrics["eval_num_tokens"] > 0
    with open(result.files["config"]) as f:
        assert "ptmjax_text_files_span_corruption" in f.read()


@pytest.mark.slow
def test_the_train_step_is_traced_and_lowered_once_ahead_of_the_first_batch(tmp_path, monkeypatch):
    """The loop compiles its step for the run's abstract batch in a thread of its own while it initialises the
    state and builds the pipelines; the first step, on the real batch, finds that program in JAX's caches
    instead of tracing it again."""
    from jax import monitoring

    events, compiling_threads, started = [], [], []

    class Recorded(Trainer):
        def start_compiling_train_step(self, *args):
            started.append("start_compiling_train_step")
            return super().start_compiling_train_step(*args)

        def init_state(self, *args):
            started.append("init_state")
            return super().init_state(*args)

        def compile_train_step(self, *args):
            events.append("compile_train_step")
            compiling_threads.append(threading.current_thread())
            return super().compile_train_step(*args)

        def train_step(self, *args):
            events.append("train_step")
            return super().train_step(*args)

    def listen(event, duration, fun_name=None, **kwargs):
        if fun_name in ("train_step", "jit(train_step)"):  # tracing names the function, lowering its module
            events.append(event.rsplit("/", 1)[-1])

    monkeypatch.setattr(run_spec, "Trainer", Recorded)
    monitoring.register_event_duration_secs_listener(listen)
    try:
        run(tmp_path, num_steps=2)
    finally:
        monitoring.unregister_event_duration_listener(listen)
    first_step = events.index("train_step")
    assert events[0] == "compile_train_step"
    assert {"jaxpr_trace_duration", "jaxpr_to_mlir_module_duration"} <= set(events[1:first_step]), events
    assert events[first_step:] == ["train_step", "train_step"]  # the steps traced, lowered and compiled nothing
    assert compiling_threads[0] is not threading.main_thread()
    assert started == ["start_compiling_train_step", "init_state"]


def test_an_error_in_the_background_compile_is_the_runs_error(tmp_path, monkeypatch):
    class FailingCompile(Trainer):
        def compile_train_step(self, *args):
            raise RuntimeError("XLA ran out of memory compiling the step")

    monkeypatch.setattr(run_spec, "Trainer", FailingCompile)
    with pytest.raises(RuntimeError, match="XLA ran out of memory compiling the step"):
        run(tmp_path, num_steps=2)
    assert not os.path.isdir(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.slow
def test_a_run_whose_newest_checkpoint_already_ends_it_compiles_no_step(tmp_path, monkeypatch):
    run(tmp_path, num_steps=2)
    started = []

    class Recorded(Trainer):
        def start_compiling_train_step(self, *args):
            started.append(args)
            return super().start_compiling_train_step(*args)

    monkeypatch.setattr(run_spec, "Trainer", Recorded)
    assert run(tmp_path, num_steps=2).step == 2
    assert started == []


@pytest.mark.slow
def test_step_times_leave_out_the_first_step_and_tensorboard_has_train_and_eval_runs(tmp_path, monkeypatch):
    """A fake clock: the first step (the compile) takes 100 s, later ones 1 s; evaluation no time."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(step_clock, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    class SlowFirstStep(Trainer):
        def train_step(self, *args):
            clock.now += 1.0 if clock.now else 100.0
            return super().train_step(*args)

    monkeypatch.setattr(run_spec, "Trainer", SlowFirstStep)
    run(tmp_path, num_steps=4, log_every=2)
    train_records = [r for r in records(tmp_path) if "loss" in r]
    eval_records = [r for r in records(tmp_path) if "eval_loss" in r]
    assert [r["step"] for r in train_records] == [2, 4] and [r["step"] for r in eval_records] == [2, 4]
    assert [r["step_time_s"] for r in train_records] == [1.0, 1.0]  # step 2, then steps 3 and 4
    assert train_records[0]["tokens_per_s"] == train_records[1]["tokens_per_s"] == 8 * (32 + 8)
    # a dense model without a per-batch loss logs neither metric (they would always be 0)
    assert not {"moe_aux_loss", "batch_loss"} & set(train_records[0])
    assert not {"eval_moe_aux_loss", "eval_batch_loss"} & set(eval_records[0])

    train_scalars = tensorboard_scalars(tmp_path / "tensorboard" / "train")
    eval_scalars = tensorboard_scalars(tmp_path / "tensorboard" / "eval")
    assert {"loss", "accuracy", "tokens_per_s"} <= set(train_scalars)
    assert {"loss", "accuracy"} <= set(eval_scalars) and not any(t.startswith("eval_") for t in eval_scalars)
    assert eval_scalars["loss"] == {r["step"]: np.float32(r["eval_loss"]) for r in eval_records}
    assert train_scalars["loss"] == {r["step"]: np.float32(r["loss"]) for r in train_records}
