"""experiments/decoding/decoding.ipynb runs top to bottom (on the session's tiny run, via PTMJAX_RUN_DIR)."""

import json
import os
import pathlib

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "experiments/decoding/decoding.ipynb"


def test_decoding_notebook_runs_top_to_bottom(t5_run, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored afterwards
    monkeypatch.setenv("PTMJAX_RUN_DIR", t5_run)
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {}
    exec(compile("\n\n".join(cells), str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - the repository's notebook
    assert namespace["beam_not_worse"]  # beam search (alpha=0) scores at least what greedy scores
    assert namespace["hf_greedy_matches"]  # the imported GPT-2's greedy text is transformers'
    assert len(namespace["samples"][0]) == 4 and "<table>" in namespace["model"]._repr_html_()
    assert "greedy text equals transformers': True" in capsys.readouterr().out
