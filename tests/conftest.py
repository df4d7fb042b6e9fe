"""Test session setup: emulate an 8-device mesh on the CPU before JAX starts, and share compiled programs.

Many tests compile the same tiny programs (the same model trained, decoded or
converted in several tests, and in the CLI tests' subprocesses), so tests
keep JAX's persistent compilation cache in one folder under the system's
temporary directory, which subprocesses and pytest-xdist workers inherit
through the environment. A cached program is the one XLA would compile again
(its key covers the program, the compile options and the JAX version), so
results are unchanged; a fresh machine starts with an empty cache.
"""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
JAX_CACHE = os.path.join(tempfile.gettempdir(), f"ptmjax-tests-jax-{os.getuid()}")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", JAX_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
