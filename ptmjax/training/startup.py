"""Where a run's start-up goes, up to its first step: one line, printed once the first step is done.

`Start-up: 21.3 s from importing ptmjax to the first step done (imports and gin 6.1 s, checks 3.2 s, ...)`,
then what the run noted of its layout (`; pipeline: 4 stages over 'stage', ..., bubble ... = 27.3%`).
The first phase counts from `ptmjax.IMPORTED_AT` (the first `import ptmjax` of
the process: for `ptmjax train`, its start); `benchmarks/input_pipeline.py
--startup` reads the line.
"""

from __future__ import annotations

import time

import ptmjax


class StartupClock:
    """Seconds per named phase, from `ptmjax.IMPORTED_AT` through the last `mark`."""

    def __init__(self, first_phase: str):
        self._last = time.perf_counter()
        self.phases = {first_phase: self._last - ptmjax.IMPORTED_AT}
        self.notes: list[str] = []  # facts of the run the line ends with (its pipeline's bubble)

    def mark(self, phase: str) -> None:
        """Ends `phase`: the seconds since the previous mark."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def line(self) -> str:
        parts = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases.items())
        line = f"Start-up: {sum(self.phases.values()):.1f} s from importing ptmjax to the first step done ({parts})"
        return "; ".join([line, *self.notes])
