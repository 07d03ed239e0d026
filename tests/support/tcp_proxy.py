"""A TCP proxy on loopback that a test can cut and restore: a database "unreachable" for a
while, for processes that reach it through the proxy, without touching the real server.

`cut()` closes every proxied connection and stops listening (new connections are refused);
`restore()` listens again on the same port. `freeze()` keeps every connection open but forwards
nothing more either way, and answers nothing on new ones (a server stopped with SIGSTOP, a
network that drops packets); `thaw()` forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = 0
        # Set while bytes may flow.
        self._flowing = asyncio.Event()
        self._flowing.set()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def restore(self) -> None:
        await self.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            self._pipes.discard(task)
            return
        try:
            await asyncio.gather(
                _pump(reader, upstream_writer, self._flowing),
                _pump(upstream_reader, writer, self._flowing),
            )
        except asyncio.CancelledError:
            pass
        finally:
            for w in (writer, upstream_writer):
                w.transport.abort()
            self._pipes.discard(task)


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def tcp_proxy(host: str, port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(host, port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.cut()
