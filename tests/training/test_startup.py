"""Start-up: the compilation cache a run uses, the batch its train step is compiled for ahead of the data, the
start-up line, and what training imports."""

import glob
import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from ptmjax.training import compilation_cache
from ptmjax.training.startup import StartupClock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A fresh process, with no cache JAX knows of, runs the training path's first programs as `train` does and
# reports the compilation cache's hits and misses.
SCRIPT = textwrap.dedent(
    """
    import collections, json, os, sys
    import jax
    from jax import monitoring
    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from ptmjax.gin_files import parse_gin
    from ptmjax.training import compilation_cache, run
    from ptmjax import partitioning
    events = collections.Counter()
    monitoring.register_event_listener(lambda name, **kwargs: events.update([name.rsplit("/", 1)[-1]]))
    report = {"before": jax.config.jax_compilation_cache_dir}
    report["in_use"] = compilation_cache.use_compilation_cache()
    parse_gin(["runs/demo.gin"], ["train.batch_size = 8", "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
                                  "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1"])
    spec = run.run_spec_from_gin()
    mesh = partitioning.make_mesh(spec.mesh_config)
    trainer = spec.trainer(mesh)
    state = trainer.init_state(jax.random.key(0))
    import numpy as np
    batch = {k: np.ones(v.shape, v.dtype) for k, v in spec.abstract_batch(trainer.batch_sharding).items()}
    state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
    jax.block_until_ready(metrics)
    report["entries"] = sorted(name.split("-")[0] for name in os.listdir(report["in_use"])
                               if name.startswith(("jit_init", "jit_train_step")) and name.endswith("-cache"))
    report["hits"], report["misses"] = events["cache_hits"], events["cache_misses"]
    report["modules"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print("REPORT" + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The reports of the script run twice on one cache folder: a first run, then a run started again."""
    folder = tmp_path_factory.mktemp("startup")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PTMJAX_COMPILATION_CACHE_DIR=str(folder / "cache"), PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    reports = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=folder, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        line = next(line for line in out.stdout.splitlines() if line.startswith("REPORT"))
        reports.append(json.loads(line.removeprefix("REPORT")))
    return folder, reports


@pytest.mark.slow  # two fresh processes, each importing TensorFlow and compiling
def test_auto_is_ptmjax_compilation_cache_dir_and_a_run_started_again_compiles_nothing(two_processes):
    folder, (first, again) = two_processes
    assert first["before"] is None and first["in_use"] == str(folder / "cache")
    assert first["entries"] == ["jit_init", "jit_train_step"] and first["misses"] >= 2
    assert again["entries"] == first["entries"] and again["misses"] == 0 and again["hits"] >= 2


@pytest.mark.slow
def test_training_imports_neither_torch_nor_transformers(two_processes):
    assert two_processes[1][0]["modules"] == []


# A tiny T5's first training step, on a fixed batch, printed as its loss.
TINY_STEP = textwrap.dedent(
    """
    import jax, numpy as np
    from ptmjax import partitioning
    from ptmjax.models import EncoderDecoder, T5Config
    from ptmjax.training.optimizers import adamw
    from ptmjax.training.trainer import Trainer
    config = T5Config(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
                      num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True,
                      dropout_rate=0.0)
    mesh_config = partitioning.MeshConfig()
    trainer = Trainer(EncoderDecoder(config), adamw(lambda step: 1e-3), lambda step: 1e-3,
                      partitioning.make_mesh(mesh_config), mesh_config.rules)
    tokens = np.arange(2 * 8, dtype=np.int32).reshape(2, 8) % 60 + 2
    batch = {"encoder_input_tokens": tokens, "decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
             "decoder_loss_weights": np.ones_like(tokens)}
    state = trainer.init_state(jax.random.key(0))
    _, metrics = trainer.train_step(state, partitioning.global_batch(batch, trainer.mesh), jax.random.key(1))
    print("LOSS", repr(float(metrics["loss"])))
    """
)


def tiny_step_loss(prelude: str) -> list[str]:
    """The LOSS line of TINY_STEP run in a fresh process after `prelude`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    out = subprocess.run([sys.executable, "-c", prelude + TINY_STEP], env={**env, "PYTHONPATH": REPO},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith("LOSS")]


@pytest.mark.slow
def test_the_model_and_its_train_step_need_neither_tensorflow_nor_seqio():
    """So a GPU or TPU machine without TensorFlow benchmarks ptmjax as installed: only the data pipeline needs
    them. The step in a process where importing either fails gives the loss of one that has them, to the bit."""
    loss = tiny_step_loss('import sys; sys.modules["tensorflow"] = sys.modules["seqio"] = None  # imports fail\n')
    assert loss and loss == tiny_step_loss("import seqio\n")


DEMOS = sorted(os.path.relpath(path, os.path.join(REPO, "gin_configs"))
               for path in glob.glob(os.path.join(REPO, "gin_configs", "runs", "*demo.gin")))


@pytest.mark.parametrize("run_file", DEMOS)
def test_the_abstract_batch_is_the_pipelines_first_batch_on_the_devices(run_file):
    """What the loop compiles the train step for before reading data (and `ptmjax compile` compiles for): each
    demo's first train batch, as the prefetcher puts it on the mesh, has its fields, shapes, dtypes and shardings."""
    import gin

    from ptmjax import gin_files, partitioning
    from ptmjax.training import prepared_run, run

    gin_files.parse_gin([run_file], ["train.batch_size = 8"])
    try:
        spec = run.run_spec_from_gin()
        mesh = partitioning.make_mesh(spec.mesh_config)
        trainer = spec.trainer(mesh)
        dataset = prepared_run.run_dataset(gin.query_parameter("train.mixture_or_task_name"), "train",
                                           spec.task_feature_lengths, spec.batch_size,
                                           trainer.api.family.feature_converter, seed=0, pack=spec.pack,
                                           shuffle=True)
        batch = partitioning.global_batch(next(dataset.as_numpy_iterator()), mesh)
        abstract = spec.abstract_batch(trainer.batch_sharding)
    finally:
        gin.clear_config()
    assert {k: (v.shape, v.dtype, v.sharding) for k, v in abstract.items()} == {
        k: (v.shape, v.dtype, v.sharding) for k, v in batch.items()
    }


@pytest.mark.parametrize("run_file", ["runs/demo.gin", "runs/gpt2_demo.gin", "runs/bert_demo.gin"])
def test_initialisation_compiled_at_o1_on_the_cpu_gives_the_default_levels_bits(run_file, monkeypatch):
    """The train state's initialisation compiles at LLVM -O1 on the CPU (it runs once); its values must be the
    bits the default optimisation level gives."""
    import gin
    import numpy as np

    from ptmjax import gin_files, partitioning
    from ptmjax.training import run
    from ptmjax.training.trainer import Trainer

    gin_files.parse_gin([run_file])
    try:
        spec = run.run_spec_from_gin()
    finally:
        gin.clear_config()
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config))
    assert trainer._run_once_options == {"xla_backend_optimization_level": 1}
    fast = jax.device_get(trainer.init_state(jax.random.key(3)))
    monkeypatch.setattr(Trainer, "_run_once_options", property(lambda self: {}))
    default = jax.device_get(trainer.init_state(jax.random.key(3)))
    assert jax.tree.structure(fast) == jax.tree.structure(default)
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(default), strict=True):
        np.testing.assert_array_equal(a, b)


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


def test_a_folder_that_cannot_be_created_warns_and_caches_nothing(monkeypatch, tmp_path):
    updates = []
    monkeypatch.setattr(compilation_cache, "_jax_cache_dir", lambda: None)
    monkeypatch.setattr(compilation_cache, "_set_jax_cache_dir", updates.append)
    (tmp_path / "a_file").write_text("")
    with pytest.warns(UserWarning, match=r"cannot create .*a_file/cache \(Not a directory\); set \$PTMJAX_COMP"):
        assert compilation_cache.use_compilation_cache(str(tmp_path / "a_file" / "cache")) is None
    assert updates == []


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("PTMJAX_CACHE_DIR", str(tmp_path))
    assert compilation_cache.default_directory() == str(tmp_path / "compilation_cache")
    monkeypatch.setenv(compilation_cache.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert compilation_cache.default_directory() == str(tmp_path / "mine")


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
