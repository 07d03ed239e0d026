"""LeaseKeeper: renews every run lease this process holds, all of them in one write per tick.

A run's lease must be renewed well before it expires (every third of its time-to-live) for as
long as the run streams here. One task and one transaction for every lease, on the event log's
writer connection, rather than a task and a transaction per run: with 200 runs streaming,
per-run renewals were 40 write transactions a second through the engine, each holding SQLite's
write lock across event-loop turns while the event log's commits waited behind it (hundreds of
milliseconds of delivery lag each).

A lease the renewal finds gone (another process took the run over after this one stalled past
the lease's expiry) is dropped and its holder told at once, so it stops writing for the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.event_log.writer import EventLog
from gateway.observability.log_fields import unbound_context
from persistence.errors import StorageUnavailable
from persistence.leases import Lease, LeaseRepository

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, event_log: EventLog, ttl_s: float) -> None:
        self._log = event_log
        self._ttl_s = ttl_s
        self._held: dict[Lease, Callable[[], None]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> frozenset[Lease]:
        return frozenset(self._held)

    def hold(self, lease: Lease, on_lost: Callable[[], None]) -> None:
        """Keep `lease` renewed until `drop`; `on_lost` is called once if it is lost."""
        self._held[lease] = on_lost
        if self._task is None or self._task.done():
            # Created by the first run that needs it, but about every run: its lines (and the
            # `on_lost` calls it makes) carry no run's fields but those they bind themselves.
            self._task = asyncio.create_task(
                self._loop(), name="lease-keeper", context=unbound_context()
            )

    def drop(self, lease: Lease) -> None:
        self._held.pop(lease, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def renew(self) -> None:
        """Renew every held lease now, in one transaction; tell the holders of lost ones."""
        leases = list(self._held)
        if not leases:
            return
        ttl_s = self._ttl_s
        held, _ = await self._log.commit(
            action=lambda conn: LeaseRepository.renew_all_in(conn, leases, ttl_s)
        )
        for lease in leases:
            if lease in held:
                continue
            on_lost = self._held.pop(lease, None)
            if on_lost is not None:
                # Also reached by a run that released its lease as it ended, just before its
                # holder dropped it: the holder knows which of the two it is.
                on_lost()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                await self.renew()
            except StorageUnavailable:
                # Fencing still protects the log; the next tick tries again, well before the
                # leases expire.
                log.warning("lease renewal skipped: storage unavailable")
            except Exception:
                log.error("lease renewal failed", exc_info=True)
