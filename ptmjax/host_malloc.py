"""Lets XLA:CPU reuse the memory it freed instead of taking fresh pages from the kernel at every step.

XLA:CPU allocates each execution's buffers (gigabytes for a training step)
with malloc and frees them when it ends. glibc serves large requests with
fresh `mmap`s and unmaps them at `free`, and its per-thread arenas return
freed memory too, so every step page-faults its whole working set again:
2.1 of the 7.0 s of a T5-small training step on a 2-core CPU were kernel
time. `install()` asks glibc, through `mallopt`, for one arena (the main
heap), no `mmap`s, and no trimming: freed memory stays in the process and the
next step reuses it (kernel time per step 0.05 s, `docs/performance.md`). The
cost: the process keeps its peak heap instead of returning it to the system
between steps.

It must run before JAX or TensorFlow start their threads (the arena limit
binds threads when they first allocate), so `import ptmjax` calls it. It does
nothing off glibc, or where an accelerator plugin (libtpu, a CUDA or ROCm
plugin) is installed and `JAX_PLATFORMS` does not pick the CPU: there host
memory holds only the input pipeline, whose threads are better served by
glibc's defaults. `PTMJAX_KEEP_FREED_MEMORY=0` turns it off, `=1` forces it.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform

ENVIRONMENT_VARIABLE = "PTMJAX_KEEP_FREED_MEMORY"
# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def install() -> bool:
    """Applies the settings when this process's JAX computes on the CPU; whether they were applied."""
    choice = os.environ.get(ENVIRONMENT_VARIABLE, "auto")
    if choice not in ("0", "1", "auto"):
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={choice!r}: use 0 (glibc's defaults), 1 (always) or unset (auto)")
    if choice == "0" or platform.libc_ver()[0] != "glibc":
        return False
    if choice == "auto" and not _computes_on_cpu():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))  # a size_t: -1 is its largest, never trim
    return all(mallopt(param, value) == 1 for param, value in settings)


def _computes_on_cpu() -> bool:
    platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME") or ""
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not _accelerator_plugin_installed()


def _accelerator_plugin_installed() -> bool:
    """Whether JAX would find a TPU, CUDA or ROCm plugin (without importing JAX)."""
    if importlib.util.find_spec("libtpu") is not None:
        return True
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    try:
        import jax_plugins
    except ImportError:
        return False
    return any(pkgutil.iter_modules(jax_plugins.__path__))
