"""Periodic retention sweeps (GATEWAY_RETENTION_S; off when 0)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from persistence.clock import utcnow
from persistence.errors import StorageUnavailable
from persistence.retention import RetentionRepository, SweepResult
from persistence.store import Store

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, store: Store, *, retention_s: float, sweep_s: float) -> None:
        self._repository = RetentionRepository(store)
        self._retention_s = retention_s
        self._sweep_s = sweep_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._retention_s > 0:
            self._task = asyncio.create_task(self._loop(), name="retention")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sweep(self) -> SweepResult:
        cutoff = utcnow() - timedelta(seconds=self._retention_s)
        total = SweepResult(0, 0, 0, 0)
        while True:
            result = await self._repository.sweep(cutoff)
            total = SweepResult(
                total.runs + result.runs,
                total.threads + result.threads,
                total.events + result.events,
                total.checkpoints + result.checkpoints,
            )
            if result.runs == 0:
                return total

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                result = await self.sweep()
            except StorageUnavailable:
                log.warning("retention sweep skipped: storage unavailable")
                continue
            if result.runs:
                log.info(
                    "retention removed %d events and %d checkpoints of %d runs on %d threads",
                    result.events,
                    result.checkpoints,
                    result.runs,
                    result.threads,
                )
