"""Figures measured once, kept in a results file, and stated from it: what a benchmark's or experiment's results
file records about its run, and the tables the pages state from such files.

A page's generated table lies between `<!-- table: SCRIPT NAME -->` and `<!-- end of table -->`, where SCRIPT is
the repository path of the script that writes the results file and NAME one of the tables its `tables()`
renders from that file ({NAME: Markdown}). The script rewrites its tables after a run (`rewrite_tables`), and
tests/test_docs.py checks that every marked table on the pages equals what its script renders now.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
from collections.abc import Callable

ISAS = (("amx_tile", "AVX-512 with AMX"), ("avx512_bf16", "AVX-512 with BF16"), ("avx512f", "AVX-512"),
        ("avx2", "AVX2"))  # /proc/cpuinfo's flag -> the vector instructions it means, widest first
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
        "machine": machine(),
        "commit": commit or "unknown",
        "command": command or " ".join(["python", *sys.argv]),
    }


def machine() -> str:
    """This machine in a few words: the processor, its widest vector instructions, the cores and the system."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        text = cpuinfo.read_text()
        found = re.search(r"^model name\s*: (.*)$", text, re.M)
        model = found[1].strip() if found else model
        found = re.search(r"^flags\s*: (.*)$", text, re.M)
        flags = set(found[1].split()) if found else flags
    widest = next((name for flag, name in ISAS if flag in flags), None)
    return ", ".join(filter(None, [model, widest, f"{os.cpu_count()} CPUs", platform.system()]))


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


def publish(directory: pathlib.Path, stem: str, results: dict, markdown: str,
            plot: Callable[[dict, pathlib.Path], None], plot_name: str,
            readme: tuple[str, Callable[[], dict[str, str]]] | None = None) -> None:
    """An experiment's results: `directory`/results`stem`.json and .md, the plot `plot_name``stem`.png and, with
    `readme` = (script, tables), its README's tables marked as `script`'s rewritten (`tables()` may read the new
    JSON file)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"results{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (directory / f"results{stem}.md").write_text(markdown)
    plot(results, directory / f"{plot_name}{stem}.png")
    page = directory / "README.md"
    if readme is not None and page.exists():
        rewrite_tables(page, readme[0], readme[1]())


def saved_entry(path: pathlib.Path, key: str, entry: dict) -> dict[str, dict]:
    """Writes `entry` under `key` into the JSON results file `path` (its other entries kept; the file and its folder
    made if new), and returns every entry the file now holds."""
    entries = json.loads(path.read_text()) if path.exists() else {}
    entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def spread(values: list[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """The range of a figure measured in several runs: '1.12–1.26x', or '57%' where they agree at `fmt`."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"
