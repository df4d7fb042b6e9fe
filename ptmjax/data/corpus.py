"""The embedded default corpus: docstrings of a fixed list of stdlib modules.

Every machine that can import ptmjax has Python's standard library, and its
docstrings are real English prose (with some code). This module turns them into
a small, deterministic pre-training corpus that needs no download:

* Sources: the module docstring, and the docstrings of the public classes,
  functions and methods *defined in* each module of `STDLIB_MODULES` (objects
  re-exported from elsewhere are skipped, so each docstring is counted once).
  Modules that fail to import on this interpreter are skipped.
* Documents: one document per docstring, kept whole (after `inspect.cleandoc`),
  so that a document is one coherent explanation; documents shorter than
  `MIN_CHARS` characters ("Return self.", "Alias for field number 0") are
  dropped, and exact duplicates keep their first occurrence. Each document
  is labelled with that module (`stdlib_documents_with_modules`).
* Order: module list order, then attribute names sorted, then class members
  sorted: identical on every run of the same Python version.
* Isolation: the docstrings are read in a fresh interpreter that loads the
  standard library only (`python -I -S`), because third-party libraries patch
  it (transformers adds methods to `logging.Logger`): what else the caller has
  imported must not change the corpus.
* Split: a document belongs to 'validation' when the first 8 bytes of the
  SHA-256 of its text, as an integer, modulo 100 is below `VALIDATION_PERCENT`
  (5), else to 'train'. The split depends only on the text, so it is stable
  when modules are added or removed.

On CPython 3.11 this gives 1,453 train documents (533,001 characters) and
84 validation documents (29,773 characters); exact numbers depend on the
Python version, which is why the vocabulary cache is keyed by a fingerprint of
the text (`corpus_fingerprint`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import logging
import subprocess
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

# fmt: off
STDLIB_MODULES: tuple[str, ...] = (
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar",
    "cmd", "codecs", "collections", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email",
    "enum", "fileinput", "fnmatch", "fractions", "ftplib", "functools",
    "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html",
    "http.client", "http.cookiejar", "http.server", "imaplib", "inspect",
    "io", "ipaddress", "itertools", "json", "locale", "logging",
    "logging.handlers", "mailbox", "math", "mimetypes", "multiprocessing",
    "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle",
    "pickletools", "platform", "plistlib", "poplib", "pprint", "pydoc",
    "queue", "random", "re", "sched", "secrets", "selectors", "shelve",
    "shlex", "shutil", "smtplib", "socket", "socketserver", "statistics",
    "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "tokenize", "trace", "traceback", "typing",
    "unittest", "urllib.parse", "urllib.request", "uuid", "warnings",
    "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree",
    "zipfile", "zoneinfo",
)
# fmt: on
MIN_CHARS = 64
VALIDATION_PERCENT = 5
SPLITS = ("train", "validation")


def _docstring(obj: Any) -> str | None:
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else None


def _documented_objects(module: types.ModuleType) -> Iterator[Any]:
    """Yields the module, then its own public classes/functions and members."""
    yield module
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            yield obj
            for member_name in sorted(vars(obj)):
                member = vars(obj)[member_name]
                if not member_name.startswith("_") and (
                    inspect.isfunction(member) or inspect.ismethoddescriptor(member)
                ):
                    yield member
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            yield obj


class _Extraction:
    """The clean interpreter reading the docstrings, its output going to temporary files (so that it never
    waits on a pipe nobody reads)."""

    def __init__(self):
        self._stdout, self._stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._process = subprocess.Popen([sys.executable, "-I", "-S", __file__], stdin=subprocess.DEVNULL,
                                         stdout=self._stdout, stderr=self._stderr)

    def documents(self) -> tuple[tuple[str, str], ...]:
        """Waits for it: (module name, document) pairs."""
        with self._stdout, self._stderr:
            if self._process.wait():
                self._stderr.seek(0)
                raise RuntimeError(f"extracting the stdlib corpus failed:\n{self._stderr.read().decode()}")
            self._stdout.seek(0)
            return tuple((module, document) for module, document in json.load(self._stdout))


_started: list[_Extraction] = []  # one started by `extract_in_background`, not yet collected


def extract_in_background() -> None:
    """Starts reading the corpus now, in its own process: `ptmjax train` calls it before its imports, which keep
    one core busy for seconds, so that the first use of the corpus finds it read."""
    if not _started and _all_documents.cache_info().currsize == 0:
        _started.append(_Extraction())


@functools.cache
def _all_documents() -> tuple[tuple[str, str], ...]:
    """(module name, document) pairs, extracted in a clean standard-library-only interpreter."""
    return (_started.pop() if _started else _Extraction()).documents()


def _extract_documents() -> tuple[tuple[str, str], ...]:
    """Reads the docstrings of STDLIB_MODULES in this interpreter: (module name, document) pairs."""
    documents: dict[str, str] = {}  # document -> the module it first appears in, in order
    for module_name in STDLIB_MODULES:
        with warnings.catch_warnings():  # deprecated modules and attributes warn
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except Exception as error:  # noqa: BLE001 - a module missing here is skipped
                logging.getLogger(__name__).debug("stdlib corpus skips %s: %s", module_name, error)
                continue
            for obj in _documented_objects(module):
                doc = _docstring(obj)
                if doc and len(doc) >= MIN_CHARS:
                    documents.setdefault(doc, module_name)
    return tuple((module, document) for document, module in documents.items())


def split_of(text: str, validation_percent: int = VALIDATION_PERCENT) -> str:
    """Returns 'validation' or 'train' for a document, from a stable hash (`validation_percent` of 100 buckets
    are 'validation')."""
    bucket = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % 100
    return "validation" if bucket < validation_percent else "train"


def stdlib_documents_with_modules(split: str) -> tuple[tuple[str, str], ...]:
    """(module name, document) pairs of one split, in corpus order; a duplicate belongs to its first module."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for the stdlib corpus; known: {', '.join(SPLITS)}")
    return tuple((module, document) for module, document in _all_documents() if split_of(document) == split)


@functools.cache
def stdlib_docstrings(split: str) -> tuple[str, ...]:
    """The documents of one split ('train' or 'validation'), deterministic order."""
    documents = tuple(document for _, document in stdlib_documents_with_modules(split))
    if not documents:
        raise RuntimeError(f"the stdlib corpus has no {split!r} documents: no module of STDLIB_MODULES imported")
    return documents


def corpus_fingerprint(split: str = "train") -> str:
    """SHA-256 (hex) of a split's documents: keys caches derived from the corpus."""
    digest = hashlib.sha256()
    for document in stdlib_docstrings(split):
        digest.update(document.encode("utf-8") + b"\0")
    return digest.hexdigest()


def corpus_size(split: str) -> dict[str, int]:
    """{'documents': n, 'characters': n} of one split."""
    documents = stdlib_docstrings(split)
    return {"documents": len(documents), "characters": sum(map(len, documents))}


def stdlib_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: yields {'text': tf.string}.

    With `shuffle_files`, the documents are fully shuffled with `seed` (freshly,
    but deterministically, on every repetition).
    """
    import tensorflow as tf  # here: keeps `import corpus` light

    documents = stdlib_docstrings(split)
    ds = tf.data.Dataset.from_tensor_slices({"text": list(documents)})
    if shuffle_files:
        ds = ds.shuffle(len(documents), seed=seed, reshuffle_each_iteration=True)
    return ds


if __name__ == "__main__":  # run by _all_documents in a clean interpreter
    json.dump(list(_extract_documents()), sys.stdout)
