"""Start-up: the compilation cache a run uses, programs compiled ahead in threads, what training imports."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from ptmjax.training import compilation_cache
from ptmjax.training.compile_ahead import CompileAhead
from ptmjax.training.startup import StartupClock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A fresh process, with no cache JAX knows of, runs the training path's first programs as `train` does.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from ptmjax.gin_files import parse_gin
    from ptmjax.training import compilation_cache, loop
    from ptmjax import partitioning
    report = {"before": jax.config.jax_compilation_cache_dir}
    report["in_use"] = compilation_cache.use_compilation_cache()
    parse_gin(["runs/demo.gin"], ["train.batch_size = 8", "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
                                  "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1"])
    spec = loop.run_spec_from_gin()
    mesh = partitioning.make_mesh(spec.mesh_config)
    trainer = spec.trainer(mesh)
    entries = lambda: sorted(name for name in os.listdir(report["in_use"])
                             if name.startswith(("jit_init", "jit_train_step")) and name.endswith("-cache"))
    trainer.compile_init_state(jax.random.key(0))
    trainer.compile_train_step(spec.abstract_batch(trainer.batch_sharding), jax.random.key(1))
    report["ahead"] = entries()
    state = trainer.init_state(jax.random.key(0))
    import numpy as np
    batch = {k: np.ones(v.shape, v.dtype) for k, v in spec.abstract_batch(trainer.batch_sharding).items()}
    state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
    jax.block_until_ready(metrics)
    report["after_calls"] = entries()
    report["modules"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print("REPORT" + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("startup")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PTMJAX_COMPILATION_CACHE_DIR=str(folder / "cache"), PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=folder, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("REPORT"))
    return folder, json.loads(line.removeprefix("REPORT"))


def test_auto_is_ptmjax_compilation_cache_dir_and_the_calls_load_what_was_compiled_ahead(fresh_process):
    folder, report = fresh_process
    assert report["before"] is None and report["in_use"] == str(folder / "cache")
    assert [name.split("-")[0] for name in report["ahead"]] == ["jit_init", "jit_train_step"]
    assert report["after_calls"] == report["ahead"]  # the calls' own keys: the same programs, no new entries


def test_training_imports_neither_torch_nor_transformers(fresh_process):
    assert fresh_process[1]["modules"] == []


def test_a_cache_jax_already_has_wins_and_none_adds_none(monkeypatch, tmp_path):
    assert jax.config.jax_compilation_cache_dir  # tests/conftest.py sets one
    assert compilation_cache.use_compilation_cache(str(tmp_path)) == jax.config.jax_compilation_cache_dir
    assert compilation_cache.use_compilation_cache(None) == jax.config.jax_compilation_cache_dir
    updates = []
    monkeypatch.setattr(compilation_cache, "_jax_cache_dir", lambda: None)
    monkeypatch.setattr(compilation_cache, "_set_jax_cache_dir", updates.append)
    assert compilation_cache.use_compilation_cache(None) is None and updates == []
    assert compilation_cache.use_compilation_cache(str(tmp_path / "c")) == str(tmp_path / "c")
    assert updates == [str(tmp_path / "c")] and (tmp_path / "c").is_dir()


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("PTMJAX_CACHE_DIR", str(tmp_path))
    assert compilation_cache.default_directory() == str(tmp_path / "compilation_cache")
    monkeypatch.setenv(compilation_cache.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert compilation_cache.default_directory() == str(tmp_path / "mine")


def test_compile_ahead_waits_and_keeps_failures_to_itself():
    done = []

    def fails():
        raise RuntimeError("no such shape")

    ahead = CompileAhead({"ok": lambda: done.append(1), "bad": fails})
    ahead.wait("ok")
    ahead.wait("missing")  # no such job: nothing to wait for
    ahead.wait_all()
    assert done == [1] and isinstance(ahead.failed["bad"], RuntimeError) and "ok" not in ahead.failed


def test_startup_line_sums_its_phases(monkeypatch):
    import ptmjax
    from ptmjax.training import startup

    now = iter([10.0, 12.5, 13.0, 13.0])
    monkeypatch.setattr(startup.time, "perf_counter", lambda: next(now))
    monkeypatch.setattr(ptmjax, "IMPORTED_AT", 4.0)
    clock = StartupClock("imports and gin")
    clock.mark("checks")
    clock.mark("first step")
    clock.mark("first step")
    assert clock.line() == (
        "Start-up: 9.0 s from importing ptmjax to the first step done (imports and gin 6.0 s, checks 2.5 s, "
        "first step 0.5 s)"
    )


def test_training_with_programs_compiled_ahead_is_identical(tmp_path):
    from ptmjax.models import EncoderDecoder, T5Config
    from ptmjax.training.loop import train

    config = T5Config(
        vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
        num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
    )

    def losses(name, compile_ahead):
        train(
            str(tmp_path / name), model=EncoderDecoder(config), task_feature_lengths={"inputs": 32, "targets": 8},
            batch_size=8, num_steps=3, log_every=1, eval_every=3, eval_batches=1, show_progress=False,
            compile_ahead=compile_ahead,
        )
        with open(tmp_path / name / "metrics.jsonl") as f:
            return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

    assert jax.config.jax_compilation_cache_dir  # the cache compile_ahead needs (tests/conftest.py)
    assert losses("ahead", True) == losses("plain", False)
