"""What the training loop does differently when it runs as several processes.

One process per host (or per GPU) runs the same loop, after
`initialize_distributed` has joined them. They must agree on everything that
launches a collective computation, so:

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
from collections.abc import Callable, Iterator, Mapping, Sequence

import gin
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


@gin.configurable
def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
) -> None:
    """Connects this host to the others with `jax.distributed.initialize`; call it before any JAX computation.

    With no arguments JAX detects the cluster from the environment (Cloud TPU
    VMs, SLURM, Open MPI). Elsewhere give all of coordinator_address
    ('host:port' of process 0), num_processes and process_id (0 ..
    num_processes - 1). `local_device_ids` restricts this process to some local
    devices; under SLURM JAX otherwise gives each process one GPU (its
    SLURM_LOCALID), so with one process per node list all the node's GPUs.
    Calling it again once connected does nothing. `ptmjax train --distributed`
    calls it (with its gin bindings) before anything else.
    """
    explicit = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    missing = [name for name, value in explicit.items() if value is None]
    if 0 < len(missing) < len(explicit):
        given = ", ".join(f"{name}={value!r}" for name, value in explicit.items() if value is not None)
        raise ValueError(
            f"initialize_distributed got {given} but not {', '.join(missing)}; give all three (a cluster JAX cannot "
            "detect) or none (auto-detection on Cloud TPU VMs, SLURM and Open MPI)."
        )
    if coordinator_address is not None:
        host, _, port = coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"initialize_distributed.coordinator_address={coordinator_address!r} must be 'host:port' with a port "
                "in 1..65535, e.g. '10.0.0.1:1234' (process 0's address)."
            )
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"initialize_distributed.num_processes must be an int >= 1, got {num_processes!r}.")
        if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ValueError(
                f"initialize_distributed.process_id must be an int in [0, num_processes={num_processes}), "
                f"got {process_id!r}."
            )
    if local_device_ids is not None:
        local_device_ids = list(local_device_ids)
        if not local_device_ids or any(type(i) is not int or i < 0 for i in local_device_ids):
            raise ValueError(
                f"initialize_distributed.local_device_ids must be non-negative device ids, got {local_device_ids!r}."
            )
    if jax.distributed.is_initialized():
        return
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
        local_device_ids=local_device_ids,
    )
    print(
        f"process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local of "
        f"{jax.device_count()} devices"
    )
