"""`ptmjax convert` never writes over a user's folder: a training run or a Hugging Face directory given as the
target is refused, with what it holds named, and left byte for byte as it was; `--overwrite` replaces it whole;
importing the same directory again is allowed; a failed convert leaves nothing behind."""

import os
import pathlib

import pytest

from ptmjax import cli


@pytest.fixture
def hf_dir(hf_gpt2_dir):
    return str(hf_gpt2_dir)


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def training_run(folder: pathlib.Path) -> dict[str, bytes]:
    """A run's folder as a user has it: its config, metrics and three checkpoints (files are enough here)."""
    (folder / "config.gin").parent.mkdir(parents=True)
    (folder / "config.gin").write_text("train.num_steps = 300\n")
    (folder / "metrics.jsonl").write_text('{"step": 300, "loss": 2.5}\n')
    for step in (100, 200, 300):
        (folder / "checkpoints" / str(step)).mkdir(parents=True)
        (folder / "checkpoints" / str(step) / "state").write_bytes(os.urandom(64))
    return snapshot(folder)


def staging_left(parent: pathlib.Path) -> list[str]:
    return [name for name in os.listdir(parent) if ".writing-" in name]


def test_an_import_into_a_training_run_is_refused_and_leaves_it_as_it_was(tmp_path, hf_dir, capsys):
    run = tmp_path / "run"
    before = training_run(run)
    assert cli.main(["convert", "--from-hf", hf_dir, "--to", str(run)]) == 1
    error = capsys.readouterr().err
    assert f"{run} is not empty (it holds checkpoints, config.gin, metrics.jsonl)" in error
    assert "give --to a new folder, or add --overwrite" in error
    assert snapshot(run) == before and staging_left(tmp_path) == []


def test_overwrite_replaces_the_run_whole(tmp_path, hf_dir):
    run = tmp_path / "run"
    training_run(run)
    assert cli.main(["convert", "--from-hf", hf_dir, "--to", str(run), "--overwrite"]) == 0
    assert sorted(os.listdir(run)) == ["checkpoints", "config.gin", "generation.json"]
    assert os.listdir(run / "checkpoints") == ["0"]
    assert (run / "config.gin").read_text().startswith(f"# Imported from {hf_dir}")


def test_importing_the_same_directory_again_is_allowed(tmp_path, hf_dir):
    imported = tmp_path / "imported"
    assert cli.main(["convert", "--from-hf", hf_dir, "--to", str(imported)]) == 0
    config = (imported / "config.gin").read_text()
    assert cli.main(["convert", "--from-hf", hf_dir, "--to", str(imported)]) == 0
    assert (imported / "config.gin").read_text() == config and os.listdir(imported / "checkpoints") == ["0"]


def test_an_export_into_a_users_folder_is_refused_and_overwrite_replaces_it_whole(tmp_path, hf_dir, capsys):
    imported, target = tmp_path / "imported", tmp_path / "hf_out"
    assert cli.main(["convert", "--from-hf", hf_dir, "--to", str(imported)]) == 0
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "bert"}')
    (target / "notes.txt").write_text("mine")
    before = snapshot(target)
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(target)]) == 1
    assert f"{target} is not empty (it holds config.json, notes.txt)" in capsys.readouterr().err
    assert snapshot(target) == before
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(target), "--overwrite"]) == 0
    assert "notes.txt" not in os.listdir(target) and '"gpt2"' in (target / "config.json").read_text()
    assert staging_left(tmp_path) == []


def test_a_failed_import_leaves_nothing(tmp_path, hf_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(pathlib.Path(hf_dir, "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    target = tmp_path / "target"
    assert cli.main(["convert", "--from-hf", str(broken), "--to", str(target)]) == 1
    assert not target.exists() and staging_left(tmp_path) == []


def test_a_damaged_safetensors_file_is_named(tmp_path, hf_dir, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(pathlib.Path(hf_dir, "config.json").read_text())
    weights = pathlib.Path(hf_dir, "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # a truncated copy
    assert cli.main(["convert", "--from-hf", str(broken), "--to", str(tmp_path / "target")]) == 1
    error = capsys.readouterr().err
    assert f"{broken / 'model.safetensors'} is not a readable safetensors file" in error and "truncated" in error
