"""Writing a file or a folder whole: into a temporary one beside it, renamed into place once complete, so that
a failed command leaves what was there untouched (never half a file, or a mix of two models' files). What is
renamed into place gets the permissions a new file or folder gets under the umask (a temporary one is private)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TextIO


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
    os.chmod(staging, under_umask(0o777))
    os.rename(staging, path)


@contextlib.contextmanager
def file_written_whole(path: str, interrupted_path: str | None = None) -> Iterator[TextIO]:
    """Yields a temporary text file beside `path`, renamed to `path` when the block succeeds. When the block is
    interrupted (KeyboardInterrupt) and `interrupted_path` is given, what was written is kept there instead;
    on any other way out the temporary file is removed and `path` is as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.writing-")
    try:
        with os.fdopen(handle, "w") as f:
            try:
                yield f
            except KeyboardInterrupt:
                if interrupted_path is None:
                    raise
                f.close()
                os.chmod(temporary, under_umask(0o666))
                os.replace(temporary, interrupted_path)
                raise
        os.chmod(temporary, under_umask(0o666))
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def under_umask(mode: int) -> int:
    """`mode` less the bits the process's umask removes from new files."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask
