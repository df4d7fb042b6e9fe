"""`ptmjax quantize`: the folder it writes holds what `quantize_params` makes in memory, its config rebuilds the
quantized model, its kernels take a quarter of the bytes (int8), and a folder in the way is refused whole."""

import jax
import numpy as np
import pytest
from flax import linen as nn

from ptmjax import cli, gin_files
from ptmjax.compress.quantization import quantize_params, quantized
from ptmjax.convert import checkpoint
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, GPT2Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir

CONFIG = GPT2Config(vocab_size=64, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=16)


def float_folder(path, model=None):
    """A model folder of `model`'s (default: the tiny GPT-2's) initial parameters at step 7."""
    model = model or GPT2(CONFIG)
    params = jax.device_get(nn.unbox(model_api(model).init(jax.random.key(0))))
    path.mkdir()
    (path / "config.gin").write_text(checkpoint.model_gin(model))
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(7, params)
    checkpointer.close()
    return params


def kernel_bytes(params):
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return sum(leaf.nbytes for path, leaf in leaves if "layers_" in jax.tree_util.keystr(path)
               and jax.tree_util.keystr(path).endswith("['kernel']"))


@pytest.mark.parametrize("flags, weights, activations", [([], "int8", None),
                                                          (["--activations", "int8"], "int8", "int8")])
def test_the_written_folder_holds_the_in_memory_quantization(tmp_path, flags, weights, activations):
    params = float_folder(tmp_path / "float")
    target = tmp_path / "quantized"
    assert cli.main(["quantize", "--from", str(tmp_path / "float"), "--to", str(target), *flags]) == 0
    folder = ModelDir(str(target))
    model, _ = gin_files.read_model_config(folder)
    expected_model = quantized(GPT2(CONFIG), weights, activations)
    assert model == expected_model
    stored = folder.read_params(model_api(model).abstract_params, step=7)
    in_memory = jax.device_get(quantize_params(expected_model, params))  # jitted there: scales to an ulp
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), stored, in_memory)
    assert kernel_bytes(stored) * 4 == kernel_bytes(params)


def test_a_folder_in_the_way_or_a_quantized_source_is_refused(tmp_path, capsys):
    float_folder(tmp_path / "float")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert cli.main(["quantize", "--from", str(tmp_path / "float"), "--to", str(tmp_path / "taken")]) == 1
    assert "is not empty (it holds notes.txt); `ptmjax quantize` writes" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    assert cli.main(["quantize", "--from", str(tmp_path / "float"), "--to", str(tmp_path / "q")]) == 0
    assert cli.main(["quantize", "--from", str(tmp_path / "q"), "--to", str(tmp_path / "qq")]) == 1
    assert "holds a quantized model already" in capsys.readouterr().err


def test_a_quantized_folder_exports_to_transformers_dequantized(tmp_path, capsys):
    """The Hugging Face folder holds the dequantized kernels: GPT2LMHeadModel computes the weight-only int4 model's
    logits, and the export says what it dequantized."""
    import torch
    import transformers

    float_folder(tmp_path / "float")
    assert cli.main(["quantize", "--from", str(tmp_path / "float"), "--to", str(tmp_path / "q"), "--weights", "int4",
                     "--tile_size", "16"]) == 0
    assert "parameters" in capsys.readouterr().out
    assert cli.main(["convert", "--from", str(tmp_path / "q"), "--to-hf", str(tmp_path / "hf")]) == 0
    assert ": quantized int4 kernels dequantized to float32" in capsys.readouterr().out
    folder = ModelDir(str(tmp_path / "q"))
    model, _ = gin_files.read_model_config(folder)
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 10))
    ours = model.apply({"params": folder.read_params(model_api(model).abstract_params)}, tokens, enable_dropout=False)
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        theirs = hf_model(torch.as_tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
