"""Long documents: the source files of the embedded corpus' standard-library modules, whole.

The docstring corpus (ptmjax/data/corpus.py) keeps each docstring of `corpus.STDLIB_MODULES` as its own short
document. Here a document is a whole source file of those modules, code, comments and docstrings together: tens of
thousands of tokens each, the long documents that long-context models are built for.

* Files: for each module of `corpus.STDLIB_MODULES`, its file under this interpreter's standard library
  (`sysconfig`'s 'stdlib' path; nothing is imported); for a package, every .py file below it, except those under a
  'test' or 'tests' folder. Built-in modules without a .py file (math) are skipped. Each file is named by its
  dotted module name ('email._header_value_parser'; a package by its own name), in module-list order, then path
  order; a file reached twice is kept once.
* Split: by the same stable hash as the docstring corpus (`corpus.split_of`), of the module *name*, with
  `VALIDATION_PERCENT` (15) in 'validation': the source of a module changes between Python releases, its name
  does not, so a module stays in its split. With 5% (the docstring corpus' share) the validation split would hold
  5 of the 205 files.
* `module_summary_and_body`: a module's docstring summary (the first paragraph, on one line) and its source with
  the module docstring cut out, for the long-input summarization task (ptmjax/tasks/long_documents.py).

On CPython 3.11 this gives 205 files (5.4 MB); the exact files depend on the Python version.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sysconfig

from ptmjax.data import corpus

VALIDATION_PERCENT = 15
SKIPPED_FOLDERS = frozenset({"test", "tests", "__pycache__"})
MIN_SUMMARY_WORDS = 3
MAX_SUMMARY_WORDS = 40


def stdlib_root() -> pathlib.Path:
    """This interpreter's standard-library folder."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def source_files() -> tuple[tuple[str, pathlib.Path], ...]:
    """(dotted module name, path) of every file of the module doc, in its order."""
    root = stdlib_root()
    files: dict[str, pathlib.Path] = {}
    for module in corpus.STDLIB_MODULES:
        base = root.joinpath(*module.split("."))
        if base.with_suffix(".py").is_file():
            files.setdefault(module, base.with_suffix(".py"))
        elif (base / "__init__.py").is_file():
            for path in sorted(base.rglob("*.py")):
                if not SKIPPED_FOLDERS & set(path.relative_to(root).parts):
                    files.setdefault(_module_name(path, root), path)
    return tuple(files.items())


def split_of_module(name: str) -> str:
    """'validation' or 'train' for a module name (`corpus.split_of` with `VALIDATION_PERCENT`)."""
    return corpus.split_of(name, VALIDATION_PERCENT)


@functools.cache
def stdlib_sources(split: str) -> tuple[tuple[str, str], ...]:
    """(module name, source text) of every non-empty file of one split, in the module doc's order."""
    if split not in corpus.SPLITS:
        raise ValueError(f"unknown split {split!r} for the stdlib sources; known: {', '.join(corpus.SPLITS)}")
    sources = tuple((name, path.read_text(encoding="utf-8")) for name, path in source_files()
                    if split_of_module(name) == split)
    return tuple((name, text) for name, text in sources if text.strip())


def module_summary_and_body(source: str) -> tuple[str, str] | None:
    """(summary, source without its module docstring), or None when the module has no docstring, its first
    paragraph is not a summary of `MIN_SUMMARY_WORDS` to `MAX_SUMMARY_WORDS` words starting with a letter, or the
    summary is in the rest of the source too (a class docstring repeating it: the task would be copying).

    The summary is the docstring's first paragraph with its lines joined by single spaces; the body is the source
    with the docstring's lines removed, so that the summary is not in the input."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    docstring = ast.get_docstring(tree)
    if not docstring:
        return None
    summary = " ".join(docstring.split("\n\n")[0].split())
    if not summary[:1].isalpha() or not MIN_SUMMARY_WORDS <= len(summary.split()) <= MAX_SUMMARY_WORDS:
        return None
    node = tree.body[0]
    lines = source.splitlines(keepends=True)
    body = "".join(lines[:node.lineno - 1] + lines[node.end_lineno:])
    return None if summary in " ".join(body.split()) else (summary, body)
