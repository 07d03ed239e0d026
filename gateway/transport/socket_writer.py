"""A connection's writer: its outbox drained into the socket through the raw ASGI `send`.

On the gateway's own server (gateway/server/ws_guard.py announces `SEND_FRAMES` in the scope) two
shortcuts apply, both for the many-watchers case, where every event lands in every watcher's
connection at once:

- a live event offered while nothing is queued or being sent, and while the transport takes
  writes, is written at once (`write_now`): no queue entry, no wake-up of the writer task, no
  ASGI message. Otherwise it is queued behind what is waiting, so the order holds;
- the frames queued behind the one the writer awaited go out together, one ASGI message and
  one write to the transport for all of them.

Elsewhere (another server) each frame is its own `websocket.send` from the writer task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import Send

from gateway.server.ws_guard import SEND_FRAMES
from gateway.transport.outbox import Outbox

# A batch stops growing at this many bytes: it is handed to the transport whole, so this is
# what a peer that stopped reading can hold beyond the outbox's own bound (with the transport's
# high-water mark, 64 KiB, before writes wait).
BATCH_BYTES = 64 * 1024

WriteNow = Callable[[str], bool]


class SocketWriter:
    # One per connection, idle ones included: no instance dict.
    __slots__ = ("_batches", "_delivered", "_holding", "_outbox", "_send", "_write_now")

    def __init__(
        self,
        outbox: Outbox,
        send: Send,
        scope: Mapping[str, Any] | None,
        delivered: Callable[[float], None] | None,
    ) -> None:
        """`scope`: the connection's ASGI scope when `send` is the server's raw `send` (None:
        Starlette's, which takes one `websocket.send` at a time). `delivered` gets the commit
        time of each live frame once it is written (the delivery lag), with metrics on."""
        self._outbox = outbox
        self._send = send
        extension = ((scope or {}).get("extensions") or {}).get(SEND_FRAMES)
        self._batches = extension is not None
        self._write_now: WriteNow | None = extension.get("write_now") if extension else None
        self._delivered = delivered
        # True while the writer task holds frames it took from the outbox and has not
        # written yet: nothing may overtake them.
        self._holding = False

    def offer_live(self, text: str, committed: float) -> bool:
        """Send or queue the frame of a live event committed at `committed` (0.0: not
        measured); False when the outbox is full (nothing sent or queued)."""
        outbox = self._outbox
        if (
            self._write_now is not None
            and not self._holding
            and outbox.empty()
            and self._write_now(text)
        ):
            if committed and self._delivered is not None:
                self._delivered(committed)
            return True
        try:
            outbox.put_stamped_nowait(text, committed)
        except asyncio.QueueFull:
            return False
        return True

    async def run(self) -> None:
        """Send every frame queued in the outbox, in order, until cancelled or the socket
        fails (the ASGI server's exception propagates)."""
        outbox = self._outbox
        delivered = self._delivered
        while True:
            # Take what is already queued without a coroutine per frame (replays queue
            # hundreds at once); wait only when the queue is empty.
            # (Awaited outside the `except`: an idle connection's writer would otherwise keep
            # the exception being handled, and its traceback, while it waits.)
            text = None if outbox.empty() else outbox.get_nowait()
            if text is None:
                text = await outbox.get()
            self._holding = True
            if self._batches:
                frames, stamps = outbox.take_batch(text, BATCH_BYTES)
                await self._send({"type": SEND_FRAMES, "frames": frames})
            else:
                stamps = [outbox.taken_stamp]
                await self._send({"type": "websocket.send", "text": text})
            self._holding = False
            if delivered is not None:
                for committed in stamps:
                    if committed:
                        delivered(committed)
