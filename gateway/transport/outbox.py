"""One connection's outgoing frames: an `asyncio.Queue` bounded in frames and in bytes.

A bound in frames alone let a client that never reads pin a thousand frames of whatever size
the thread's events had (60 KB each made 60 MB per connection). The queue is full once it
holds `max_frames` frames or `max_bytes` bytes of UTF-8, whichever comes first; a frame larger
than `max_bytes` still goes into a queue below the bound, so the queue holds at most
`max_bytes` plus one frame.
"""

from __future__ import annotations

import asyncio
from collections import deque


def encoded_size(text: str) -> int:
    """The frame's size on the wire; `isascii` is constant-time, so most frames cost nothing."""
    return len(text) if text.isascii() else len(text.encode())


class Outbox(asyncio.Queue[str]):
    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames)
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        # The commit time of the next frame put (0.0: none), and that of the frame `get`
        # returned last: the writer measures the delivery lag with it.
        self._next_stamp = 0.0
        self.taken_stamp = 0.0

    def put_stamped_nowait(self, item: str, committed: float) -> None:
        """`put_nowait` of the frame of a live event committed at `committed`."""
        self._next_stamp = committed
        try:
            self.put_nowait(item)
        finally:
            self._next_stamp = 0.0

    def full(self) -> bool:
        return super().full() or self.queued_bytes >= self.max_bytes

    def take_batch(self, first: str, max_bytes: int) -> tuple[list[str], list[float]]:
        """`first` (just taken with `get`, its stamp in `taken_stamp`) and the frames queued
        behind it, up to `max_bytes` in all (always at least `first`), with their stamps: what
        one socket write carries. Bounded in bytes so a batch waiting for a peer that stopped
        reading holds little beyond what the queue's own bound allows."""
        frames = [first]
        stamps = [self.taken_stamp]
        size = encoded_size(first)
        entries = self._entries
        while entries and size + entries[0][1] <= max_bytes:
            size += entries[0][1]
            frames.append(self.get_nowait())
            stamps.append(self.taken_stamp)
        return frames, stamps

    # asyncio.Queue's hooks for subclasses: its storage is made by `_init`, and every put and
    # get goes through `_put` and `_get`. Each frame is queued with its size (measured once)
    # and its commit time in one deque, not in three side by side: a deque costs ~760 bytes
    # even empty, and every idle connection holds its outbox.

    def _init(self, maxsize: int) -> None:
        self._entries: deque[tuple[str, int, float]] = deque()
        self._queue = self._entries

    def _put(self, item: str) -> None:
        size = encoded_size(item)
        self.queued_bytes += size
        self._entries.append((item, size, self._next_stamp))

    def _get(self) -> str:
        text, size, self.taken_stamp = self._entries.popleft()
        self.queued_bytes -= size
        return text
