"""Lets XLA:CPU reuse the memory it freed instead of taking fresh pages from the kernel at every step.

XLA:CPU allocates each execution's buffers (gigabytes for a training step)
with malloc and frees them when it ends. glibc serves large requests with
fresh `mmap`s and unmaps them at `free`, so every step page-faults its whole
working set again: 2.1 of the 7.0 s of a T5-small training step on a 2-core
CPU were kernel time. `install()` asks glibc, through `mallopt`, for no
`mmap`s and no trimming, so freed memory stays in the process and the next
step reuses it (kernel time per step 0.05 s, `docs/performance_log.md`).

That holds only in the main arena, the heap: glibc gives each thread an arena
of its own, and another thread's cannot hold a block above 64 MiB without
mapping it (and unmapping it at `free`). So `install()` also turns JAX's
asynchronous CPU dispatch off (unless `JAX_CPU_ENABLE_ASYNC_DISPATCH` says
otherwise): a single-device program then runs on the thread that calls it
(in `ptmjax train`, the main one), and the demo step's 229 MiB of buffers
come from the heap. The threads keep their own arenas: with one arena for all
(the setting before), XLA's compiler and compute threads queued on its lock,
and the demo's cold start took 17.9-22.4 s against 15.8-17.5 s, its step
146-165 ms against 122-136 ms. Those arenas grow by extra heaps of 64 MiB,
which glibc unmaps as soon as they are empty whatever the trim threshold
says: only `M_TOP_PAD` holds it back, so `install()` sets it to a whole heap
(T5-small's step: 98k instead of 101k-165k minor faults, kernel time 0.16-0.21
instead of 0.20-0.34 s). A compute thread's single request above 64 MiB is
still mapped and unmapped (glibc gives it no heap). The cost: the process
keeps its peak heap instead of returning it to the system.

It does nothing off glibc, or where an accelerator plugin (libtpu, a CUDA or
ROCm plugin) is installed and `JAX_PLATFORMS` does not pick the CPU: there
host memory holds only the input pipeline, whose threads are better served by
glibc's defaults. `PTMJAX_KEEP_FREED_MEMORY=0` turns it off, `=1` forces it.
`import ptmjax` calls it, before JAX starts its CPU client where it can.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform

ENVIRONMENT_VARIABLE = "PTMJAX_KEEP_FREED_MEMORY"
ASYNC_DISPATCH_VARIABLE = "JAX_CPU_ENABLE_ASYNC_DISPATCH"
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
HEAP_MAX_BYTES = 64 << 20  # a thread arena's heap on 64-bit glibc (2 * DEFAULT_MMAP_THRESHOLD_MAX)


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
    # M_TRIM_THRESHOLD is a size_t: -1 is its largest, never trim. A thread arena's empty extra heap is unmapped
    # unless M_TOP_PAD is at least a heap (glibc's heap_trim).
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_TOP_PAD, HEAP_MAX_BYTES))
    if not all(mallopt(param, value) == 1 for param, value in settings):
        return False
    _set_async_dispatch()
    return True


def _set_async_dispatch() -> None:
    """Sets JAX's asynchronous CPU dispatch as `JAX_CPU_ENABLE_ASYNC_DISPATCH` says, off where it is unset. JAX
    reads it from its config (not the environment) when it creates its CPU client: once a computation has run,
    this comes too late and changes nothing."""
    choice = os.environ.get(ASYNC_DISPATCH_VARIABLE, "false").strip().lower()
    if choice not in _BOOLEANS:
        raise ValueError(f"{ASYNC_DISPATCH_VARIABLE}={choice!r}: use true or false (unset: false with ptmjax on CPU)")
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", _BOOLEANS[choice])


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
