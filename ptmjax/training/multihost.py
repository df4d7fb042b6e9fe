"""What the training loop does differently when it runs as several processes.

One process per host (or per GPU) runs the same loop. They must agree on
everything that launches a collective computation, so:

- only process 0 writes the files every process would write alike
  (config.gin, metrics, TensorBoard, the loss curve) and prints progress;
- a SIGTERM reaching any process stops all of them after the same step, where
  they save one checkpoint together (JAX's preemption sync point);
- evaluation runs as many batches on every process, even where this host's
  shard of the split ran out: it then contributes all-padding batches.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

Batch = Mapping[str, np.ndarray]


def is_primary() -> bool:
    """Whether this process writes the run's shared files (process 0)."""
    return jax.process_index() == 0


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[Callable[[int], bool]]:
    """Yields `stop_after(step)`: whether to save and stop once `step` is done.

    Call it once per step on every process. With one process, it answers
    whether SIGTERM arrived (the handler is restored on exit). With several,
    JAX's preemption service (on by default in `jax.distributed.initialize`)
    catches SIGTERM on any process, and every process answers True at the same
    step.
    """
    if jax.process_count() > 1:
        yield multihost_utils.reached_preemption_sync_point
        return
    received = []
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread: no handler can be installed
        yield lambda step: False
        return
    try:
        yield lambda step: bool(received)
    finally:
        signal.signal(signal.SIGTERM, previous)


def batches_in_lockstep(batches: Iterator[Batch], element_shapes: Mapping[str, tuple[int, ...]]) -> Iterator[Batch]:
    """This host's batches, continued with all-zero batches until every process's run out.

    All-zero rows have loss weight 0, so they change no sum. With one process
    this is `batches` itself.
    """
    if jax.process_count() == 1:
        yield from batches
        return
    empty = {name: np.zeros(shape, np.int32) for name, shape in element_shapes.items()}
    while True:
        batch = next(batches, None)
        if not multihost_utils.process_allgather(np.array(batch is not None)).any():
            return
        yield empty if batch is None else batch
