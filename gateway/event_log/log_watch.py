"""The safety net for events written by other gateway processes sharing the database.

With a shared relay (Redis) the other processes' commits arrive as wake-ups at once; without
one, or while it is down or drops a message, this is how they arrive: one query per interval
reads the log heads of every thread this process has watchers on and wakes the subscriptions
whose thread grew beyond what they were told of; they then read the table from their cursor.
A thread seen for the first time is woken too: its subscription may have read the table just
before the other process's last events, and nothing later would wake it (a run's pause is its
last event for as long as the pause lasts).
"""

from __future__ import annotations

import asyncio
import logging

from gateway.event_log.bus import EventBus
from persistence.errors import StorageUnavailable
from persistence.slices import slices
from persistence.threads import HEADS_PER_READ, ThreadRepository

log = logging.getLogger(__name__)


class LogWatch:
    def __init__(self, threads: ThreadRepository, bus: EventBus, interval_s: float) -> None:
        self._threads = threads
        self._bus = bus
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._interval_s > 0:
            self._task = asyncio.create_task(self._loop(), name="log-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll()
            except StorageUnavailable:
                log.debug("log watch skipped: storage unavailable")

    async def poll(self) -> None:
        watched = self._bus.watched_threads()
        for chunk in slices(watched, HEADS_PER_READ):
            for thread_id, head in (await self._threads.heads(chunk)).items():
                # A bare wake-up unless the thread's listeners were told of this head already
                # (by this process's own commits or the relay); caught-up ones ignore it cheaply.
                self._bus.wake(thread_id, head)
