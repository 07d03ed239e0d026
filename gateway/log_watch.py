"""Wake-ups for events written by other gateway processes sharing the database.

The in-process bus only sees this process's commits. Until a shared bus (Redis) is configured,
one query per interval reads the log heads of every thread this process has watchers on and
wakes the subscriptions whose thread grew elsewhere; they then read the table from their cursor.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.bus import EventBus
from persistence.errors import StorageUnavailable
from persistence.slices import slices
from persistence.threads import HEADS_PER_READ, ThreadRepository

log = logging.getLogger(__name__)


class LogWatch:
    def __init__(self, threads: ThreadRepository, bus: EventBus, interval_s: float) -> None:
        # Given the event log's direct path, the poll is one read on the loop's thread: through
        # aiosqlite's thread, the GIL handed back and forth for every row held up the loop
        # itself by tens of milliseconds per poll with many threads watched.
        self._threads = threads
        self._bus = bus
        self._interval_s = interval_s
        self._heads: dict[str, int] = {}
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
        still_watched = set(watched)
        self._heads = {t: h for t, h in self._heads.items() if t in still_watched}
        for chunk in slices(watched, HEADS_PER_READ):
            heads = await self._threads.heads(chunk)
            for thread_id, head in heads.items():
                previous = self._heads.get(thread_id)
                self._heads[thread_id] = head
                # Growth this process published itself reached its subscribers already.
                seen = max(previous or 0, self._bus.published_head(thread_id))
                if previous is not None and head > seen:
                    # A bare wake-up: subscriptions already caught up ignore it cheaply.
                    self._bus.publish(thread_id, [])
