"""One run at a time per model folder: MODEL_DIR/run.lock names the process that writes there.

A second run on the same folder fails at once, naming the owner's host and
pid. A lock whose process is gone (on this host, where that can be checked)
is stale: it is taken over with a warning. A multi-host run takes one lock,
from process 0 (the process that writes the folder's files); every process
learns whether it got it, so all of them stop together when it did not.
Decisions are made under an flock of the folder, so two processes starting at
once cannot both take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from ptmjax.storage.model_dir import ModelDir
from ptmjax.storage.writable import FolderNotWritable
from ptmjax.storage.written_whole import file_written_whole
from ptmjax.training import multihost

_HELD: set[str] = set()  # lock files this process holds: its own pid in any other lock file is a reused pid


class RunDirInUse(ValueError):
    """Another live run holds the model folder's lock."""


@dataclasses.dataclass(frozen=True)
class LockOwner:
    host: str
    pid: int

    @classmethod
    def this_process(cls) -> LockOwner:
        return cls(socket.gethostname(), os.getpid())

    def is_running(self) -> bool:
        """Whether the owner may still run: always on another host, where its pid cannot be checked."""
        if self.host != socket.gethostname():
            return True
        if self == LockOwner.this_process():
            return False  # not one of _HELD: a previous process of this pid
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
        return True


@contextlib.contextmanager
def holding_run_lock(model_dir: str) -> Iterator[None]:
    """Holds `model_dir`'s lock while the block runs (creating the folder; removing it again if left empty)."""
    folder = ModelDir(model_dir)
    created, refusal = not os.path.isdir(folder.path), None
    if multihost.is_primary():
        try:
            _acquire(folder)
        except (RunDirInUse, FolderNotWritable) as error:
            refusal = error
            if created and os.path.isdir(folder.path) and not os.listdir(folder.path):
                os.rmdir(folder.path)
    if jax.process_count() > 1:
        locked = bool(multihost_utils.broadcast_one_to_all(np.array(refusal is None, np.int32)))
        if not locked and refusal is None:
            raise RunDirInUse(f"process 0 could not lock {folder.path} (see process 0's error)")
    if refusal is not None:
        raise refusal
    try:
        yield
    finally:
        if multihost.is_primary():
            _release(folder)
            if created and not os.listdir(folder.path):
                os.rmdir(folder.path)


def locks_model_dir(run: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates an entry point whose first argument is the model folder: it runs holding that folder's lock."""

    @functools.wraps(run)
    def locked(model_dir: str, *args: Any, **kwargs: Any) -> Any:
        with holding_run_lock(model_dir):
            return run(model_dir, *args, **kwargs)

    return locked


def _acquire(folder: ModelDir) -> None:
    try:
        os.makedirs(folder.path, exist_ok=True)
    except OSError as error:
        raise FolderNotWritable(
            f"cannot create {folder.path} ({error.strerror or error}); make its parent writable, or choose "
            "another --model_dir"
        ) from None
    me = LockOwner.this_process()
    with _folder_flock(folder):
        owner = _read(folder.lock_path)
        if folder.lock_path in _HELD or owner is not None and owner.is_running():
            owner = owner or me
            raise RunDirInUse(
                f"{folder.path} is in use by another run: pid {owner.pid} on host {owner.host} holds "
                f"{folder.lock_path}; wait for it, use another --model_dir, or delete that file if the run is gone"
            )
        if owner is not None:
            warnings.warn(
                f"took over the stale lock {folder.lock_path} of pid {owner.pid} on host {owner.host}, "
                "which no longer runs",
                stacklevel=3,
            )
        _write_lock(folder.lock_path, me)
        _HELD.add(folder.lock_path)


def _write_lock(path: str, owner: LockOwner) -> None:
    """Writes the lock whole; a write that fails (a full or read-only disk) leaves no temporary file and is a
    FolderNotWritable naming the folder."""
    try:
        with file_written_whole(path) as f:
            json.dump(dataclasses.asdict(owner), f)
    except OSError as error:
        raise FolderNotWritable(
            f"cannot write the run lock {path} ({error.strerror or error}); make {os.path.dirname(path)} "
            "writable and free space there, or choose another --model_dir"
        ) from None


def _release(folder: ModelDir) -> None:
    with _folder_flock(folder):
        if _read(folder.lock_path) == LockOwner.this_process():
            os.remove(folder.lock_path)
        _HELD.discard(folder.lock_path)


def _read(path: str) -> LockOwner | None:
    """The lock's owner; None without a lock (or with an unreadable one, which no live run writes)."""
    try:
        with open(path) as f:
            return LockOwner(**json.load(f))
    except (FileNotFoundError, ValueError, TypeError):
        return None


@contextlib.contextmanager
def _folder_flock(folder: ModelDir) -> Iterator[None]:
    """An exclusive flock of the folder itself, for one lock decision (released when the descriptor closes)."""
    descriptor = os.open(folder.path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
