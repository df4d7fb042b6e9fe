"""ptmjax: pre-training and adapting pre-trained language models in JAX/Flax."""

import os

from ptmjax import quiet_tensorflow

# XLA:CPU runs independent operations concurrently only with this scheduler;
# it halves a T5 forward pass on a 2-core CPU (benchmarks/train_throughput.py).
# Flags are read when the backend starts, so this must precede any JAX
# computation; it is a no-op on GPU and TPU, and a user's setting wins.
_CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if _CPU_SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_CPU_SCHEDULER_FLAG}=true".strip()


quiet_tensorflow.install()
