"""`ptmjax prune-layers`: the folder holds the kept layers renumbered and rebuilds the shallower model, which computes
what the in-memory `prune_layers` does; per-stack keep-lists parse; bad keep-lists and a folder in the way are
refused in one line, leaving it as it was."""

import jax
import numpy as np
import pytest
from tools.test_quantize_command import float_folder

from ptmjax import cli, gin_files
from ptmjax.compress.layerdrop import prune_layers
from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tools.prune_layers import parse_keep

CONFIG = T5Config(vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=4,
                  num_decoder_layers=3, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0)


def logits(model, params):
    rng = np.random.default_rng(0)
    return model.apply({"params": params}, rng.integers(1, 64, (2, 9)), rng.integers(1, 64, (2, 5)),
                       enable_dropout=False)


def test_the_written_folder_is_the_shallower_model_prune_layers_makes(tmp_path, capsys):
    params = float_folder(tmp_path / "t5", EncoderDecoder(CONFIG))
    assert cli.main(["prune-layers", "--from", str(tmp_path / "t5"), "--to", str(tmp_path / "shallow"), "--keep",
                     "encoder=every_other", "--keep", "decoder=0,2"]) == 0
    assert "Kept layers encoder=every_other decoder=0,2" in capsys.readouterr().out
    folder = ModelDir(str(tmp_path / "shallow"))
    model, _ = gin_files.read_model_config(folder)
    expected_model, expected = prune_layers(EncoderDecoder(CONFIG), params, {"encoder": "every_other",
                                                                             "decoder": [0, 2]})
    assert model == expected_model
    assert (model.config.num_encoder_layers, model.config.num_decoder_layers) == (2, 2)
    stored = folder.read_params(model_api(model).abstract_params, step=7)
    jax.tree.map(np.testing.assert_array_equal, stored, expected)
    np.testing.assert_array_equal(stored["encoder"]["layers_1"]["mlp"]["wo"]["kernel"],
                                  params["encoder"]["layers_2"]["mlp"]["wo"]["kernel"])
    np.testing.assert_allclose(logits(model, stored), logits(expected_model, expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("values, keep", [(["every_other"], "every_other"), (["0,2,5"], [0, 2, 5]),
                                          (["encoder=1", "decoder=every_other"], {"encoder": [1],
                                                                                  "decoder": "every_other"})])
def test_keep_lists_parse(values, keep):
    assert parse_keep(values) == keep


def test_bad_keep_lists_and_a_folder_in_the_way_are_refused(tmp_path, capsys):
    float_folder(tmp_path / "t5", EncoderDecoder(CONFIG))
    source = ["prune-layers", "--from", str(tmp_path / "t5")]
    assert cli.main([*source, "--to", str(tmp_path / "a"), "--keep", "0,x"]) == 1
    assert "--keep '0,x' is neither 'every_other' nor layer indices" in capsys.readouterr().err
    assert cli.main([*source, "--to", str(tmp_path / "b"), "--keep", "0,1"]) == 1
    assert "is one list, but the model has the stacks" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert cli.main([*source, "--to", str(tmp_path / "taken"), "--keep", "every_other"]) == 1
    assert "is not empty (it holds notes.txt); `ptmjax prune-layers` writes" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
