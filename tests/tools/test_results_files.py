"""Results files and the tables the pages state from them: a script rewrites only its own marked tables, and a
results record names the commit it was measured at."""

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
