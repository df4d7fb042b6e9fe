"""A run with frozen parameters over an init checkpoint saves only what it trains, reads the rest from its base,
and resumes as if it had never stopped."""

import json
import os

import numpy as np
import pytest

from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import pretraining  # noqa: F401 - registers the built-in tasks
from ptmjax.training.run import train
from ptmjax.tree_paths import leaves_by_path, shapes_by_path

CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
DECODER = ("decoder/.*",)


def run(model_dir, num_steps, **options):
    settings = dict(log_every=1, eval_every=100, eval_batches=1, checkpoint_every=2, show_progress=False)
    return train(
        str(model_dir), model=EncoderDecoder(CONFIG), task_feature_lengths={"inputs": 32, "targets": 8},
        batch_size=8, num_steps=num_steps, **{**settings, **options},
    )


def params_of(model_dir) -> dict[str, np.ndarray]:
    return dict(leaves_by_path(ModelDir(model_dir).read_params(model_api(EncoderDecoder(CONFIG)).abstract_params)))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    run(folder, num_steps=2)
    return folder


@pytest.fixture(scope="module")
def whole(tmp_path_factory, base):
    """4 steps training only the decoder, over the base."""
    folder = tmp_path_factory.mktemp("whole")
    run(folder, num_steps=4, init_checkpoint=str(base), trainable=DECODER)
    return folder


def test_checkpoints_hold_the_trained_parameters_and_the_base_the_rest(whole, base):
    folder = ModelDir(whole)
    with open(folder.base_path) as f:
        assert json.load(f) == {"model_dir": str(base), "step": 2}
    saved = shapes_by_path(folder.state_metadata()["params"])
    assert saved.keys() == {p for p in shapes_by_path(model_api(EncoderDecoder(CONFIG)).abstract_params)
                            if p.startswith("decoder/")}
    got, base_params = params_of(folder.path), params_of(base)
    assert got.keys() == base_params.keys()
    for path, value in got.items():
        if path.startswith("decoder/"):
            assert not np.array_equal(value, base_params[path]), path
        else:
            np.testing.assert_array_equal(value, base_params[path], err_msg=path)


@pytest.mark.slow
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, base, whole):
    run(tmp_path / "resumed", num_steps=2, init_checkpoint=str(base), trainable=DECODER)
    run(tmp_path / "resumed", num_steps=4, init_checkpoint=str(base), trainable=DECODER)
    want, resumed = params_of(whole), params_of(tmp_path / "resumed")
    for path, value in want.items():
        np.testing.assert_array_equal(resumed[path], value, err_msg=path)


def test_a_moved_base_is_named(tmp_path, base, whole):
    os.rename(base, tmp_path / "moved")
    try:
        with pytest.raises(FileNotFoundError, match=r"takes the parameters it does not save from .*base.json\), which "
                                                    r"is gone \(no checkpoint under .*; put it back, or point"):
            params_of(whole)
    finally:
        os.rename(tmp_path / "moved", base)

