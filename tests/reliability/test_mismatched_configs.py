"""Every reader of a model folder (inspect, infer and ptmjax.load, eval, convert --from, probe) refuses a
checkpoint that its config.gin does not build, with the same one-line message naming paths and shapes, where it
once loaded the part that fits (a 2-layer checkpoint read as a 1-layer model) and exported or evaluated that."""

import dataclasses
import re

import pytest
from reliability_helpers_b import CONFIG, bind_model, run

import ptmjax
from ptmjax import cli

TWO_LAYERS = dataclasses.replace(CONFIG, num_encoder_layers=2)


@pytest.fixture(scope="module")
def edited_run(tmp_path_factory):
    """A run that saved a 2-layer encoder at step 2, whose config.gin was then edited to build 1 layer."""
    model_dir = tmp_path_factory.mktemp("edited_run")
    run(model_dir, num_steps=2, config=TWO_LAYERS)
    bind_model(model_dir, CONFIG)
    return model_dir


def refusal(model_dir) -> str:
    return (
        f"{model_dir / 'checkpoints'} (step 2) holds another model than {model_dir / 'config.gin'} builds: "
        "encoder/layers_1/attention/key/kernel is (32, 4, 8) there, absent here; "
    )


@pytest.mark.parametrize("command", [
    ["inspect", "{run}"],
    ["infer", "--model_dir", "{run}", "--input_file", "{prompts}", "--output", "{out}/predictions.jsonl"],
    ["eval", "--model_dir", "{run}", "--task", "ptmjax_stdlib_docstring_summary", "--max_examples", "2", "--output",
     "{out}/eval.json"],
    ["convert", "--from", "{run}", "--to-hf", "{out}/hf"],
    ["probe", "--model_dir", "{run}", "--out", "{out}/probe", "--max_length", "16"],
])
@pytest.mark.slow
def test_every_reader_refuses_a_checkpoint_its_config_does_not_build(edited_run, tmp_path, capsys, command):
    (tmp_path / "prompts.txt").write_text("def f(x):\n")
    args = [a.format(run=edited_run, prompts=tmp_path / "prompts.txt", out=tmp_path) for a in command]
    assert cli.main(args) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"ptmjax {command[0]}: error: {refusal(edited_run)}")
    assert error[0].endswith("Nothing was read: was config.gin edited after the checkpoint was saved? Put back the "
                             "config it was saved with (see docs/reliability.md)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt"]  # no output, not even a partial one


def test_ptmjax_load_refuses_it_too(edited_run):
    with pytest.raises(ValueError, match="^" + re.escape(refusal(edited_run))):
        ptmjax.load(str(edited_run))
