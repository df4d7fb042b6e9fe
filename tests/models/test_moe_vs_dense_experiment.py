"""experiments/moe_vs_dense/run.py: the Switch model and its dense twin cost the same FLOPs per token up to the
router (counted by hand here), the wide dense model has the Switch model's parameters, the committed results hold
three seeds of every model, and the smoke setting trains and summarises every model end to end."""

import json
import math
import pathlib

import pytest
from test_docs import script_module

RUN = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "moe_vs_dense" / "run.py"


def test_the_switch_model_costs_its_dense_twin_plus_the_router(monkeypatch):
    run = script_module("experiments/moe_vs_dense/run.py", monkeypatch)
    setting = run.SETTINGS["reduced"]
    models = run.models(setting)
    lengths = run.lengths(setting)
    assert lengths == {"inputs": 64, "targets": 14}  # T5's span corruption: 15% noise in spans of mean 3
    dense, switch, wide = (run.cost(run.model_config(models[name]), lengths) for name in (run.DENSE, run.SWITCH,
                                                                                            run.WIDE))
    # The only MoE layers are layer 1 of each stack: a [64, 8] router over 64 encoder and 14 decoder positions,
    # forward and backward (3x), per row.
    router = 3 * 2 * 64 * 8 * (64 + 14)
    assert switch["training_flops_per_row"] == dense["training_flops_per_row"] + router
    assert 1 < switch["training_flops_per_token"] / dense["training_flops_per_token"] < 1.01
    # 7 more experts of gated-GELU FFN (3 matrices 64 x 128) in 2 layers, and the 2 routers.
    assert switch["parameters"] == dense["parameters"] + 2 * (7 * 3 * 64 * 128 + 64 * 8)
    assert models[run.WIDE].bindings == ("T5Config.d_ff = 576",)
    assert abs(wide["parameters"] / switch["parameters"] - 1) < 0.01


def test_the_committed_results_hold_three_seeds_of_every_model():
    """(tests/test_docs.py checks that the README's table is the one these results give.)"""
    results = json.loads((RUN.parent / "results_reduced.json").read_text())
    assert len(results["rows"]) == 3
    for name, row in results["rows"].items():
        assert [r["seed"] for r in row["runs"]] == [0, 1, 2], name
        assert row["curve"]["steps"][-1] == results["setting"]["steps"], name


@pytest.mark.slow  # 6 training runs of 6 steps: 138 s on 2 loaded cores, mostly compilation
@pytest.mark.timeout(1800)
def test_the_smoke_setting_trains_and_summarises_every_model(tmp_path, monkeypatch):
    run = script_module("experiments/moe_vs_dense/run.py", monkeypatch)
    setting = run.SETTINGS["smoke"]
    results = run.compare(setting, tmp_path)
    assert list(results["rows"]) == [run.DENSE, run.SWITCH, run.WIDE]
    for name, row in results["rows"].items():
        assert row["curve"]["steps"] == [3, 6], name
        assert all(math.isfinite(x) and 0 < x < math.log(2176) + 1 for x in row["final_eval_loss_by_seed"]), name
        low, high = row["final_eval_loss_ci95"]
        assert low <= row["final_eval_loss_mean"] <= high, name
        assert row["curve"]["train_seconds_mean"][0] < row["curve"]["train_seconds_mean"][1], name
    dense = results["rows"][run.DENSE]
    assert dense["vs_dense"] == 0 and dense["speedup_steps"] == 1  # the dense curve reaches its own end at its end
    json.dumps(results)
    table = run.table(results)
    assert all(f"| {name} |" in table for name in results["rows"])
