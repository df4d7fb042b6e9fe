"""Parameter/sharding tables: bytes against hand counts and real shards, checkpoints unrestored, CLI."""

import dataclasses
import json
import math
import os
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ptmjax import cli, partitioning
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.tools.inspection import format_bytes, inspect_arrays, inspect_checkpoint
from ptmjax.training.optimizers import adamw
from ptmjax.training.schedules import warmup_cosine
from ptmjax.training.trainer import Trainer

CONFIG = T5Config(
    vocab_size=128, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / (
    "experiments/inspect_sharded_checkpoint/inspect_sharded_checkpoint.ipynb"
)


def make_trainer(mesh_config: MeshConfig, config: T5Config = CONFIG) -> Trainer:
    schedule = warmup_cosine(peak_learning_rate=1e-3, warmup_steps=1, total_steps=10)
    return Trainer(EncoderDecoder(config), adamw(schedule), schedule,
                   partitioning.make_mesh(mesh_config), mesh_config.rules)


def write_run(model_dir, config: T5Config, state, fsdp: int = 8) -> str:
    """A run folder as `ptmjax train` leaves it: config.gin (saved on fsdp=8) and a checkpoint at step 3."""
    lines = ["train.model = @EncoderDecoder()", "EncoderDecoder.config = @T5Config()",
             "train.mesh_config = @MeshConfig()", "MeshConfig.data = 1", f"MeshConfig.fsdp = {fsdp}"]
    lines += [f"T5Config.{k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
    (model_dir / "config.gin").write_text("\n".join(lines) + "\n")
    checkpointer = Checkpointer(str(model_dir / "checkpoints"))
    checkpointer.save(3, state, {"batches_consumed": 3})
    checkpointer.close()
    return str(model_dir)


def leaves_by_path(tree):
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def fsdp8():
    trainer = make_trainer(MeshConfig(data=1, fsdp=8))
    return trainer, trainer.init_state(jax.random.key(0))


@pytest.fixture(scope="module")
def run_dir(fsdp8, tmp_path_factory):
    """A run folder as `ptmjax train` leaves it: config.gin and a checkpoint saved on fsdp=8."""
    return write_run(tmp_path_factory.mktemp("run"), CONFIG, fsdp8[1])


def test_live_bytes_and_specs_are_those_of_the_real_shards(fsdp8):
    trainer, state = fsdp8
    table = inspect_arrays(state.params, trainer.logical_axes)
    arrays = leaves_by_path(state.params)
    assert [r.path for r in table.rows] == list(arrays)
    for row in table.rows:
        array = arrays[row.path]
        assert row.spec == array.sharding.spec
        assert row.total_bytes == array.size * 4
        assert row.device_bytes == max(s.data.nbytes for s in array.addressable_shards)
        sharded_on_fsdp = "embed" in row.logical_axes
        assert row.device_bytes == (row.total_bytes // 8 if sharded_on_fsdp else row.total_bytes)
    # By hand: the [vocab=128, embed=32] float32 embedding, embed split 8 ways.
    embedding = table.row("token_embedder/embedding")
    assert (embedding.logical_axes, embedding.spec) == (("vocab", "embed"), P("tensor", "fsdp"))
    assert (embedding.total_bytes, embedding.device_bytes) == (128 * 32 * 4, 128 * 4 * 4)
    # The [buckets=32, heads=4] relative position bias is not on 'embed': replicated.
    relpos = table.row("encoder/relpos_bias/rel_embedding")
    assert (relpos.total_bytes, relpos.device_bytes) == (32 * 4 * 4, 32 * 4 * 4)

    totals = {t.module: t for t in table.totals()}
    assert list(totals) == ["decoder", "encoder", "token_embedder", "total"]
    assert totals["total"].total_bytes == 4 * sum(a.size for a in arrays.values())
    assert totals["total"].device_bytes == sum(r.device_bytes for r in table.rows)
    assert sum(totals[m].total_bytes for m in ("decoder", "encoder", "token_embedder")) == (
        totals["total"].total_bytes
    )


def test_optimizer_rows_show_zero_sharding(fsdp8):
    trainer, state = fsdp8
    table = inspect_arrays(state.params, trainer.logical_axes, opt_state=state.opt_state)
    mu = table.row("opt_state/1/0/mu/token_embedder/embedding")  # AdamW's first moment
    assert mu.logical_axes == ("vocab", "embed") and mu.device_bytes == 128 * 4 * 4
    opt = leaves_by_path(state.opt_state)
    assert table.total("opt_state").num_arrays == len(opt)
    assert table.total("opt_state").total_bytes == sum(a.nbytes for a in opt.values())


def test_checkpoint_is_read_without_restoring(fsdp8, run_dir):
    trainer, state = fsdp8
    live = inspect_arrays(state.params, trainer.logical_axes, opt_state=state.opt_state)
    arrays_before = len(jax.live_arrays())
    # 16 devices on an 8-device machine: only an unrestored, abstract layout can do this.
    sixteen = inspect_checkpoint(run_dir, {"fsdp": 16})
    saved = inspect_checkpoint(run_dir, {"fsdp": 8}, include_opt_state=True)
    assert len(jax.live_arrays()) == arrays_before
    assert saved.rows == live.rows
    assert saved.title.endswith("step 3")
    assert sixteen.total().total_bytes == live.total("total").total_bytes - live.total("opt_state").total_bytes
    assert sixteen.row("token_embedder/embedding").device_bytes == 128 * 2 * 4


def test_checkpoint_layout_on_another_mesh_equals_the_restored_arrays(run_dir):
    trainer = make_trainer(MeshConfig(data=2, fsdp=2, tensor=2))
    restored, _ = Checkpointer(os.path.join(run_dir, "checkpoints")).restore(
        trainer.abstract_state, trainer.state_shardings
    )
    actual = inspect_arrays(restored.params, trainer.logical_axes, opt_state=restored.opt_state)
    predicted = inspect_checkpoint(run_dir, {"data": 2, "fsdp": 2, "tensor": 2}, include_opt_state=True)
    assert predicted.rows == actual.rows
    assert predicted.mesh_shape == actual.mesh_shape == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}


def test_a_scanned_runs_optimizer_rows_mirror_its_unscanned_layers(tmp_path):
    """The optimizer sees scanned layers unscanned, so its state mirrors the unscanned parameters."""
    scanned = dataclasses.replace(CONFIG, scan_layers=True)
    trainer = make_trainer(MeshConfig(data=2, fsdp=2, tensor=2), scanned)
    state = trainer.init_state(jax.random.key(0))
    live = inspect_arrays(state.params, trainer.logical_axes, state.opt_state, opt_state_mirrors=trainer.optimizer_view)
    predicted = inspect_checkpoint(write_run(tmp_path, scanned, state), {"data": 2, "fsdp": 2, "tensor": 2},
                                   include_opt_state=True)
    assert predicted.rows == live.rows
    assert live.row("encoder/layers/mlp/wi/kernel").logical_axes == ("layers", "embed", "mlp")
    mu = live.row("opt_state/1/0/mu/encoder/layers_0/mlp/wi/kernel")
    assert mu.logical_axes == ("embed", "mlp") and mu.spec == P("fsdp", "tensor")


def test_cli_prints_the_table_and_totals(run_dir, capsys):
    assert cli.main(["inspect", run_dir, "--mesh", "fsdp=8", "--opt_state"]) == 0
    out = capsys.readouterr().out
    assert "token_embedder/embedding" in out and "(vocab, embed)" in out and "P('tensor', 'fsdp')" in out
    num_params = sum(math.prod(v.shape) for v in jax.tree.leaves(make_trainer(MeshConfig()).abstract_state.params))
    params_line = next(line for line in out.splitlines() if "│ token_embedder " in line)
    assert format_bytes(128 * 32 * 4) in params_line
    total_line = next(line for line in out.splitlines() if line.startswith("│ total "))
    assert format_bytes(4 * 3 * num_params + 4) in total_line  # params, mu, nu, count


def test_errors_name_the_bad_value(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"unknown mesh axes \['modle'\]; known: data, fsdp"):
        inspect_checkpoint(run_dir, {"modle": 2})
    with pytest.raises(ValueError, match=r"does not split evenly.*change the mesh shape"):
        inspect_checkpoint(run_dir, {"tensor": 8})  # 4 heads over 8 devices
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        inspect_checkpoint(str(tmp_path))
    with pytest.raises(TypeError, match="not a jax.Array"):
        inspect_arrays({"w": np.zeros(3)})


def test_html_for_notebooks(fsdp8):
    trainer, state = fsdp8
    html = inspect_arrays(state.params, trainer.logical_axes)._repr_html_()
    assert html.count("<table>") == 2 and "token_embedder/embedding" in html
    assert "P(&#x27;tensor&#x27;, &#x27;fsdp&#x27;)" in html


@pytest.mark.slow
def test_example_notebook_runs_top_to_bottom(tmp_path, monkeypatch, capsys):
    """Its code cells run in order, as a script, on this session's 8 devices."""
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored afterwards
    monkeypatch.setenv("PTMJAX_RUN_DIR", str(tmp_path / "run"))
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {}
    exec(compile("\n\n".join(cells), str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - the repository's notebook
    assert "<table" in namespace["live"]._repr_html_()  # what the notebook shows for the restored arrays
    out = capsys.readouterr().out
    assert "predicted fsdp=8 layout equals the restored arrays' actual layout" in out
    assert "fsdp=64" in out


def test_inspect_takes_a_relative_run_path(run_dir, monkeypatch, capsys):
    """`ptmjax inspect runs/demo`, as the README writes it: Orbax needs absolute paths, the tool makes them."""
    want = inspect_checkpoint(run_dir)
    monkeypatch.chdir(os.path.dirname(run_dir))
    relative = os.path.basename(run_dir)
    got = inspect_checkpoint(relative)
    assert got.rows == want.rows and dict(got.mesh_shape) == dict(want.mesh_shape)
    capsys.readouterr()
    assert cli.main(["inspect", relative]) == 0
    assert "token_embedder/embedding" in capsys.readouterr().out


@pytest.mark.slow
def test_minus_one_axis_fills_the_devices_the_run_saved_from_on_a_one_device_host(fsdp8, tmp_path):
    """A run saved on 8 devices with fsdp=-1 inspects in a fresh 1-device process as fsdp=8."""
    import subprocess
    import sys

    run = write_run(tmp_path, CONFIG, fsdp8[1], fsdp=-1)
    code = (
        "import jax; from ptmjax.tools.inspection import inspect_checkpoint; "
        f"t = inspect_checkpoint({run!r}); "
        "print(jax.device_count(), dict(t.mesh_shape)['fsdp'], t.row('token_embedder/embedding').device_bytes)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "8", str(128 * 32 * 4 // 8)]
