"""Model folders are trusted input, but a Hugging Face index may not reach outside its folder."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from ptmjax import cli
from ptmjax.convert import hf

pytest.importorskip("transformers")


@pytest.fixture
def outside_weights(hf_gpt2_dir):
    """A real GPT-2 checkpoint folder, the one a hostile index points into."""
    return hf_gpt2_dir


def folder_with_index(directory, outside_weights, index: str, shard: str) -> str:
    """A Hugging Face folder whose only weights are those its index names, at `shard`."""
    os.makedirs(directory)
    shutil.copy(outside_weights / "config.json", directory / "config.json")
    (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": {"transformer.wte.weight": shard}}))
    return str(directory)


@pytest.mark.parametrize(
    "index, shard",
    [
        (hf.SAFETENSORS_INDEX, "../outside_weights/model.safetensors"),
        (hf.SAFETENSORS_INDEX, "shards/../../outside_weights/model.safetensors"),
        (hf.PYTORCH_INDEX, "ABSOLUTE"),
    ],
)
def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path, outside_weights, index, shard, capsys):
    os.symlink(outside_weights, tmp_path / "outside_weights")
    shard = str(outside_weights / "model.safetensors") if shard == "ABSOLUTE" else shard
    folder = folder_with_index(tmp_path / "hf", outside_weights, index, shard)
    with pytest.raises(ValueError, match=f"names the shard '{shard}', outside {folder}; a shard must be a file in"):
        hf.load(folder)
    assert cli.main(["convert", "--from-hf", folder, "--to", str(tmp_path / "imported")]) == 1
    assert f"names the shard '{shard}', outside" in capsys.readouterr().err
    assert not (tmp_path / "imported").exists()  # refused before anything is written


def test_an_index_with_shards_inside_the_folder_loads(tmp_path, outside_weights, tiny_gpt2):
    folder = folder_with_index(tmp_path / "hf", outside_weights, hf.SAFETENSORS_INDEX, "./shard-1.safetensors")
    shutil.copy(outside_weights / "model.safetensors", tmp_path / "hf" / "shard-1.safetensors")
    model, params = hf.load(folder)
    assert model.config == tiny_gpt2
    jax.tree.map(np.testing.assert_array_equal, params, hf.load(str(outside_weights))[1])


class RunsCode:
    """Unpickling this would call os.system."""

    def __reduce__(self):
        return (os.system, ("echo unpickled",))


def test_a_pickle_that_would_run_code_is_refused_in_one_line_and_never_run(tmp_path, outside_weights, capsys):
    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(outside_weights / "config.json", folder / "config.json")
    state = {**load_file(outside_weights / "model.safetensors"), "payload": RunsCode()}
    torch.save(state, folder / "pytorch_model.bin")
    assert cli.main(["convert", "--from-hf", str(folder), "--to", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "unpickled" not in captured.out
    assert captured.err.strip().splitlines() == [
        f"ptmjax convert: error: {folder}/pytorch_model.bin holds pickled objects other than tensors (Trying to load "
        "unsupported GLOBAL posix.system whose module posix is blocked); ptmjax never unpickles them, as they can "
        "run code: get the model as model.safetensors from its source, or save it again with "
        "save_pretrained(safe_serialization=True) where you trust it (see docs/models.md)"
    ]
    assert not (tmp_path / "out").exists()
