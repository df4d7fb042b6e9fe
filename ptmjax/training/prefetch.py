"""Batches put on the devices ahead of the train step, by a background thread.

The train step runs asynchronously: JAX returns as soon as it is dispatched.
`DevicePrefetcher` lets the host use that time: a thread reads the next host
batches from the pipeline and puts them on the devices (`to_device`, e.g.
`partitioning.global_batch`, a `jax.make_array_from_process_local_data` with
the batch sharding), keeping up to `size` of them ready in a queue, while the
loop's thread dispatches steps. The batches and their order are those of the
source: one thread reads it in order, and the queue is first in, first out.

The data position stays exact: `state()` counts the batches the loop has
taken, not those read ahead, so a checkpoint's `batches_consumed` is what the
run consumed and a resumed run reads exactly the batches it would have.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

Batch = TypeVar("Batch")
DeviceBatch = TypeVar("DeviceBatch")
_POLL_S = 0.1  # how often a blocked thread looks at the stop flag


class PositionedIterator(Protocol[Batch]):
    """An iterator that knows its position: `pipeline.ResumableIterator`."""

    def __next__(self) -> Batch: ...

    def state(self) -> dict[str, int]: ...


class DevicePrefetcher(Generic[Batch, DeviceBatch], Iterator[DeviceBatch]):
    """Yields `to_device(batch)` for each batch of `source`, in order; `size` of them prepared ahead.

    `size=0` prepares nothing ahead: `to_device` runs in the caller's thread,
    batch by batch, as a loop without a prefetcher would. Close it (or use it
    as a context manager) to stop and join the thread; an error in the thread
    (the pipeline's, or `to_device`'s) is raised by the `next` that would have
    returned that batch, after the batches before it.
    """

    def __init__(self, source: PositionedIterator[Batch], to_device: Callable[[Batch], DeviceBatch], size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"prefetch size={size!r} must be an int >= 0 (0: no background thread)")
        self._source, self._to_device, self.size = source, to_device, size
        self._start = source.state()["batches_consumed"]
        self._taken = 0
        self._finished = False
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(size, 1))
        self._thread = None
        if size:
            self._thread = threading.Thread(target=self._fill, name="ptmjax-device-prefetch", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        """The thread: reads and puts batches until the source ends, fails, or `close` is called."""
        try:
            while not self._stop.is_set():
                try:
                    batch = next(self._source)
                except StopIteration:
                    self._put(("end", None))
                    return
                if not self._put(("batch", self._to_device(batch))):
                    return
        except BaseException as error:  # handed to the consumer, raised in its thread
            self._put(("error", error))

    def _put(self, item: tuple[str, Any]) -> bool:
        """Queues `item` once there is room; False if closed meanwhile."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> DevicePrefetcher[Batch, DeviceBatch]:
        return self

    def __next__(self) -> DeviceBatch:
        if self._finished:
            raise StopIteration
        if self._stop.is_set():
            raise RuntimeError("the prefetcher is closed")
        if self._thread is None:
            try:
                batch = self._to_device(next(self._source))
            except BaseException:  # the end, or an error: as with the thread, nothing follows
                self._finished = True
                raise
        else:
            kind, batch = self._queue.get()
            if kind != "batch":
                self._finished = True
                self.close()
                if kind == "error":
                    raise batch
                raise StopIteration
        self._taken += 1
        return batch

    def state(self) -> dict[str, int]:
        """{'batches_consumed': n}: the source's position plus the batches taken from here (not read ahead)."""
        return {"batches_consumed": self._start + self._taken}

    def close(self) -> None:
        """Stops the thread and waits for it; batches read ahead are dropped. Safe to call again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> DevicePrefetcher[Batch, DeviceBatch]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
