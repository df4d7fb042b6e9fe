"""experiments/multilingual/run.py: the committed results hold every arm at three seeds with figures in range, and
the smoke setting pre-trains, retrieves, fine-tunes and translates (warm-started encoder-decoder, BLEU and chrF)
every arm end to end on this machine's catalogs."""

import json
import pathlib

import pytest
from data.gettext_files import machine_locales_or_skip
from test_docs import script_module

RUN = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "multilingual" / "run.py"


def test_the_committed_results_hold_every_arm_at_three_seeds():
    results = json.loads((RUN.parent / "results.json").read_text())
    assert len(results["runs"]) == 12 and len(results["summary"]) == 4
    for figures in results["summary"].values():
        for key in ("retrieval_en_to_x", "retrieval_x_to_en", "transfer", "english", "bleu", "chrf"):
            low, high = figures[key]["ci95"]
            assert len(figures[key]["seeds"]) == 3 and low <= figures[key]["mean"] <= high


@pytest.mark.slow  # a vocabulary, 4 tiny pre-trainings of 3 steps, their evaluations and 8 translation fine-tunings
@pytest.mark.timeout(1800)
def test_the_smoke_setting_runs_every_arm(tmp_path, monkeypatch):
    run = script_module("experiments/multilingual/run.py", monkeypatch)
    if machine_locales_or_skip(*run.LOCALES) != run.LOCALES:
        pytest.skip(f"this machine lacks catalogs of some of {run.LOCALES}")
    run.main(["--setting", "smoke", "--runs_dir", str(tmp_path / "runs"), "--out_dir", str(tmp_path)])
    results = json.loads((tmp_path / "results_smoke.json").read_text())
    assert list(results["summary"]) == list(run.ARMS)
    for result in results["runs"]:
        assert set(result["retrieval"]) == set(run.LOCALES)
        assert set(result["classification"]) == {"en", *run.LOCALES}
        assert all(0 <= v["en_to_x"] <= 1 and v["pairs"] == 20 for v in result["retrieval"].values())
        assert set(result["translation"]) == {"de", "fr"}
        assert all(0 <= v["chrf"] <= 100 and v["pairs"] == 8 for v in result["translation"].values())
    assert (tmp_path / "multilingual_smoke.png").stat().st_size > 0
