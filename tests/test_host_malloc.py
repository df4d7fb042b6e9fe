"""`import ptmjax` keeps freed host memory in the process: memory freed and allocated again is not faulted in again."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Allocates, touches and frees 64 MiB twice; prints the minor page faults of the second round.
SECOND_ROUND_FAULTS = """
import ctypes, resource
import ptmjax
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
for round in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_round_faults(setting: str) -> int:
    env = {**os.environ, "PTMJAX_KEEP_FREED_MEMORY": setting}
    out = subprocess.run([sys.executable, "-c", SECOND_ROUND_FAULTS], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return int(out.stdout.split()[-1])


def test_freed_memory_is_reused_without_page_faults():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert _second_round_faults("0") > pages // 2  # glibc's defaults: unmapped at free, faulted in again
    assert _second_round_faults("1") < pages // 100


def test_a_bad_setting_is_named():
    env = {**os.environ, "PTMJAX_KEEP_FREED_MEMORY": "yes"}
    out = subprocess.run([sys.executable, "-c", "import ptmjax"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "PTMJAX_KEEP_FREED_MEMORY='yes': use 0" in out.stderr
