"""Writing a folder whole: into a temporary folder beside it, renamed into place once complete, so that a
failed command leaves what was there untouched and never a mix of two models' files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def written_whole(path: str) -> Iterator[str]:
    """Yields a temporary folder beside `path` to write into. When the block succeeds it replaces `path`
    (whatever was there is removed: the caller decides whether that is allowed); when the block fails the
    temporary folder is removed and `path` is as it was."""
    path = os.path.abspath(path)
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
