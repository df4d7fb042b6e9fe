"""Keeps TensorFlow's native start-up lines off stderr.

Importing TensorFlow 2.21 prints absl's "WARNING: All log messages before
absl::InitializeLog() ..." and INFO lines about oneDNN, the CUDA stub and CPU
features. They come from C++ before TensorFlow reads TF_CPP_MIN_LOG_LEVEL, so
no environment variable hides them; and they appear twice, because
`tensorflow.python.profiler.internal._pywrap_profiler_plugin`, loaded by
`import tensorflow`, is a second extension with its own copy of that
start-up code. `install()` therefore wraps the first `import tensorflow`:
file descriptor 2 goes to a temporary file meanwhile, and every line of it but
those start-up lines is written back to stderr.

A user's TF_CPP_MIN_LOG_LEVEL wins: at 0 (show everything) nothing is
filtered. Unset, it becomes 3: TensorFlow's C++ logging is hidden, errors too,
since on a machine without a GPU its first dataset logs a failed cuInit as an
error. TensorFlow serves only the input pipeline here; its Python errors still raise.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\)"
    r"|^[IW]\d{4} [\d:. ]+\d+ (port|cudart_stub|cpu_feature_guard|cuda_dnn|cuda_fft|cuda_blas)\.cc:\d+\]"
    r"|^E\d{4} [\d:. ]+\d+ cuda_(dnn|fft|blas)\.cc:\d+\] Unable to register"
    r"|^To enable the following instructions: .* rebuild TensorFlow"
)


def install() -> None:
    """Filters the start-up lines of the first `import tensorflow` (a no-op once it is imported)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules or os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0":
        return
    if not any(isinstance(finder, _TensorFlowFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TensorFlowFinder())


@contextlib.contextmanager
def filtered_stderr():
    """Sends fd 2 to a temporary file; writes back all of its lines that are not NOISE."""
    if sys.stderr:
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            os.write(2, b"".join(line for line in capture.read().splitlines(keepends=True)
                                 if not NOISE.search(line.decode(errors="replace"))))


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, with a loader that runs it under `filtered_stderr`."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with filtered_stderr():
            self._loader.exec_module(module)
