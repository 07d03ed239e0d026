"""Per-user usage shared between gateway processes over the bus, so that the abuse limits of
runs per minute and connections per user count a user's runs and connections on every
process, not only on this one (gateway/abuse/limits.py).

Each process reports, in `usage` messages: every run start it admits (`runs`), a user's open
connections on it whenever that number changes (`connections`), and all of them again every
`REFRESH_S` (`complete`). Receivers count the runs in their own windows and keep each process's
connection counts until its reports stop (`ConnectionCounter.REPORT_TTL_S`: a process that died
stops counting). Only (tenant, user) pairs cross the bus. Without a shared bus this does
nothing: each process applies the limits to its own users.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable
from typing import Any

from gateway.abuse.limits import ConnectionCounter, Limits
from gateway.event_log.bus import EventBus

KIND = "usage"
# Well inside the counts' time to live, so a live process's counts never lapse.
REFRESH_S = ConnectionCounter.REPORT_TTL_S / 3


class SharedUsage:
    def __init__(self, bus: EventBus, limits: Limits) -> None:
        self._bus = bus
        self._limits = limits
        self._refresh: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self._bus.shared:
            return
        self._limits.on_run_started = self._run_started
        self._limits.on_connections_changed = self._connections_changed
        self._bus.on_message(KIND, self._heard)
        self._refresh = asyncio.create_task(self._refresh_counts(), name="usage-refresh")

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh

    def _run_started(self, key: Hashable) -> None:
        self._bus.tell({"kind": KIND, "runs": [list(_pair(key))]})

    def _connections_changed(self, key: Hashable, count: int) -> None:
        self._bus.tell({"kind": KIND, "connections": [[*_pair(key), count]], "complete": False})

    async def _refresh_counts(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            counts = self._limits.connections.counts()
            self._bus.tell(
                {
                    "kind": KIND,
                    "connections": [[*_pair(key), n] for key, n in counts.items()],
                    "complete": True,
                }
            )

    def _heard(self, message: dict[str, Any]) -> None:
        source = message.get("from")
        if not isinstance(source, str):
            return
        for tenant, user in message.get("runs", []):
            self._limits.run_started_elsewhere(str(tenant), str(user))
        if "connections" in message:
            counts: dict[Hashable, int] = {
                (str(tenant), str(user)): int(n) for tenant, user, n in message["connections"]
            }
            self._limits.connections.heard(source, counts, complete=bool(message.get("complete")))


def _pair(key: Hashable) -> tuple[str, str]:
    """The (tenant, user) a limit key stands for."""
    assert isinstance(key, tuple) and len(key) == 2, key
    return str(key[0]), str(key[1])
