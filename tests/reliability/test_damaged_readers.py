"""A damaged checkpoint stops every reader (infer, eval, convert --from, probe, ptmjax.load) with one line naming
the step, what is wrong and the previous step to read instead, which then reads. (Was: a 157-line TensorStore
traceback naming no step.)"""

import glob
import os

import pytest
from reliability_helpers_b import bind_model, run

import ptmjax
from ptmjax import cli
from ptmjax.storage.model_dir import DamagedCheckpointError


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
    """A run with checkpoints 2 and 4 whose newest has truncated array files."""
    model_dir = tmp_path_factory.mktemp("damaged_run")
    run(model_dir, num_steps=4)
    bind_model(model_dir)
    for path in glob.glob(str(model_dir / "checkpoints" / "4" / "state" / "ocdbt.process_0" / "d" / "*")):
        os.truncate(path, min(os.path.getsize(path), 100))
    return model_dir


def message_start(model_dir) -> str:
    return f"checkpoint step 4 in {model_dir / 'checkpoints'} is damaged (ValueError: "


@pytest.mark.parametrize("command", [
    ["infer", "--model_dir", "{run}", "--input_file", "{prompts}", "--output", "{out}/predictions.jsonl"],
    ["eval", "--model_dir", "{run}", "--task", "ptmjax_stdlib_docstring_summary", "--max_examples", "2",
     "--output", "{out}/eval.json"],
    ["convert", "--from", "{run}", "--to-hf", "{out}/hf"],
    ["probe", "--model_dir", "{run}", "--out", "{out}/probe", "--max_length", "16"],
])
@pytest.mark.slow
def test_every_reader_names_the_damaged_step_in_one_line_and_offers_the_previous(damaged_run, tmp_path, capsys,
                                                                                 command):
    (tmp_path / "prompts.txt").write_text("def f(x):\n")
    args = [a.format(run=damaged_run, prompts=tmp_path / "prompts.txt", out=tmp_path) for a in command]
    assert cli.main(args) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"ptmjax {command[0]}: error: {message_start(damaged_run)}")
    assert error[0].endswith("; read step 2 instead with --step 2 (in Python: step=2) (see docs/reliability.md)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt"]
    assert sorted(os.listdir(damaged_run / "checkpoints")) == ["2", "4"]  # a reader moves nothing


def test_ptmjax_load_names_it_and_reads_the_previous_step(damaged_run):
    with pytest.raises(DamagedCheckpointError) as raised:
        ptmjax.load(str(damaged_run))
    assert str(raised.value).startswith(message_start(damaged_run))
    assert ptmjax.load(str(damaged_run), step=2).source == f"{damaged_run} (step 2)"


@pytest.mark.slow
def test_a_step_deleted_while_it_is_read_is_named_as_such(tmp_path, monkeypatch):
    """What a reader of a folder being trained sees when the run's retention deletes the step it reads."""
    import shutil

    from ptmjax.storage.checkpoints import Checkpointer

    model_dir = tmp_path / "training"
    run(model_dir, num_steps=2)
    bind_model(model_dir)
    restore_params = Checkpointer.restore_params

    def rotated_out_meanwhile(self, *args, **kwargs):
        shutil.rmtree(model_dir / "checkpoints" / "2")
        return restore_params(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "restore_params", rotated_out_meanwhile)
    with pytest.raises(FileNotFoundError, match=(
        rf"^checkpoint step 2 in {model_dir}/checkpoints was deleted while it was read: a run training in this "
        r"folder rotated it out \(train.keep_checkpoints\); read again for the newest step, or once the run has "
        "stopped"
    )):
        ptmjax.load(str(model_dir))
