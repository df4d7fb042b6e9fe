"""`import ptmjax` keeps freed host memory in the process: memory freed and allocated again is not faulted in again,
including the buffers of a JAX program run again."""

import os
import platform
import subprocess
import sys

import pytest

from ptmjax import host_malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# The scripts' start: ptmjax imported, glibc's malloc and free callable through ctypes.
LIBC = """
import ctypes, resource, threading
import ptmjax
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
"""

# Allocates, touches and frees 64 MiB twice; prints the minor page faults of the second round.
SECOND_ROUND_FAULTS = LIBC + """
size = 64 << 20
for round in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


# A jitted program with 128 MiB of intermediate buffers (exp(x) reversed, sin(x) transposed) on one CPU device, run
# ten times; prints the minor page faults of each run, then the median of the runs after the first. (A run now and
# then still finds its buffers in fresh pages, as the heap settles around them.)
RERUN_FAULTS = """
import resource, statistics
import ptmjax
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32)
program = jax.jit(lambda x: (jnp.exp(x)[::-1] * jnp.sin(x).T).sum(0))
faults = []
for run in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    program(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults, statistics.median(faults[1:]))
"""


# Keeps 48 MiB and allocates, touches and frees another 48 MiB twice, all in a thread of its own (so in a glibc arena
# other than the heap, whose second 64 MiB heap holds the second block); prints the thread's minor page faults of
# the second round.
THREAD_SECOND_ROUND_FAULTS = LIBC + """
size = 48 << 20
faults = []
def work():
    kept = libc.malloc(size)
    ctypes.memset(kept, 1, size)
    for round in range(2):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        buffer = libc.malloc(size)
        ctypes.memset(buffer, 1, size)
        libc.free(buffer)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    libc.free(kept)
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(faults[-1])
"""


def _printed(script: str, setting: str, **environment: str) -> list[int]:
    """The numbers `script` prints on its last line, run with PTMJAX_KEEP_FREED_MEMORY=`setting`."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_CPU_ENABLE_ASYNC_DISPATCH"}
    env.update(PTMJAX_KEEP_FREED_MEMORY=setting, **environment)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return [int(float(number)) for number in out.stdout.strip().splitlines()[-1].split()]


def _faults(script: str, setting: str, **environment: str) -> int:
    return _printed(script, setting, **environment)[-1]


def test_freed_memory_is_reused_without_page_faults():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert _faults(SECOND_ROUND_FAULTS, "0") > pages // 2  # glibc's defaults: unmapped at free, faulted in again
    assert _faults(SECOND_ROUND_FAULTS, "1") < pages // 100


