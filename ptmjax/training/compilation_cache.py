"""JAX's persistent compilation cache for training runs and for `ptmjax eval`, `infer` and `probe`: a run started
again (a resumed run, the demo run twice) reads its compiled train and eval steps from disk instead of compiling
them, and a command run again its decoding and scoring programs.

`train.compilation_cache_dir` (gin) picks a run's folder; the commands use 'auto'. 'auto' (the default) is
$PTMJAX_COMPILATION_CACHE_DIR, else the `compilation_cache/` folder of ptmjax's
cache root ($PTMJAX_CACHE_DIR, else ~/.cache/ptmjax); None turns it off. A cache
JAX already has (JAX_COMPILATION_CACHE_DIR, or `jax.config.update(
'jax_compilation_cache_dir', ...)` before the run) is kept: the user's setting
wins. JAX caches programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile; an
entry's key covers the program, the compile options, the devices and the JAX
and XLA versions, so a cached program is the one XLA would compile again.

Like any compilation cache, the folder is trusted code: keep it private to you.
"""

from __future__ import annotations

import os
import warnings

import jax

from ptmjax.data.vocabularies import cache_dir

CACHE_DIR_ENV = "PTMJAX_COMPILATION_CACHE_DIR"
AUTO = "auto"


def default_directory() -> str:
    """$PTMJAX_COMPILATION_CACHE_DIR, else <ptmjax cache root>/compilation_cache."""
    return os.environ.get(CACHE_DIR_ENV) or str(cache_dir() / "compilation_cache")


def use_compilation_cache(directory: str | None = AUTO) -> str | None:
    """Points JAX's persistent compilation cache at `directory` ('auto': `default_directory()`; None: off) unless
    JAX already has a cache folder, which is kept. Returns the folder in use, or None (also, with a warning, when
    the folder cannot be created). Call it before the first compile that should be cached (programs compiled
    before it are not)."""
    current = _jax_cache_dir()
    if current:
        return current
    if directory is None:
        return None
    directory = os.path.expanduser(default_directory() if directory == AUTO else directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:  # a cache is worth a warning, not a failed run
        fix = f"set ${CACHE_DIR_ENV} (or train.compilation_cache_dir) to a writable folder"
        warnings.warn(f"compiling without a cache: cannot create {directory} ({error.strerror}); {fix}", stacklevel=2)
        return None
    _set_jax_cache_dir(directory)
    return directory


def _jax_cache_dir() -> str | None:
    return jax.config.jax_compilation_cache_dir


def _set_jax_cache_dir(directory: str) -> None:
    jax.config.update("jax_compilation_cache_dir", directory)
