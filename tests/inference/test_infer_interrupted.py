"""`ptmjax infer` interrupted (Ctrl-C or SIGTERM) keeps the predictions it made as a valid out.partial.jsonl, leaves
no temporary file, and `--resume` continues it to the file an uninterrupted run writes; outputs get the umask's
permissions, not a temporary file's private ones. (Was: Ctrl-C deleted every prediction, SIGTERM left a hidden
.infer-*.jsonl, and outputs were mode 0600.)"""

import json
import os
import signal

import pytest

from ptmjax import cli
from ptmjax.inference import LoadedModel

PROMPTS = [f"def f{i}(x):" for i in range(10)]  # two batches of the default 8


def interrupt_after_the_first_batch(monkeypatch, how: str) -> None:
    iter_predict = LoadedModel.iter_predict

    def interrupted(self, *args, **kwargs):
        batches = iter_predict(self, *args, **kwargs)

        def first_then_interrupt():
            yield next(batches)
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            raise KeyboardInterrupt

        return first_then_interrupt()

    monkeypatch.setattr(LoadedModel, "iter_predict", interrupted)


def infer_args(t5_run, tmp_path, output):
    return ["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "prompts.txt"), "--max_decode_length=4",
            "--output", str(output)]


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm"])
def test_an_interrupted_run_keeps_its_predictions_and_resume_finishes_them(t5_run, tmp_path, monkeypatch, capsys,
                                                                           how):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    assert cli.main(infer_args(t5_run, tmp_path, tmp_path / "whole.jsonl")) == 0
    whole = (tmp_path / "whole.jsonl").read_text().splitlines()

    output = tmp_path / "out.jsonl"
    with monkeypatch.context() as patched:
        interrupt_after_the_first_batch(patched, how)
        assert cli.main(infer_args(t5_run, tmp_path, output)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ptmjax infer: interrupted after 8 of 10 examples; kept their predictions in {tmp_path}/out.partial.jsonl; "
        "rerun the same command with --resume to decode the other 2"
    )
    partial = (tmp_path / "out.partial.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in partial] == [json.loads(line) for line in whole[:8]]
    assert sorted(os.listdir(tmp_path)) == ["out.partial.jsonl", "prompts.txt", "whole.jsonl"]  # no temporary file
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back

    assert cli.main(infer_args(t5_run, tmp_path, output)) == 1  # not started over by mistake
    assert "out.partial.jsonl holds the predictions of an interrupted run; pass --resume" in capsys.readouterr().err
    assert cli.main([*infer_args(t5_run, tmp_path, output), "--resume"]) == 0
    assert output.read_text().splitlines() == whole
    assert not (tmp_path / "out.partial.jsonl").exists()


def test_resume_refuses_a_partial_file_of_other_inputs(t5_run, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (tmp_path / "out.partial.jsonl").write_text(json.dumps({"inputs": "something else", "score": 0.0}) + "\n")
    assert cli.main([*infer_args(t5_run, tmp_path, tmp_path / "out.jsonl"), "--resume"]) == 1
    assert "out.partial.jsonl holds predictions of other inputs than these" in capsys.readouterr().err


def test_outputs_get_the_permissions_of_the_umask(t5_run, tmp_path):
    (tmp_path / "prompts.txt").write_text("hello\n")
    previous = os.umask(0o027)
    try:
        assert cli.main(infer_args(t5_run, tmp_path, tmp_path / "out.jsonl")) == 0
    finally:
        os.umask(previous)
    assert (tmp_path / "out.jsonl").stat().st_mode & 0o777 == 0o640
