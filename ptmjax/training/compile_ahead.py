"""A run's first programs compiled in background threads while the loop checks and reads its data.

Before its first step a run checks its splits and builds its input pipeline
(seconds of Python and TensorFlow work) and compiles its state's
initialisation and its train step (seconds of XLA work). `CompileAhead`
starts those compiles in threads when the run begins, each with the shapes
and shardings the loop will call it with; the loop `wait`s for one before its
own first call of that program, which then finds it in JAX's persistent
compilation cache instead of compiling it again. Only useful with that cache
on (`train.compilation_cache_dir`): JAX's in-memory caches do not carry an
ahead-of-time compile over to a jitted call in general. `train.compile_ahead
= True` turns it on; it is off by default, because it only pays where the
host has idle cores: on a 2-core CPU shared with other work the threads'
tracing competed with the data checks for the same cores and a cold start
took longer (docs/performance.md).

It changes no result: a program loaded from the cache is the one XLA would
compile (the cache's key covers the program, its options and versions). A
compile that fails in the background is ignored; the loop's own call then
compiles the program and raises what is wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


class CompileAhead:
    """Runs each job (a name: a function that compiles something) in its own daemon thread."""

    def __init__(self, jobs: Mapping[str, Callable[[], object]]):
        self.failed: dict[str, BaseException] = {}
        self._threads = {
            name: threading.Thread(target=self._run, args=(name, job), name=f"ptmjax-compile-ahead-{name}",
                                   daemon=True)
            for name, job in jobs.items()
        }  # fmt: skip
        for thread in self._threads.values():
            thread.start()

    def _run(self, name: str, job: Callable[[], object]) -> None:
        try:
            job()
        except Exception as error:  # the loop's own call compiles again and reports it
            self.failed[name] = error

    def wait(self, name: str) -> None:
        """Returns once the job `name` (if there is one) has finished."""
        thread = self._threads.get(name)
        if thread is not None:
            thread.join()

    def wait_all(self) -> None:
        for name in self._threads:
            self.wait(name)
