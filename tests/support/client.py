"""A protocol client for tests over a real `websockets` connection.

A background reader routes `ack`/`error` frames to the request that carries their `ref`, and
collects `event` frames so a test can wait for what it expects and inspect everything seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection


class ProtocolFailure(AssertionError):
    def __init__(self, frame: dict[str, Any]) -> None:
        super().__init__(f"{frame.get('code')}: {frame.get('message')}")
        self.frame = frame
        self.code = frame.get("code")


class Client:
    def __init__(self, ws: ClientConnection, welcome: dict[str, Any]) -> None:
        self.ws = ws
        self.welcome = welcome
        self.frames: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        self.closed: asyncio.Future[tuple[int | None, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(
        cls, url: str, token: str, *, hello: dict[str, Any] | None = None, **connect_kwargs: Any
    ) -> Client:
        """`hello`: more fields of the hello frame (`omit`)."""
        ws = await websockets.connect(url, max_size=None, **connect_kwargs)
        first = {"type": "hello", "protocol": 1, "token": token, **(hello or {})}
        await ws.send(json.dumps(first))
        welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if welcome.get("type") != "welcome":
            await ws.close()
            raise ProtocolFailure(welcome)
        return cls(ws, welcome)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                frame = json.loads(raw)
                self.frames.append(frame)
                kind = frame.get("type")
                if kind == "ping":
                    await self.ws.send('{"type":"pong"}')
                ref = frame.get("ref")
                if kind in ("ack", "error", "pong") and ref in self._pending:
                    self._pending.pop(ref).set_result(frame)
                if kind == "event":
                    self.events.append(frame)
                async with self._changed:
                    self._changed.notify_all()
        except websockets.ConnectionClosed:
            pass
        finally:
            rcvd = self.ws.protocol.close_rcvd
            if not self.closed.done():
                self.closed.set_result((rcvd.code if rcvd else None, rcvd.reason if rcvd else ""))
            async with self._changed:
                self._changed.notify_all()

    async def request(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Send a frame with a fresh id; return its ack or raise ProtocolFailure."""
        ref = f"q{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        await self.ws.send(json.dumps({"type": type_, "id": ref, **fields}))
        frame = await asyncio.wait_for(future, 20)
        if frame["type"] == "error":
            raise ProtocolFailure(frame)
        return frame

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
    ) -> dict[str, Any]:
        """The first frame (of all received so far and to come) matching `predicate`."""

        async def scan() -> dict[str, Any]:
            seen = 0
            async with self._changed:
                while True:
                    for frame in self.frames[seen:]:
                        if predicate(frame):
                            return frame
                    seen = len(self.frames)
                    if self.closed.done():
                        raise ConnectionError(f"closed {self.closed.result()} while waiting")
                    await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def wait_event(self, name: str, timeout: float = 20, **data: Any) -> dict[str, Any]:
        def match(frame: dict[str, Any]) -> bool:
            if frame.get("type") != "event" or frame.get("event") != name:
                return False
            return all(frame["data"].get(k) == v for k, v in data.items())

        return await self.wait_for(match, timeout)

    def events_of(self, thread_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["thread_id"] == thread_id]

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def final_text(events: list[dict[str, Any]], run_id: str) -> str:
    completed = [e for e in events if e["event"] == "run.completed" and e["run_id"] == run_id]
    assert completed, "run did not complete"
    return str(completed[-1]["data"]["final_output"])


Opener = Callable[..., Awaitable[Client]]


@contextlib.asynccontextmanager
async def clients(gw: Any) -> AsyncIterator[Opener]:
    """Open protocol clients against a test gateway; all are closed when the block ends."""
    opened: list[Client] = []

    async def open_client(user: str = "alice", *roles: str, tenant: str = "acme") -> Client:
        client = await Client.connect(gw.ws_url, gw.token(user, *roles, tenant=tenant))
        opened.append(client)
        return client

    try:
        yield open_client
    finally:
        for client in opened:
            await client.close()
