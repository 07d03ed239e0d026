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
        # The size of each queued frame, in queue order: each is measured once.
        self._sizes: deque[int] = deque()
        # Beside each frame, the commit time of the live event it carries (0.0: none), and
        # that of the frame `get` returned last: the writer measures the delivery lag with it
        # and no frame has to be wrapped in an object of its own.
        self._stamps: deque[float] = deque()
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
        while self._sizes and size + self._sizes[0] <= max_bytes:
            size += self._sizes[0]
            frames.append(self.get_nowait())
            stamps.append(self.taken_stamp)
        return frames, stamps

    # asyncio.Queue's hooks for subclasses: every put and get goes through them.

    def _put(self, item: str) -> None:
        size = encoded_size(item)
        self._sizes.append(size)
        self.queued_bytes += size
        self._stamps.append(self._next_stamp)
        super()._put(item)  # type: ignore[misc]

    def _get(self) -> str:
        self.queued_bytes -= self._sizes.popleft()
        self.taken_stamp = self._stamps.popleft()
        return super()._get()  # type: ignore[misc,no-any-return]
