"""Shared plumbing of the terminal client: URLs, tokens, stdin, output and a reconnecting session.

`Session` owns one WebSocket at a time. It connects (with exponential backoff while the gateway
is unreachable), sends `hello`, answers the server's `ping`, routes `ack`/`error` frames to the
request that carries their `ref` and hands every other frame to the application. When the socket
drops it fails the requests in flight, reconnects, says hello again and calls the application's
`on_connected` hook, which re-subscribes (the application keeps the last seq it applied, so
nothing is shown twice and nothing is missed).

Only the standard library, `websockets` and `httpx` (for development tokens) are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx
import websockets
from websockets.asyncio.client import ClientConnection

PROTOCOL_VERSION = 1
WS_PATH = "/v1/ws"
HELLO_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
# Close codes after which reconnecting cannot help (PROTOCOL §3: bad token or protocol).
FATAL_CLOSE_CODES = {4001}


class FatalError(Exception):
    """Something retrying will not fix (bad token, wrong role, no dev tokens): exit."""


class ConnectionLost(Exception):
    """The socket closed before the server answered a request."""


class ServerError(Exception):
    """The server answered a request with an `error` frame."""

    def __init__(self, frame: dict[str, Any]) -> None:
        self.frame = frame
        self.code = str(frame.get("code") or "error")
        self.message = str(frame.get("message") or "")
        super().__init__(format_error(frame))


def format_error(frame: dict[str, Any]) -> str:
    return f"error {frame.get('code') or 'error'}: {frame.get('message') or ''}".rstrip()


# -- URLs -----------------------------------------------------------------------------------


def endpoints(url: str) -> tuple[str, str]:
    """(http base, ws url) from either form: http://host:8000 or ws://host:8000/v1/ws."""
    parts = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
    scheme = parts.scheme.lower()
    if scheme not in {"http", "https", "ws", "wss"}:
        raise FatalError(f"unsupported URL scheme {parts.scheme!r} (use http://, https://, ws://)")
    secure = scheme in {"https", "wss"}
    path = parts.path.rstrip("/")
    if path.endswith(WS_PATH):
        path = path[: -len(WS_PATH)]
    http_base = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    ws_url = urlunsplit(("wss" if secure else "ws", parts.netloc, path + WS_PATH, "", ""))
    return http_base, ws_url


# -- tokens ---------------------------------------------------------------------------------


@dataclass
class TokenSource:
    """A fixed token, or a development token from `POST /v1/dev/token` fetched on each connect.

    Development secrets are generated per gateway process, so a restarted gateway rejects the
    previous process's tokens: fetching a fresh one on every (re)connect keeps reconnects working.
    """

    http_base: str
    token: str | None = None
    user: str = "alice"
    tenant: str = "demo"
    roles: list[str] = field(default_factory=lambda: ["user"])

    @property
    def is_dev(self) -> bool:
        return self.token is None

    async def get(self) -> str:
        if self.token is not None:
            return self.token
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                f"{self.http_base}/v1/dev/token",
                json={"user": self.user, "tenant": self.tenant, "roles": self.roles},
            )
        if response.status_code == 200:
            return str(response.json()["token"])
        if response.status_code == 404:
            raise FatalError(
                "this gateway does not issue development tokens (GATEWAY_SECRET is set); "
                "pass --token or set GATEWAY_TOKEN"
            )
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"code": f"http_{response.status_code}", "message": response.text[:200]}
        raise FatalError("development token refused: " + format_error(error))


# -- stdin ----------------------------------------------------------------------------------


