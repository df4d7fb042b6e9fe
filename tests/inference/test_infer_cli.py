"""`ptmjax infer` on a tiny trained run: its JSONL equals `LoadedModel.predict` on the same inputs;
it never overwrites an output without --overwrite, an empty input file and a binding of anything but
DecodeConfig are one-line errors, invalid UTF-8 in a file or on standard input is replaced with a warning naming
the lines, and a second run reads its programs from the compilation cache."""

import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import seqio

from ptmjax import cli
from ptmjax.tools import infer

PROMPTS = ["def f(x):", "Return.", "a + b"]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_text_file_predictions_equal_generate(t5_run, t5_model, tmp_path, capsys):
    """Loaded by the CLI on the default mesh (8 devices), the same as the 1-device model's predictions."""
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    args = ["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "prompts.txt"), "--max_decode_length=6"]
    assert cli.main(args) == 0
    records = read_jsonl(f"{t5_run}/inference/prompts.jsonl")
    want = t5_model.predict(PROMPTS, max_decode_length=6)
    assert [r["inputs"] for r in records] == PROMPTS and all("targets" not in r for r in records)
    assert [r["prediction"] for r in records] == [p.outputs[0] for p in want]
    np.testing.assert_allclose([r["score"] for r in records], [p.scores[0] for p in want], rtol=1e-5)
    assert "Decoded 3 examples" in capsys.readouterr().out


def test_task_split_predictions_equal_predict_on_its_examples(t5_run, t5_model, tmp_path, monkeypatch):
    monkeypatch.setattr(infer, "load", lambda path, **kwargs: t5_model)  # the session's compiled model
    output = tmp_path / "out.jsonl"
    args = ["infer", "--model_dir", t5_run, "--task", "ptmjax_stdlib_span_corruption_byte", "--max_examples=3",
            "--output", str(output), "--method=beam", "--num_decodes=2", "--max_decode_length=6",
            "--gin_bindings=DecodeConfig.num_beams = 3"]
    assert cli.main(args) == 0
    task = seqio.get_mixture_or_task("ptmjax_stdlib_span_corruption_byte")
    examples = list(task.get_dataset({"inputs": 32, "targets": 8}, split="validation", shuffle=False, num_epochs=1,
                                     seed=0).take(3).as_numpy_iterator())
    want = t5_model.predict([e["inputs"] for e in examples], method="beam", num_beams=3, num_decodes=2,
                            max_decode_length=6)
    records = read_jsonl(output)
    vocabulary = t5_model.vocabulary
    assert [r["targets"] for r in records] == [vocabulary.decode(e["targets"].tolist()) for e in examples]
    assert [r["inputs"] for r in records] == [vocabulary.decode(e["inputs"].tolist()) for e in examples]
    assert [r["prediction"] for r in records] == [list(p.outputs) for p in want]
    np.testing.assert_allclose([r["score"] for r in records], [p.scores for p in want], rtol=1e-5)


def test_an_existing_output_is_kept_without_overwrite(t5_run, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("hello\n")
    output = tmp_path / "out.jsonl"
    output.write_text("earlier results\n")
    args = ["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "prompts.txt"), "--output", str(output)]
    assert cli.main(args) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "out.jsonl exists; pass --overwrite" in error
    assert output.read_text() == "earlier results\n"


def test_an_empty_input_file_is_a_one_line_error(t5_run, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    assert cli.main(["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "empty.txt")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "empty.txt has no lines; write one prompt per line" in error


def test_a_binding_of_the_model_is_a_one_line_error(t5_run, tmp_path, capsys):
    """The model is the saved one: a binding of its config would be ignored, so it is refused, naming it."""
    (tmp_path / "prompts.txt").write_text("hello\n")
    args = ["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "prompts.txt"),
            "--output", str(tmp_path / "out.jsonl"), "--gin_bindings=T5Config.dropout_rate = 0.5"]
    assert cli.main(args) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "'T5Config.dropout_rate = 0.5': eval and infer bind only DecodeConfig" in error
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow  # two fresh processes
def test_a_second_run_compiles_nothing_and_predicts_the_same(t5_run, tmp_path):
    """Every program of the first run is in PTMJAX_COMPILATION_CACHE_DIR afterwards (any compile time is cached
    here); the second finds them all there, so it writes no entry, and predicts the same."""
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PTMJAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    entries, records = [], []
    for run in range(2):
        output = tmp_path / f"run{run}.jsonl"
        command = [sys.executable, "-m", "ptmjax.cli", "infer", "--model_dir", t5_run, "--input_file",
                   str(tmp_path / "prompts.txt"), "--output", str(output), "--max_decode_length=6"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        entries.append(sorted(os.listdir(tmp_path / "cache")))
        records.append(read_jsonl(output))
    assert any(name.startswith("jit_") for name in entries[0])
    assert entries[1] == entries[0] and records[1] == records[0]


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_invalid_utf8_is_replaced_with_a_warning_naming_its_lines(t5_run, tmp_path, monkeypatch, source):
    data = b"def f(x):\nReturn \xff\xfe now.\na + b\n"
    if source == "stdin":
        monkeypatch.setattr(sys, "stdin", type("Stdin", (), {"buffer": io.BytesIO(data)})())
        input_file, name, where = "-", "stdin", "standard input"
    else:
        (tmp_path / "bytes.txt").write_bytes(data)
        input_file, name, where = str(tmp_path / "bytes.txt"), "bytes", str(tmp_path / "bytes.txt")
    args = ["infer", "--model_dir", t5_run, "--input_file", input_file, "--max_decode_length=4",
            "--output", str(tmp_path / f"{name}.jsonl")]
    with pytest.warns(UserWarning, match=rf"^{re.escape(where)}: invalid UTF-8 on line\(s\) 2, replaced by U\+FFFD"):
        assert cli.main(args) == 0
    records = read_jsonl(tmp_path / f"{name}.jsonl")
    assert [r["inputs"] for r in records] == ["def f(x):", "Return \ufffd\ufffd now.", "a + b"]
