"""Before a command writes a folder: can it create files there, and is there room for what it will write?

A read-only folder or a full disk found at the first checkpoint costs the
steps trained until then, and Orbax's barrier can hang on it; found before the
first step it costs nothing. The check creates and removes one empty probe
file, which catches what permission bits alone do not (a read-only mount, a
folder root cannot write either), and compares the file system's free space
with the bytes to be written.
"""

from __future__ import annotations

import os
import shutil
import tempfile

PROBE_PREFIX = ".ptmjax-write-check-"


class FolderNotWritable(ValueError):
    """A folder a command must write cannot take it (a ValueError, so the command prints one line)."""


def check_writable(path: str, needed_bytes: int = 0) -> None:
    """Raises FolderNotWritable naming `path` (or its nearest existing parent, where it will be created) when no
    file can be created there, or when its file system has fewer than `needed_bytes` free."""
    folder = nearest_existing(path)
    try:
        descriptor, probe = tempfile.mkstemp(dir=folder, prefix=PROBE_PREFIX)
        os.close(descriptor)
        os.remove(probe)
    except OSError as error:
        raise FolderNotWritable(
            f"cannot write to {folder} ({error.strerror or error}); make it writable, or choose another --model_dir"
        ) from None
    free = shutil.disk_usage(folder).free
    if free < needed_bytes:
        raise FolderNotWritable(
            f"{folder} has {_megabytes(free)} free, less than the {_megabytes(needed_bytes)} one checkpoint of this "
            "run takes; free space there, or choose another --model_dir"
        )


def nearest_existing(path: str) -> str:
    """`path`, or the nearest of its parents that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