class StdinLines:
    """Lines of stdin as an asyncio queue; `None` marks end of input.

    A daemon thread does the blocking reads, so a pending read never keeps the process alive
    (and works the same for a TTY, a pipe and a file).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdin
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.eof = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read, name="stdin-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                line = self._stream.readline()
                if not line:
                    break
                self._put(line.rstrip("\r\n"))
        except (OSError, ValueError):
            pass
        self._put(None)

    def _put(self, item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed at exit
            self._loop.call_soon_threadsafe(self._deliver, item)

    def _deliver(self, item: str | None) -> None:
        self.queue.put_nowait(item)
        if item is None:
            self.eof.set()

    @property
    def is_tty(self) -> bool:
        try:
            return self._stream.isatty()
        except (AttributeError, ValueError):
            return False

    def exhausted(self) -> bool:
        """End of input reached and every line read: only the end marker is left, if that."""
        return self.eof.is_set() and self.queue.qsize() <= 1

    async def get(self) -> str | None:
        return await self.queue.get()


# -- output ---------------------------------------------------------------------------------


class Output:
    """Writes text as it arrives and remembers whether the cursor is at the start of a line."""

    def __init__(self, stream: TextIO, *, partner: Output | None = None) -> None:
        self.stream = stream
        self.at_line_start = True
        # Another Output on the same terminal (stderr notices next to stdout's stream of text):
        # a notice starts on a fresh line even when the partner is in the middle of one.
        self.partner = partner
        self.writes = 0
        self._partner_broken_at = -1

    def write(self, text: str) -> None:
        if not text:
            return
        self.stream.write(text)
        self.stream.flush()
        self.writes += 1
        self.at_line_start = text.endswith("\n")

    def line(self, text: str) -> None:
        """A whole line of its own, starting on a fresh line."""
        self.newline()
        partner = self.partner
        if (
            partner is not None
            and not partner.at_line_start
            and partner.writes != self._partner_broken_at
            and _same_terminal(self, partner)
        ):
            self._partner_broken_at = partner.writes
            self.write("\n")
        self.write(text + "\n")

    def newline(self) -> None:
        if not self.at_line_start:
            self.write("\n")


def _same_terminal(a: Output, b: Output) -> bool:
    try:
        return a.stream.isatty() and b.stream.isatty()
    except (AttributeError, ValueError):
        return False


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- the reconnecting session ---------------------------------------------------------------


FrameHandler = Callable[[dict[str, Any]], None]
ConnectedHook = Callable[[], Awaitable[None]]
DisconnectedHook = Callable[[], None]


class Session:
    def __init__(
        self,
        *,
        ws_url: str,
        tokens: TokenSource,
        diag: Output,
        on_frame: FrameHandler,
        on_connected: ConnectedHook,
        on_disconnected: DisconnectedHook | None = None,
        initial_backoff: float = 0.5,
        max_backoff: float = 10.0,
    ) -> None:
        self.ws_url = ws_url
        self.tokens = tokens
        self.diag = diag
        self.on_frame = on_frame
        self.on_connected = on_connected
        self.on_disconnected = on_disconnected
        self.initial_backoff = initial_backoff
        self.max_backoff = max(max_backoff, initial_backoff)
        self.welcome: dict[str, Any] | None = None
        self.connected = asyncio.Event()
        self.connections = 0
        self._ws: ClientConnection | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._hook_task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._dev_token_refusals = 0

    # -- public API -----------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect; returns after `stop()`, raises FatalError."""
        attempt = 0
        while not self._stopping:
            try:
                ws = await self._open()
            except FatalError:
                raise
            except _Unreachable as exc:
                delay = self._backoff(attempt)
                attempt += 1
                self.diag.line(
                    f"-- cannot reach the gateway at {self.ws_url} ({exc}); "
                    f"retrying in {delay:.1f}s"
                )
                await asyncio.sleep(delay)
                continue
            attempt = 0
            await self._serve(ws)
            if self._fatal is not None:
                raise self._fatal
            if not self._stopping:
                delay = self._backoff(0)
                self.diag.line(f"-- connection lost; reconnecting in {delay:.1f}s")
                await asyncio.sleep(delay)

    def stop(self) -> None:
        self._stopping = True
        if self._ws is not None:
            asyncio.get_running_loop().create_task(self._ws.close())

    async def request(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Send a frame with a fresh id once connected; its ack, or ServerError/ConnectionLost."""
        await self.connected.wait()
        ws = self._ws
        if ws is None:
            raise ConnectionLost(type_)
        ref = f"c{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        try:
            await ws.send(json.dumps({"type": type_, "id": ref, **fields}))
        except websockets.ConnectionClosed:
            self._pending.pop(ref, None)
            raise ConnectionLost(type_) from None
        try:
            frame = await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        except TimeoutError:
            self._pending.pop(ref, None)
            raise ConnectionLost(f"{type_}: no answer within {REQUEST_TIMEOUT_S:.0f}s") from None
        if frame.get("type") == "error":
            raise ServerError(frame)
        return frame

    # -- internals ------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        delay = min(self.max_backoff, self.initial_backoff * (2**attempt))
        return delay * random.uniform(0.8, 1.0)

    async def _open(self) -> ClientConnection:
        try:
            token = await self.tokens.get()
        except httpx.TransportError as exc:
            raise _Unreachable(_describe(exc)) from None
        try:
            ws = await websockets.connect(self.ws_url, max_size=None, open_timeout=10)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise _Unreachable(_describe(exc)) from None
        try:
            await ws.send(
                json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": token})
            )
            welcome = json.loads(await asyncio.wait_for(ws.recv(), HELLO_TIMEOUT_S))
        except (websockets.ConnectionClosed, TimeoutError, OSError) as exc:
            await ws.close()
            raise _Unreachable(f"handshake failed: {_describe(exc)}") from None
        if welcome.get("type") != "welcome":
            await ws.close()
            if welcome.get("type") == "error":
                if welcome.get("code") == "unauthorized" and self.tokens.is_dev:
                    # A development token from a gateway that restarted in between: fetch anew.
                    self._dev_token_refusals += 1
                    if self._dev_token_refusals <= 3:
                        raise _Unreachable(format_error(welcome))
                raise FatalError(format_error(welcome))
            raise FatalError(f"unexpected first frame from the server: {welcome.get('type')!r}")
        self.welcome = welcome
        self._dev_token_refusals = 0
        self.connections += 1
        roles = ", ".join(welcome.get("roles") or [])
        verb = "connected" if self.connections == 1 else "reconnected"
        self.diag.line(
            f"-- {verb} to {self.ws_url} as {welcome.get('user')} "
            f"(tenant {welcome.get('tenant')}, roles {roles})"
        )
        return ws

    async def _serve(self, ws: ClientConnection) -> None:
        self._ws = ws
        self.connected.set()
        self._hook_task = asyncio.create_task(self._run_hook())
        try:
            async for raw in ws:
                try:
                    frame = json.loads(raw)
                except ValueError:
                    self.diag.line("-- ignoring a frame that is not JSON")
                    continue
                if not isinstance(frame, dict):
                    continue
                self._dispatch(ws, frame)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.connected.clear()
            self._ws = None
            if self.on_disconnected is not None:
                self.on_disconnected()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionLost("connection closed"))
            self._pending.clear()
            if self._hook_task is not None and not self._hook_task.done():
                self._hook_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._hook_task
            rcvd = ws.protocol.close_rcvd
            fatal_close = rcvd is not None and rcvd.code in FATAL_CLOSE_CODES
            if fatal_close and not self.tokens.is_dev and not self._stopping:
                assert rcvd is not None
                self._fatal = FatalError(
                    f"the server closed the connection ({rcvd.code} {rcvd.reason})".strip()
                )

    def _dispatch(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ping":
            asyncio.get_running_loop().create_task(_send_quietly(ws, '{"type":"pong"}'))
            return
        ref = frame.get("ref")
        if kind in {"ack", "error", "pong"} and isinstance(ref, str) and ref in self._pending:
            future = self._pending.pop(ref)
            if not future.done():
                future.set_result(frame)
            return
        if kind == "error":
            self.diag.line(format_error(frame))
            return
        if kind in {"ack", "pong"}:
            return
        self.on_frame(frame)

    async def _run_hook(self) -> None:
        try:
            await self.on_connected()
        except FatalError as exc:
            self._fatal = exc
            if self._ws is not None:
                await self._ws.close()
        except ConnectionLost:
            pass  # the reconnect runs the hook again
        except ServerError as exc:
            self.diag.line(str(exc))


class _Unreachable(Exception):
    pass


async def _send_quietly(ws: ClientConnection, text: str) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.send(text)


def _describe(exc: BaseException) -> str:
    cause: BaseException | None = exc
    for _ in range(10):  # httpx and websockets wrap the OS error
        if cause is None:
            break
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, websockets.InvalidStatus):
        return f"HTTP {exc.response.status_code} on upgrade"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_app(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """asyncio.run with clean exits: Ctrl-C is 130, a FatalError prints its reason and is 1."""
    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except FatalError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
