"""Results files and the tables the pages state from them: a script rewrites only its own marked tables, and a
results record names the commit it was measured at."""

import json
import subprocess

import pytest

from ptmjax.tools import results_files

PAGE = """Intro.
<!-- table: a.py speed -->
| old |
<!-- end of table -->
Between.
<!-- table: b.py speed -->
| other script's |
<!-- end of table -->
"""


def test_a_script_rewrites_its_own_tables_and_no_other():
    text = results_files.with_tables(PAGE, "a.py", {"speed": "| new |\n"})
    assert text == PAGE.replace("| old |", "| new |")
    assert results_files.marked_tables(text) == [("a.py", "speed", "| new |\n"),
                                                 ("b.py", "speed", "| other script's |\n")]
    with pytest.raises(ValueError, match="a.py renders no table 'speed'; it renders \\['memory'\\]"):
        results_files.with_tables(PAGE, "a.py", {"memory": ""})


def test_a_record_names_the_commit_and_the_command():
    record = results_files.run_record("python benchmarks/x.py --fast")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head and record["command"] == "python benchmarks/x.py --fast"
    assert record["date"][:2] == "20" and "CPUs" in record["machine"]


def test_an_experiment_publishes_its_json_markdown_plot_and_readme_tables(tmp_path):
    (tmp_path / "README.md").write_text(PAGE)
    results = {"rows": {"a": 1.5}}
    plotted = []
    tables = lambda: {"speed": f"| {json.loads((tmp_path / 'results_x.json').read_text())['rows']['a']} |\n"}  # noqa: E731
    results_files.publish(tmp_path, "_x", results, "# x\n", lambda r, path: plotted.append((r, path)), "exp",
                          ("a.py", tables))
    assert json.loads((tmp_path / "results_x.json").read_text()) == results
    assert (tmp_path / "results_x.md").read_text() == "# x\n" and plotted == [(results, tmp_path / "exp_x.png")]
    assert (tmp_path / "README.md").read_text() == PAGE.replace("| old |", "| 1.5 |")  # after the JSON is written
    results_files.publish(tmp_path / "new", "", results, "", lambda r, path: None, "exp", ("a.py", tables))
    assert (tmp_path / "new" / "results.json").exists() and not (tmp_path / "new" / "README.md").exists()
