"""experiments/compression/run.py: the committed results hold every row the script makes, at three seeds, with
what each method must give whatever the scores (a quantized model is smaller on disk, a pruned one sparser, a
half-depth student half as deep, PoWER-BERT's layers compute fewer positions, DeeBERT's exits at threshold 0 the
baseline's own predictions, as they train over a frozen baseline); the smoke setting makes and measures every row
end to end."""

import json
import pathlib

import pytest
from test_docs import script_module

RUN = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "compression" / "run.py"


def check_invariants(results, run):
    """What each row must hold against the float baseline of the same seeds, whatever the scores."""
    names = [row.name for row in run.rows(run.SETTINGS[results["setting"]["name"]])]
    assert [row["name"] for row in results["rows"]] == names
    by_name = {row["name"]: row for row in results["rows"]}
    float_row, layers = by_name[run.FLOAT], results["setting"]["num_layers"]
    for name, row in by_name.items():
        assert len(row["seeds"]) == len(results["setting"]["seeds"]), name
        for seed, float_seed in zip(row["seeds"], float_row["seeds"], strict=True):
            assert 0 <= seed["accuracy"] <= 1 and len(seed["correct"]) == len(float_seed["correct"]), name
            if "(PTQ)" in name or "(QAT)" in name:
                assert seed["disk_bytes"] < 0.8 * float_seed["disk_bytes"], name
            if name.startswith("magnitude"):
                assert seed["nonzero_parameters"] < 0.9 * seed["parameters"], name
            if name.startswith("heads pruned"):
                assert seed["parameters"] < float_seed["parameters"], name
            if name.startswith("PoWER-BERT"):  # a searched retention keeps what the search found: any count
                kept = seed["tokens"]["tokens_kept"]
                assert list(kept) == sorted(kept, reverse=True) and seed["tokens"]["flops_ratio"] < 1.01, name
                if "searched" not in name:
                    assert seed["tokens"]["token_layers"] < 0.6 and seed["tokens"]["flops_ratio"] < 0.7, name
            if name.startswith("early exit") and row["exit_threshold"] == 0:
                assert seed["correct"] == float_seed["correct"], name
                assert seed["exits"]["average_exit_layer"] == layers, name
        low, high = results["summary"][name]["ci95"]
        assert low <= results["summary"][name]["mean"] <= high, name
    assert by_name["distilled to 1/2 depth: logits"]["layers"] == layers // 2


def test_the_committed_results_hold_every_row_at_three_seeds(monkeypatch):
    """(tests/test_docs.py checks that the README's table is the one these results give.)"""
    run = script_module("experiments/compression/run.py", monkeypatch)
    results = json.loads((RUN.parent / "results.json").read_text())
    assert results["setting"]["name"] == "reduced" and len(results["setting"]["seeds"]) == 3
    check_invariants(results, run)


@pytest.mark.slow  # every method's runs in the smoke setting, one seed
@pytest.mark.timeout(3600)
def test_the_smoke_setting_makes_and_measures_every_row(tmp_path, monkeypatch):
    run = script_module("experiments/compression/run.py", monkeypatch)
    results = run.compare(run.SETTINGS["smoke"], tmp_path)
    check_invariants(results, run)
    json.dumps(results)
    assert "| float baseline |" in run.report.table(results)
