"""The two pieces of asyncio state uvicorn's WebSocket protocol keeps per connection, made light.

uvicorn gives every connection an `asyncio.Queue` for the messages the application receives
and an `asyncio.Event` saying whether the transport takes writes: five deques (three of the
queue's, one in the queue's own `_finished` event, the event's; about 380 bytes each, empty or
not) and the objects around them, about 4 KiB of the 34 KiB an idle connection held
(tracemalloc, 1,000 connections). A connection receives one message at a time (uvicorn
pauses reading once a message is queued, until the application takes it) and has one reader,
so a list and a future made only while somebody waits do the same work. Both offer exactly the
methods uvicorn calls (gateway/server/ws_guard.py puts them in place).
"""

from __future__ import annotations

import asyncio
from typing import Any


class ReceivedMessages:
    """`asyncio.Queue`'s `put_nowait`, `get` and `empty`, for one reader at a time."""

    __slots__ = ("_getter", "_messages")

    def __init__(self) -> None:
        self._messages: list[Any] = []
        self._getter: asyncio.Future[None] | None = None

    def empty(self) -> bool:
        return not self._messages

    def qsize(self) -> int:
        return len(self._messages)

    def put_nowait(self, message: Any) -> None:
        self._messages.append(message)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def get(self) -> Any:
        while not self._messages:
            getter = self._getter = asyncio.get_running_loop().create_future()
            try:
                await getter
            finally:
                self._getter = None
        # A handful at most: reading is paused while one waits (see above).
        return self._messages.pop(0)


class Writable:
    """`asyncio.Event`'s `set`, `clear`, `is_set` and `wait`, its waiters' list made only
    while the transport is paused and somebody waits."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = True
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
