"""Figures measured once, kept in a results file, and stated from it: what a benchmark's or experiment's results
file records about its run, and the tables the pages state from such files.

A page's generated table lies between `<!-- table: SCRIPT NAME -->` and `<!-- end of table -->`, where SCRIPT is
the repository path of the script that writes the results file and NAME one of the tables its `tables()`
renders from that file ({NAME: Markdown}). The script rewrites its tables after a run (`rewrite_tables`), and
tests/test_docs.py checks that every marked table on the pages equals what its script renders now.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re
import subprocess
import sys

TABLE = re.compile(r"<!-- table: (?P<script>\S+) (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end of table -->", re.S)


def run_record(command: str | None = None) -> dict[str, str]:
    """When, where, from which commit and by which command (default: this process's) a results file's figures
    were measured."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=pathlib.Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "commit": commit or "unknown",
        "command": command or " ".join(["python", *sys.argv]),
    }


def marked_tables(text: str) -> list[tuple[str, str, str]]:
    """(script, name, the table as the page states it) of every generated table of a page."""
    return [(m["script"], m["name"], m["body"]) for m in TABLE.finditer(text)]


def with_tables(text: str, script: str, tables: dict[str, str]) -> str:
    """`text` with every table it marks as `script`'s replaced by `tables[name]` (Markdown, ending in a newline)."""
    def replaced(match: re.Match) -> str:
        if match["script"] != script:
            return match[0]
        if match["name"] not in tables:
            raise ValueError(f"{script} renders no table {match['name']!r}; it renders {sorted(tables)}")
        return f"<!-- table: {script} {match['name']} -->\n{tables[match['name']]}<!-- end of table -->"

    return TABLE.sub(replaced, text)


def rewrite_tables(page: pathlib.Path, script: str, tables: dict[str, str]) -> None:
    """Rewrites `page`'s tables marked as `script`'s (see `with_tables`)."""
    page.write_text(with_tables(page.read_text(), script, tables))
