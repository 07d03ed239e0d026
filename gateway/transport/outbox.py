"""One connection's outgoing frames: a queue bounded in frames and in bytes.

A bound in frames alone let a client that never reads pin a thousand frames of whatever size
the thread's events had (60 KB each made 60 MB per connection). The queue is full once it
holds `max_frames` frames or `max_bytes` bytes of UTF-8, whichever comes first; a frame larger
than `max_bytes` still goes into a queue below the bound, so the queue holds at most
`max_bytes` plus one frame.

Every connection holds one, idle ones included, so it holds nothing while empty: its deque is
made for the first frame queued and dropped once the last is taken, and a waiter's future only
exists while somebody waits. (An `asyncio.Queue` keeps three deques and an `Event` with a
fourth, ~3 KiB, for as long as the connection lives.) It has the `asyncio.Queue` methods the
connection uses, with the same exceptions.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.protocol.wire_size import encoded_size


class Outbox:
    __slots__ = (
        "_entries",
        "_getter",
        "_putters",
        "max_bytes",
        "max_frames",
        "queued_bytes",
        "taken_stamp",
    )

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        """`max_frames` <= 0: bounded in bytes only."""
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        # The commit time of the frame taken last (0.0: not measured): the writer measures the
        # delivery lag with it.
        self.taken_stamp = 0.0
        # Each frame with its size (measured once) and its commit time.
        self._entries: deque[tuple[str, int, float]] | None = None
        # The writer waiting in `get`; senders waiting in `put` for room.
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return len(self._entries) if self._entries else 0

    def empty(self) -> bool:
        return not self._entries

    def full(self) -> bool:
        if self.queued_bytes >= self.max_bytes:
            return True
        return 0 < self.max_frames <= self.qsize()

    def put_nowait(self, text: str) -> None:
        self.put_stamped_nowait(text, 0.0)

    def put_stamped_nowait(self, text: str, committed: float) -> None:
        """Queue the frame of an event committed at `committed` (0.0: not measured);
        `asyncio.QueueFull` (nothing queued) when full."""
        if self.full():
            raise asyncio.QueueFull
        entries = self._entries
        if entries is None:
            entries = self._entries = deque()
        size = encoded_size(text)
        self.queued_bytes += size
        entries.append((text, size, committed))
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def put(self, text: str) -> None:
        """Queue `text`, waiting for room while the queue is full."""
        while self.full():
            putter = asyncio.get_running_loop().create_future()
            if self._putters is None:
                self._putters = deque()
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                putter.cancel()
                if self._putters is not None:
                    try:
                        self._putters.remove(putter)
                    except ValueError:
                        pass
                # Woken, then cancelled: the room it was woken for goes to the next.
                if not self.full() and not putter.cancelled():
                    self._wake_putter()
                raise
        self.put_nowait(text)

    def get_nowait(self) -> str:
        """The oldest frame (its commit time in `taken_stamp`); `asyncio.QueueEmpty` when
        there is none."""
        entries = self._entries
        if not entries:
            raise asyncio.QueueEmpty
        text, size, self.taken_stamp = entries.popleft()
        self.queued_bytes -= size
        if not entries:
            self._entries = None
        if self._putters:
            self._wake_putter()
        return text

    async def get(self) -> str:
        """The oldest frame, waiting for one while the queue is empty (one waiter: the
        connection's writer)."""
        while not self._entries:
            getter = self._getter = asyncio.get_running_loop().create_future()
            try:
                await getter
            finally:
                self._getter = None
        return self.get_nowait()

    def take_batch(self, first: str, max_bytes: int) -> tuple[list[str], list[float]]:
        """`first` (just taken with `get`, its stamp in `taken_stamp`) and the frames queued
        behind it, up to `max_bytes` in all (always at least `first`), with their stamps: what
        one socket write carries. Bounded in bytes so a batch waiting for a peer that stopped
        reading holds little beyond what the queue's own bound allows."""
        frames = [first]
        stamps = [self.taken_stamp]
        size = encoded_size(first)
        while self._entries and size + self._entries[0][1] <= max_bytes:
            size += self._entries[0][1]
            frames.append(self.get_nowait())
            stamps.append(self.taken_stamp)
        return frames, stamps

    def _wake_putter(self) -> None:
        putters = self._putters
        while putters:
            putter = putters.popleft()
            if not putter.done():
                putter.set_result(None)
                break
        if not putters:
            self._putters = None
