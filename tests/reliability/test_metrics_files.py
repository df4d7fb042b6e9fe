"""metrics.jsonl and TensorBoard survive a crash and a resume: rewritten by rename, a torn line skipped,
replayed steps logged once."""

import json
import os
import shutil

import pytest
from reliability_helpers_b import event_counts, records, run
from tensorboard_helpers import tensorboard_scalars

from ptmjax.training import metrics_log
from ptmjax.training.metrics_log import MetricsLog


def test_a_crash_while_a_resume_rewrites_metrics_keeps_every_record(tmp_path, monkeypatch):
    log = MetricsLog(str(tmp_path))
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(lines))

    def killed(record):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(metrics_log.json, "dumps", killed)
    with pytest.raises(KeyboardInterrupt):
        log.truncate_after(2)
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(lines)


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2 is not JSON .*; fix or delete that line"):
        MetricsLog(str(tmp_path)).records()


@pytest.mark.slow
def test_resume_after_a_crash_skips_a_torn_line_and_logs_each_replayed_step_once(tmp_path):
    run(tmp_path, num_steps=3)
    shutil.rmtree(tmp_path / "checkpoints" / "3")  # the crash came before step 3 was saved
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # and in the middle of a write

    with pytest.warns(UserWarning, match=f"torn last line 6 of {tmp_path / 'metrics.jsonl'}"):
        run(tmp_path, num_steps=4)

    kept = records(tmp_path)
    assert [r["step"] for r in kept if "loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in kept if "eval_loss" in r] == [2, 4]
    train_counts, eval_counts = (
        event_counts(tmp_path / "tensorboard" / "train"),
        event_counts(tmp_path / "tensorboard" / "eval"),
    )
    assert {step: n for (tag, step), n in train_counts.items() if tag == "loss"} == {1: 1, 2: 1, 3: 1, 4: 1}
    assert {step: n for (tag, step), n in eval_counts.items() if tag == "loss"} == {2: 1, 4: 1}
    replayed = tensorboard_scalars(tmp_path / "tensorboard" / "train")["loss"][3]
    assert replayed == pytest.approx(next(r["loss"] for r in kept if r["step"] == 3), rel=1e-6)
    assert sorted(os.listdir(tmp_path / "tensorboard" / "train")) == sorted(
        n for n in os.listdir(tmp_path / "tensorboard" / "train") if "tfevents" in n
    )  # no temporary file left behind
