"""`train.init_checkpoint` and the Hugging Face export accept parameters saved in either layer layout."""

import dataclasses
import glob
import os

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn
from safetensors.numpy import load_file

from ptmjax import partitioning
from ptmjax.convert import checkpoint
from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import GPT2, Bert, BertConfig, GPT2Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.checkpoints import Checkpointer
from ptmjax.training.init_checkpoint import initial_params
from ptmjax.training.model_api import model_api
from ptmjax.training.trainer import Trainer

PLAIN = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16)
SCANNED = dataclasses.replace(PLAIN, scan_layers=True)
MESH = MeshConfig(data=2, fsdp=2, tensor=2)


def model_folder(path, config) -> dict:
    """A model folder as `ptmjax convert` writes it; returns its (host) parameters, unscanned."""
    params = jax.device_get(nn.unbox(model_api(GPT2(PLAIN)).init(jax.random.key(0))))
    path.mkdir()
    (path / "config.gin").write_text(checkpoint.model_gin(GPT2(config)))
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(0, scan(params, config) if config.scan_layers else params)
    checkpointer.close()
    return params


def trainer_for(model) -> Trainer:
    return Trainer(model, optax.sgd(0.1), lambda _: 0.1, partitioning.make_mesh(MESH), MESH.rules)


@pytest.mark.parametrize(
    "saved,wanted", [(PLAIN, SCANNED), (SCANNED, PLAIN)], ids=["plain_to_scanned", "scanned_to_plain"]
)
def test_init_checkpoint_converts_between_layer_layouts(tmp_path, saved, wanted):
    want = model_folder(tmp_path / "saved", saved)
    trainer = trainer_for(GPT2(wanted))
    params = initial_params(str(tmp_path / "saved"), trainer)
    assert jax.tree.map(lambda p: p.sharding, params) == trainer.state_shardings.params
    got = unscan(jax.device_get(params), wanted) if wanted.scan_layers else jax.device_get(params)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_init_checkpoint_of_another_model_names_the_mismatch(tmp_path):
    model_folder(tmp_path / "gpt2", PLAIN)
    bert = Bert(BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16))
    with pytest.raises(ValueError, match=r"does not hold Bert's parameters; only in the checkpoint: "):
        initial_params(str(tmp_path / "gpt2"), trainer_for(bert))


def test_export_of_a_scanned_model_folder_equals_the_plain_export(tmp_path):
    model_folder(tmp_path / "plain", PLAIN)
    model_folder(tmp_path / "scanned", SCANNED)
    for name in ("plain", "scanned"):
        checkpoint.export_hf(str(tmp_path / name), str(tmp_path / f"hf_{name}"))
    plain, scanned = (load_file(*glob.glob(str(tmp_path / f"hf_{n}" / "*.safetensors"))) for n in ("plain", "scanned"))
    assert plain.keys() == scanned.keys()
    for key in plain:
        np.testing.assert_array_equal(scanned[key], plain[key], err_msg=key)


def test_init_checkpoint_without_checkpoints_fails_first_and_creates_nothing(tmp_path, monkeypatch):
    """The folder is checked before the model is built: neither it nor the new run folder gains anything."""
    import gin

    from ptmjax import gin_files
    from ptmjax.training import loop, run_spec

    empty = tmp_path / "not_a_run"
    empty.mkdir()
    (empty / "notes.txt").write_text("kept")

    def no_trainer(*args, **kwargs):
        raise AssertionError("the trainer was built before the init_checkpoint folder was checked")

    monkeypatch.setattr(run_spec.RunSpec, "trainer", no_trainer)
    gin_files.parse_gin(["runs/demo.gin"], [f"train.init_checkpoint = '{empty}'", "train.show_progress = False"])
    try:
        with pytest.raises(FileNotFoundError, match=r"no checkpoint under .*not_a_run/checkpoints"):
            loop.train(str(tmp_path / "new_run"))
    finally:
        gin.clear_config()
    assert sorted(os.listdir(empty)) == ["notes.txt"]
    assert not (tmp_path / "new_run").exists()
