"""Step times of a run: from its first step done (which compiles) on, leaving out the time spent evaluating."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class StepClock:
    """`lap(step)` gives the seconds per step since the previous lap (or `start`); time in `paused()` blocks
    (evaluations between steps) is left out."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._step = 0

    @property
    def started(self) -> bool:
        return self._since is not None

    def start(self, step: int) -> None:
        """Step `step` is done, its compile included: timing starts here."""
        self._since, self._step = time.perf_counter(), step

    def lap(self, step: int) -> float | None:
        """Seconds per step from the previous lap to `step`; None when no step was timed (the first step's own
        record) or timing has not started."""
        if self._since is None:
            return None
        now = time.perf_counter()
        seconds = (now - self._since) / (step - self._step) if step > self._step else None
        self._since, self._step = now, step
        return seconds

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The time inside is not step time."""
        began = time.perf_counter()
        try:
            yield
        finally:
            if self._since is not None:
                self._since += time.perf_counter() - began
