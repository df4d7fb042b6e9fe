"""How ptmjax imports TensorFlow, which serves only its input pipelines: quietly, and in ptmjax's own
processes without Keras's optional integrations.

Quiet (`install()`, which `import ptmjax` calls). Importing TensorFlow 2.21
prints absl's "WARNING: All log messages before absl::InitializeLog() ..." and
INFO lines about oneDNN, the CUDA stub and CPU features. They come from C++
before TensorFlow reads TF_CPP_MIN_LOG_LEVEL, so no environment variable hides
them; and they appear twice, because
`tensorflow.python.profiler.internal._pywrap_profiler_plugin`, loaded by
`import tensorflow`, is a second extension with its own copy of that start-up
code. The first `import tensorflow` therefore runs with file descriptor 2 sent
to a temporary file, and every line of it but those start-up lines is written
back to stderr. A user's TF_CPP_MIN_LOG_LEVEL wins: at 0 (show everything)
nothing is filtered. Unset, it becomes 3: TensorFlow's C++ logging is hidden,
errors too, since on a machine without a GPU its first dataset logs a failed
cuInit as an error. TensorFlow's Python errors still raise.

Lean (`hold_back(KERAS_EXTRAS)`, which only the command line calls).
`import tensorflow` imports Keras, and Keras imports the packages of its
optional integrations when they are installed: scikit-learn and SciPy (its
scikit-learn wrappers), pandas, matplotlib and Pillow. That is about 1.1 s of
a 3.2 s import on a 2-core CPU, and an input pipeline uses none of it. Held
back, those packages cannot be imported while TensorFlow imports, so Keras
leaves the integrations out as it does when they are not installed. They import
normally afterwards, e.g. for ptmjax's metrics and plots. Keras's integrations
stay off for the rest of that process, so only `ptmjax.cli.main` asks for it:
its process runs nothing of Keras. A notebook's `import ptmjax` keeps them.
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


# The packages Keras imports for its optional integrations (see the module docstring).
KERAS_EXTRAS = ("sklearn", "scipy", "pandas", "matplotlib", "PIL")


def install() -> None:
    """Filters the start-up lines of the first `import tensorflow` (a no-op once it is imported)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ["TF_CPP_MIN_LOG_LEVEL"] != "0":
        _finder().quiet = True


def hold_back(packages: tuple[str, ...]) -> None:
    """Makes those of `packages` (top-level names) not imported yet unimportable while the first
    `import tensorflow` runs (a no-op once TensorFlow is imported)."""
    _finder().held_back.update(packages)


def _finder() -> _TensorFlowFinder:
    """The finder that will import TensorFlow, installed on first use (a detached one once TensorFlow is in)."""
    for finder in sys.meta_path:
        if isinstance(finder, _TensorFlowFinder):
            return finder
    finder = _TensorFlowFinder()
    if "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, finder)
    return finder


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


@contextlib.contextmanager
def _holding_back(packages: set[str]):
    """Makes `packages` not yet imported raise ModuleNotFoundError when imported, meanwhile."""
    blocker = _HoldBack({name for name in packages if name not in sys.modules})
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)


class _HoldBack(importlib.abc.MetaPathFinder):
    def __init__(self, packages: set[str]):
        self.packages = packages

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"{name} is held back while TensorFlow imports (ptmjax.tensorflow_import)",
                                      name=name)
        return None


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, with a loader that imports it quietly and holding packages back, as asked."""

    def __init__(self):
        self.quiet, self.held_back = False, set()

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _TensorFlowLoader(spec.loader, self.quiet, self.held_back)
        return spec


class _TensorFlowLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, quiet: bool, packages: set[str]):
        self._loader, self._quiet, self._packages = loader, quiet, packages

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with filtered_stderr() if self._quiet else contextlib.nullcontext(), _holding_back(self._packages):
            self._loader.exec_module(module)