def test_a_threads_freed_memory_is_reused_without_page_faults():
    """XLA's compute threads allocate in arenas of their own; an empty extra heap there stays mapped."""
    pages = (48 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert _faults(THREAD_SECOND_ROUND_FAULTS, "0") > pages // 2
    assert _faults(THREAD_SECOND_ROUND_FAULTS, "1") < pages // 100


def test_a_jax_programs_buffers_are_reused_without_page_faults():
    pages = (128 << 20) // os.sysconf("SC_PAGE_SIZE")
    one_device = {"XLA_FLAGS": ""}
    assert _faults(RERUN_FAULTS, "0", **one_device) > pages // 2
    # Reused: at most an eighth in fresh pages. Alone the median is 0-4 faults; once, in the full suite on 2 loaded
    # cores, it was 2,058 (8 MiB of the 128 MiB), against about 32,768 (all of it) with glibc's defaults.
    *runs, median = _printed(RERUN_FAULTS, "1", **one_device)
    assert median < pages // 8, f"minor page faults of each run: {runs}"
    # Dispatched to another thread, whose glibc arena maps and unmaps large buffers: the user's choice, kept.
    asynchronous = {**one_device, "JAX_CPU_ENABLE_ASYNC_DISPATCH": "true"}
    assert _faults(RERUN_FAULTS, "1", **asynchronous) > pages // 2


def test_a_bad_setting_is_named():
    env = {**os.environ, "PTMJAX_KEEP_FREED_MEMORY": "yes"}
    out = subprocess.run([sys.executable, "-c", "import ptmjax"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "PTMJAX_KEEP_FREED_MEMORY='yes': use 0" in out.stderr


def test_a_bad_async_dispatch_setting_is_named():
    env = {**os.environ, "PTMJAX_KEEP_FREED_MEMORY": "1", "JAX_CPU_ENABLE_ASYNC_DISPATCH": "sometimes"}
    out = subprocess.run([sys.executable, "-c", "import ptmjax"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "JAX_CPU_ENABLE_ASYNC_DISPATCH='sometimes': use true or false" in out.stderr


# Prints its GLIBC_TUNABLES each time it starts, then restarts for huge pages; then allocates and touches 64 MiB of
# heap and prints how many bytes of the process's anonymous memory huge pages gained.
RESTART_HUGE_PAGE_BYTES = """
import os, sys
print("started", os.environ.get("GLIBC_TUNABLES"), flush=True)
from ptmjax import host_malloc
host_malloc.restart_with_huge_pages()
""" + LIBC + """
def huge_page_bytes():
    with open("/proc/self/smaps_rollup") as smaps:
        return next(int(line.split()[1]) << 10 for line in smaps if line.startswith("AnonHugePages:"))
before = huge_page_bytes()
buffer = libc.malloc(64 << 20)
ctypes.memset(buffer, 1, 64 << 20)
print(huge_page_bytes() - before)
"""

huge_pages_on_madvise = pytest.mark.skipif(
    host_malloc._glibc_version() < host_malloc.HUGE_PAGE_GLIBC or host_malloc._transparent_huge_pages() != "madvise",
    reason="glibc's heaps ask for huge pages on glibc 2.35 and newer, where the kernel's are on madvise",
)


@huge_pages_on_madvise
def test_the_command_restarts_once_with_heaps_on_huge_pages():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", RESTART_HUGE_PAGE_BYTES], env={**env, "PTMJAX_KEEP_FREED_MEMORY": "1"},
                         capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert out[:2] == ["started None", "started glibc.malloc.hugetlb=1"]
    assert int(out[2]) >= 48 << 20  # most of the 64 MiB on 2 MiB pages
    user_says_no = {**env, "PTMJAX_KEEP_FREED_MEMORY": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    out = subprocess.run([sys.executable, "-c", RESTART_HUGE_PAGE_BYTES], env=user_says_no,
                         capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert out[0] == "started glibc.malloc.hugetlb=0" and len(out) == 2  # not restarted
    assert int(out[1]) < 8 << 20


@pytest.mark.parametrize(
    ("environ", "glibc", "kernel", "expected"),
    [
        ({}, (2, 36), "madvise", "glibc.malloc.hugetlb=1"),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 36), "madvise",
         "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise", None),  # the user's own choice
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, (2, 36), "madvise", None),
        ({"PTMJAX_KEEP_FREED_MEMORY": "0"}, (2, 36), "madvise", None),  # freed memory not kept: huge pages lose
        ({"JAX_PLATFORMS": "cuda"}, (2, 36), "madvise", None),
        ({}, (2, 34), "madvise", None),  # no such tunable
        ({}, (2, 36), "always", None),  # huge pages already
        ({}, (2, 36), "never", None),
        ({}, (2, 36), None, None),
    ],
)  # fmt: skip
def test_huge_page_environment(monkeypatch, environ, glibc, kernel, expected):
    monkeypatch.setattr(host_malloc, "_glibc_version", lambda: glibc)
    monkeypatch.setattr(host_malloc, "_transparent_huge_pages", lambda: kernel)
    environ = {"JAX_PLATFORMS": "cpu", **environ}
    environment = host_malloc.huge_page_environment(environ)
    assert (environment and environment["GLIBC_TUNABLES"]) == expected
    if environment:  # the rest kept
        assert {**environment, "GLIBC_TUNABLES": None} == {**environ, "GLIBC_TUNABLES": None}
