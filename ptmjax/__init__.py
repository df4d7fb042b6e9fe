"""ptmjax: pre-training and adapting pre-trained language models in JAX/Flax."""

import importlib
import os
import time
from typing import Any

from ptmjax import host_malloc, tensorflow_import

IMPORTED_AT = time.perf_counter()  # when the process first imported ptmjax: training's start-up line counts from it

# XLA:CPU runs independent operations concurrently only with this scheduler;
# it takes 4% off a T5-small training step on a 2-core CPU (benchmarks/xla_cpu_flags.py).
# Flags are read when the backend starts, so this must precede any JAX
# computation; it is a no-op on GPU and TPU, and a user's setting wins.
_CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if _CPU_SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_CPU_SCHEDULER_FLAG}=true".strip()


tensorflow_import.install()  # before JAX: imported first, it let TensorFlow's start-up lines through
host_malloc.install()  # before JAX creates its CPU client


def __getattr__(name: str) -> Any:
    """`ptmjax.load` (ptmjax/inference), imported on first use so that `import ptmjax` stays light (PEP 562)."""
    if name == "load":
        return importlib.import_module("ptmjax.inference").load
    raise AttributeError(f"module 'ptmjax' has no attribute {name!r}")
