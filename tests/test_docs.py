"""The README, docs/ and the experiments' READMEs checked like code: every relative link and anchor resolves,
every repository path and gin file they name exists (and each gin file parses), every flag they give a
`ptmjax` command or a script of the repository is one it takes, every command or Python block is marked
as run by tests/test_doc_examples.py or as not run, with the reason (docs/documentation.md), and every generated
table is the one its script renders from its results file now (ptmjax/tools/results_files.py)."""

import argparse
import importlib.util
import pathlib
import re
import sys

import gin
import pytest

from ptmjax import cli, gin_files
from ptmjax.tools import results_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("experiments/*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
GIN_FILE = re.compile(r"(?<![\w/.-])((?:models|runs|mesh|objectives)/[\w./-]+\.gin)\b")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:ptmjax|tests|benchmarks|experiments|gin_configs|docs)/[\w./-]*\w)")
COMMAND = re.compile(r"ptmjax (train|eval|infer|probe|convert|compile|inspect)\b([^`\n]*(?:\\\n[^`\n]*)*)")
SCRIPT = re.compile(r"python (?:-m )?((?:benchmarks|experiments)/[\w/]+\.py)([^`\n]*(?:\\\n[^`\n]*)*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
EXAMPLE = re.compile(r"^(?P<marker>[^\n]*)\n+```(?P<language>bash|python)\n(?P<code>.*?)^```", re.M | re.S)
RUN, NOT_RUN = re.compile(r"<!-- run -->"), re.compile(r"<!-- not run: \S.{10,} -->")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
HISTORY = ROOT / "docs" / "performance_log.md"  # the one page that is a history (docs/documentation.md)
GENERATED = ("docs/_build", "docs/_api")  # what the site's build writes (docs/documentation.md), ignored by git
NAMED_NOT_FILES = {  # names the pages use as examples of something other than a file of the repository
    "runs/dmeo.gin": "the misspelling whose suggestion docs/training.md shows",
    "models/t5_1_1_xl.gin": "the size alias docs/training.md shows being resolved",
    "runs/imported/config.gin": "a user's import folder",
    "runs/imported_bert/config.gin": "a user's import folder",
    "runs/sentence_model/config.gin": "a user's import folder",
}


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page: pathlib.Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", [page for page in PAGES if page != HISTORY], ids=page_id)
def test_pages_say_what_holds_now_without_dates(page):
    """Dates belong to the results files and the performance log; the pages say what holds now."""
    dates = sorted(set(DATE.findall(page.read_text())))
    assert not dates, f"{page_id(page)} states the dates {dates}: say what holds now (a results file keeps when)"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_and_anchors_resolve(page):
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        assert destination.exists(), f"{page_id(page)} links to {target}, which does not exist"
        if anchor and destination.suffix == ".md":
            headings = [line.lstrip("#") for line in destination.read_text().splitlines() if line.startswith("#")]
            assert anchor in {github_anchor(h) for h in headings}, f"{page_id(page)}: no heading for #{anchor}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_named_paths_and_gin_files_exist(page):
    text = page.read_text()
    for name in GIN_FILE.findall(text):
        assert name in NAMED_NOT_FILES or (ROOT / "gin_configs" / name).exists() or (page.parent / name).exists(), (
            f"{page_id(page)} names {name}, which is not under gin_configs/")
    for name in REPO_PATH.findall(text):
        name = name.rstrip(".")
        if name.startswith(GENERATED):
            continue
        if not re.search(r"[<*{]|_$", name):  # patterns such as hf_<family>.py or t5_1_1_*.gin
            assert (ROOT / name).exists(), f"{page_id(page)} names {name}, which does not exist"


def test_every_gin_file_the_pages_name_parses():
    names = sorted({name for page in PAGES for name in GIN_FILE.findall(page.read_text())} - set(NAMED_NOT_FILES))
    assert len(names) > 20
    for name in names:
        if not (ROOT / "gin_configs" / name).exists():
            continue  # a file beside the page (an experiment's own), parsed by its experiment
        try:
            gin_files.parse_gin([name], [])
        finally:
            gin.clear_config()


def command_options() -> dict[str, set[str]]:
    """`ptmjax <command>` -> the options it takes (the top-level ones included)."""
    parser = cli._parser()
    top = {option for action in parser._actions for option in action.option_strings}
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {name: top | {o for a in command._actions for o in a.option_strings} for name, command in commands.items()}


def script_source(script: pathlib.Path) -> str:
    """A script's source and that of the modules beside it that it imports (where shared flags are added)."""
    source = script.read_text()
    siblings = re.findall(r"^(?:import|from) (\w+)", source, flags=re.M)
    return "\n".join([source, *((script.parent / f"{name}.py").read_text() for name in siblings
                                 if (script.parent / f"{name}.py").exists())])


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_flags_given_to_commands_and_scripts_exist(page):
    text, options = page.read_text(), command_options()
    for command, rest in COMMAND.findall(text):
        for flag in FLAG.findall(rest):
            assert flag in options[command], f"{page_id(page)}: `ptmjax {command}` takes no {flag}"
    for script, rest in SCRIPT.findall(text):
        source = script_source(ROOT / script)
        for flag in FLAG.findall(rest):
            assert f'"{flag}"' in source or f"'{flag}'" in source, f"{page_id(page)}: {script} takes no {flag}"


def examples(page: pathlib.Path) -> list[tuple[str, str, str]]:
    """(marker line, language, code) of every bash and Python block of the page."""
    return [(m["marker"].strip(), m["language"], m["code"]) for m in EXAMPLE.finditer(page.read_text())]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_command_and_python_block_is_run_or_says_why_not(page):
    for marker, language, code in examples(page):
        first = code.splitlines()[0]
        assert RUN.fullmatch(marker) or NOT_RUN.fullmatch(marker), (
            f"{page_id(page)}: the {language} block `{first}` needs `<!-- run -->` (tests/test_doc_examples.py runs "
            "it) or `<!-- not run: REASON -->` on the line before it")


def script_module(script: str, monkeypatch):
    """The repository's script at path `script`, imported (its `main` not run)."""
    spec = importlib.util.spec_from_file_location(f"script_{pathlib.Path(script).stem}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_generated_table_is_the_one_its_results_file_gives(monkeypatch):
    marked = [(page, script, name, body) for page in PAGES
              for script, name, body in results_files.marked_tables(page.read_text())]
    assert {script for _, script, _, _ in marked} >= {
        "benchmarks/aot_compile_table.py", "benchmarks/train_throughput.py", "benchmarks/decode_throughput.py",
        "benchmarks/input_pipeline.py", "experiments/peft_comparison/run.py", "experiments/objective_comparison/run.py"}
    for page, script, name, body in marked:
        tables = script_module(script, monkeypatch).tables()
        assert name in tables, f"{page_id(page)}: {script} renders no table {name!r}"
        assert body == tables[name], f"{page_id(page)}: table {name} differs from {script}'s results; run it again"
