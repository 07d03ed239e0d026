"""The cyclic garbage collector's policy for a process that holds thousands of connections.

CPython runs a full collection each time the objects that survived earlier collections have
grown by a quarter, and each walks every object the collector tracks: with 10,000 connections
open (a few hundred objects each) one stalls every socket for 100-400 ms, again and again while
they connect (docs/benchmarks.md, figure 6i). `SurvivorFreezing` freezes what survived each full
collection (`gc.freeze`, as the start-up heap is frozen once in gateway/__main__.py), so the
next ones walk only what is newer. Frozen objects are still freed as soon as nothing refers to
them; only reference cycles among them (garbage a closed connection may leave behind) wait, for
the thaw: every `thaw_s` the frozen objects are handed back (`gc.unfreeze`), and the next full
collection walks everything once more, collects them, and the freezing starts again.

A full collection then walks what survived since the one before, so how long it stalls the
loop depends on how often it runs: CPython's default makes it wait for ten collections of the
middle generation, by when 10,000 connections opening 100 at a time had left 20-34 ms of
objects to walk each time (fifteen times over); after each one (`FULL_AFTER_MIDDLE`) the same
work is split into eighty pauses of 3 ms at the 90th percentile (docs/benchmarks.md, 6i).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

OLDEST_GENERATION = 2
# Collections of the middle generation between two full ones (CPython's default: 10).
FULL_AFTER_MIDDLE = 1


class SurvivorFreezing:
    def __init__(self, thaw_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._thaw_s = thaw_s
        self._clock = clock
        self._thawed_at = clock()
        self._thresholds: tuple[int, int, int] | None = None

    def install(self) -> None:
        gc.callbacks.append(self)
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, FULL_AFTER_MIDDLE)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """A `gc.callbacks` entry: after each full collection, freeze its survivors, unless it
        is time to thaw."""
        if phase != "stop" or info["generation"] != OLDEST_GENERATION:
            return
        now = self._clock()
        if now - self._thawed_at >= self._thaw_s:
            gc.unfreeze()
            self._thawed_at = now
            return
        gc.freeze()
