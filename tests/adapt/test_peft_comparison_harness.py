"""experiments/peft_comparison/run.py end to end in its smoke setting: every task and method runs as its own
`ptmjax train` process from a pre-trained backbone, its final checkpoint scores each validation half as the run's
own evaluation scored the whole split (the harness refuses a run where they differ), and the table reports what the
runs hold."""

import json
import pathlib

import pytest
from test_docs import script_module

RUN = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "peft_comparison" / "run.py"


def test_the_committed_results_hold_three_seeds_of_both_tasks():
    """(tests/test_docs.py checks that the README's table is the one these results give.)"""
    results = json.loads((RUN.parent / "results_reduced.json").read_text())
    assert len(results["tasks"]) == 2 and all(len(rows["full fine-tuning"]["test_by_seed"]) == 3
                                              for rows in results["tasks"].values())


@pytest.mark.slow  # 28 training processes and their evaluations: 24.5 minutes on 2 cores
@pytest.mark.timeout(2400)
def test_the_smoke_setting_runs_every_method_and_counts_its_trainable_parameters(tmp_path, monkeypatch):
    run = script_module("experiments/peft_comparison/run.py", monkeypatch)
    monkeypatch.setattr(run, "RUNS_DIR", tmp_path)
    setting = run.SETTINGS["smoke"]
    results = run.compare(setting)
    for task_name, rows in results["tasks"].items():
        assert set(rows) == set(run.methods(run.TASKS[task_name], setting.inputs_length))
        full = rows["full fine-tuning"]
        assert full["trainable"] == full["total"]
        for method, row in rows.items():
            low, high = row["test_ci95"]
            assert 0 <= low <= high <= 100 and row["peak_rss_mib"] > 0, (task_name, method)
            assert row["test_by_seed"] == {"0": row["test_mean"]}  # one seed and one learning rate in this setting
            assert list(row["dev_at_each_lr"]) == [f"{row['learning_rate']:g}"]
            if method in ("linear probe (frozen backbone)", "BitFit"):
                assert row["total"] == full["total"], method  # the others add their parameters
            if method != "full fine-tuning":
                assert row["trainable"] < 0.1 * row["total"], (task_name, method)  # prefix tuning's MLP: 8.1%
    json.dumps(results)
    assert "| full fine-tuning |" in run.table(setting, results)
