"""Writing a folder whole: into a temporary folder beside it, renamed into place once complete, so that a
failed command leaves what was there untouched and never a mix of two models' files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


def contents(path: str) -> list[str]:
    """The names in folder `path`, sorted; [] when it is missing or empty."""
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@contextlib.contextmanager
def written_whole(path: str, replace: bool) -> Iterator[str]:
    """Yields a temporary folder beside `path` to write into. When the block succeeds it becomes `path`,
    which must then be missing or empty unless `replace`, which removes it first; when the block fails the
    temporary folder is removed and `path` is as it was."""
    path = os.path.abspath(path)
    if contents(path) and not replace:
        raise FileExistsError(f"{path} is not empty; refusing to write over it")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.writing-", dir=parent)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.rename(staging, path)
