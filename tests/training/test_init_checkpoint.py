"""`train.init_checkpoint`: parameters saved in either layer layout, or shared in part with the model (a new
head), start a run; the Hugging Face export accepts either layout."""

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
from ptmjax.families.model_api import model_api
from ptmjax.layers.layer_stack import scan, unscan
from ptmjax.models import GPT2, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import MeshConfig
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.training.init_checkpoint import initial_params
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import leaves_by_path

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
    params = initial_params(str(tmp_path / "saved"), trainer, jax.random.key(1))
    assert jax.tree.map(lambda p: p.sharding, params) == trainer.state_shardings.params
    got = unscan(jax.device_get(params), wanted) if wanted.scan_layers else jax.device_get(params)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_init_checkpoint_of_another_model_names_the_mismatch(tmp_path):
    model_folder(tmp_path / "gpt2", PLAIN)
    bert = Bert(BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16))
    trainer = trainer_for(bert)
    with pytest.raises(ValueError, match=r"has layer parameters that Bert's layers lack: \['layers_0/pre_attention_la"):
        initial_params(str(tmp_path / "gpt2"), trainer, jax.random.key(1))


T5_TIED = T5Config(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2,
                   num_decoder_layers=2, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)
T5_UNTIED = dataclasses.replace(T5_TIED, tie_embeddings=False)  # adds decoder/logits_dense


def t5_folder(path, config) -> dict:
    """A model folder of `config`'s T5 with parameters from seed 0; returns them (host)."""
    params = jax.device_get(nn.unbox(model_api(EncoderDecoder(config)).init(jax.random.key(0))))
    path.mkdir()
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(0, params)
    checkpointer.close()
    return params


@pytest.mark.parametrize("scan_layers", [False, True], ids=["plain", "scanned"])
def test_partial_restore_initialises_exactly_the_new_parameters(tmp_path, capsys, scan_layers):
    saved = t5_folder(tmp_path / "tied", T5_TIED)
    model = dataclasses.replace(T5_UNTIED, scan_layers=scan_layers)
    trainer = trainer_for(EncoderDecoder(model))
    fresh = trainer.init_state(jax.random.key(1)).params
    fresh_host = jax.device_get(fresh)
    params = initial_params(str(tmp_path / "tied"), trainer, jax.random.key(1))
    assert jax.tree.map(lambda p: p.sharding, params) == trainer.state_shardings.params
    got = jax.device_get(params)
    if scan_layers:
        got, fresh_host = unscan(got, model), unscan(fresh_host, model)
    saved_leaves = dict(leaves_by_path(saved))
    for path, value in leaves_by_path(got):
        want = dict(leaves_by_path(fresh_host))[path] if path == "decoder/logits_dense/kernel" else saved_leaves[path]
        np.testing.assert_array_equal(value, want, err_msg=path)
    assert "1 newly initialised: decoder/logits_dense/kernel" in capsys.readouterr().out


def test_parameters_only_in_the_checkpoint_are_left_out(tmp_path, capsys):
    saved = t5_folder(tmp_path / "untied", T5_UNTIED)
    trainer = trainer_for(EncoderDecoder(T5_TIED))
    params = jax.device_get(initial_params(str(tmp_path / "untied"), trainer, jax.random.key(1)))
    saved_leaves = dict(leaves_by_path(saved))
    for path, value in leaves_by_path(params):
        np.testing.assert_array_equal(value, saved_leaves[path], err_msg=path)
    assert "1 in the checkpoint but not in the model, left out: decoder/logits_dense/kernel" in capsys.readouterr().out


def test_a_shared_parameter_of_another_shape_is_named(tmp_path):
    t5_folder(tmp_path / "untied", T5_UNTIED)
    trainer = trainer_for(EncoderDecoder(dataclasses.replace(T5_UNTIED, vocab_size=72)))
    with pytest.raises(ValueError, match=r"other shapes: decoder/logits_dense/kernel: checkpoint \(16, 64\), model "
                                         r"\(16, 72\); token_embedder"):
        initial_params(str(tmp_path / "untied"), trainer, jax.random.key(1))


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
    from ptmjax.training import run, run_spec

    empty = tmp_path / "not_a_run"
    empty.mkdir()
    (empty / "notes.txt").write_text("kept")

    def no_trainer(*args, **kwargs):
        raise AssertionError("the trainer was built before the init_checkpoint folder was checked")

    monkeypatch.setattr(run_spec.RunSpec, "trainer", no_trainer)
    gin_files.parse_gin(["runs/demo.gin"], [f"train.init_checkpoint = '{empty}'", "train.show_progress = False"])
    try:
        with pytest.raises(FileNotFoundError, match=r"no checkpoint under .*not_a_run/checkpoints"):
            run.train(str(tmp_path / "new_run"))
    finally:
        gin.clear_config()
    assert sorted(os.listdir(empty)) == ["notes.txt"]
    assert not (tmp_path / "new_run").exists()


def test_a_checkpoint_with_a_small_part_of_the_model_is_refused(tmp_path):
    """Only the token table (64 x 16 of the model's values) is saved: most likely another model's folder."""
    params = t5_folder(tmp_path / "full", T5_TIED)
    (tmp_path / "embeddings_only").mkdir()
    checkpointer = Checkpointer(str(tmp_path / "embeddings_only" / "checkpoints"), asynchronous=False)
    checkpointer.save_params(0, {"token_embedder": params["token_embedder"]})
    checkpointer.close()
    trainer = trainer_for(EncoderDecoder(T5_TIED))
    with pytest.raises(ValueError, match=r"does not hold EncoderDecoder's parameters: it has \d+% of their values"):
        initial_params(str(tmp_path / "embeddings_only"), trainer, jax.random.key(1))


def test_new_parameters_initialise_around_the_restored_ones(tmp_path):
    """Prompt tuning's 'vocab' init copies token embeddings: from the restored table, not a random one."""
    from ptmjax.adapt.prompt_tuning import prompt_tuning

    saved = t5_folder(tmp_path / "t5", T5_TIED)
    trainer = trainer_for(prompt_tuning(EncoderDecoder(T5_TIED), length=4, init="vocab"))
    params = jax.device_get(initial_params(str(tmp_path / "t5"), trainer, jax.random.key(1)))
    table = saved["token_embedder"]["embedding"]
    for row in params["encoder"]["soft_prompt"]:
        assert np.any(np.all(table == row, axis=1)), "a prompt row is not a row of the restored token table"
    np.testing.assert_array_equal(params["token_embedder"]["embedding"], table)
