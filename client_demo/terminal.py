"""Shared plumbing of the terminal client: URLs, tokens, stdin, output and a reconnecting session.

`Session` owns one WebSocket at a time. It connects (with exponential backoff while the gateway
is unreachable), sends `hello`, answers the server's `ping`, routes `ack`/`error` frames to the
request that carries their `ref` and hands every other frame to the application. When the socket
drops it fails the requests in flight, reconnects, says hello again and calls the application's
`on_connected` hook, which re-subscribes (the application keeps the last seq it applied, so
nothing is shown twice and nothing is missed).

Tokens expire, and the gateway closes a connection (4001) when its token does (docs/protocol.md
§3). Some time before that, a development token is replaced by a new one from the gateway, sent
in a new `hello` on the open socket: the connection, its subscriptions and the text streaming on
it go on. A token the user passed in cannot be renewed by the client, so it warns before the
token expires and, when the gateway closes the connection for it, exits saying so.

Only the standard library, `websockets` and `httpx` (for development tokens) are used.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import random
import sys
import threading
import time
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
# Close codes after which reconnecting cannot help (docs/protocol.md §7: bad token or protocol).
FATAL_CLOSE_CODES = {4001}
# A token is renewed (or, when the client cannot renew it, the user warned) once this share of
# its remaining lifetime has passed, and at least RENEW_LEAD_S before it expires: time for the
# round trips, and for clocks that disagree a little.
RENEW_SHARE = 0.8
RENEW_LEAD_S = 3.0
RENEW_RETRY_S = 2.0


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


def token_claims(token: str) -> dict[str, Any] | None:
    """The JWT's claims, decoded without verifying it: only to time renewals (the gateway is
    the one that verifies tokens)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return None
    return claims if isinstance(claims, dict) else None


@dataclass(frozen=True)
class TokenTimes:
    """When a token expires and when to renew it, as `time.time()` readings."""

    expires_at: float
    renew_at: float


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def token_times(token: str, received_at: float) -> TokenTimes | None:
    """None for a token without a usable `exp` (the gateway refuses those anyway)."""
    claims = token_claims(token) or {}
    exp, iat = _number(claims.get("exp")), _number(claims.get("iat"))
    if exp is None:
        return None
    expires_at = exp
    if iat is not None and exp > iat:
        # The lifetime counted from when the token arrived does not depend on this machine's
        # clock agreeing with the issuer's; the earlier of the two estimates is the safe one.
        expires_at = min(expires_at, received_at + (exp - iat))
    remaining = expires_at - received_at
    delay = max(0.0, min(remaining * RENEW_SHARE, remaining - RENEW_LEAD_S))
    return TokenTimes(expires_at=expires_at, renew_at=received_at + delay)


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


@dataclass
class TokenSource:
    """A fixed token, or a development token from `POST /v1/dev/token` fetched on each connect
    and whenever the current one is about to expire.

    Development secrets are generated per gateway process, so a restarted gateway rejects the
    previous process's tokens: fetching a fresh one on every (re)connect keeps reconnects working.
    """

    http_base: str
    token: str | None = None
    user: str = "alice"
    tenant: str = "demo"
    roles: list[str] = field(default_factory=lambda: ["user"])
    # Lifetime of development tokens in seconds; None: the gateway's default (an hour).
    ttl_s: int | None = None

    @property
    def is_dev(self) -> bool:
        return self.token is None

    async def get(self) -> str:
        if self.token is not None:
            return self.token
        body: dict[str, Any] = {"user": self.user, "tenant": self.tenant, "roles": self.roles}
        if self.ttl_s is not None:
            body["ttl_s"] = self.ttl_s
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(f"{self.http_base}/v1/dev/token", json=body)
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
        self.renewals = 0
        # The token the current connection said hello with (or renewed to), and when it came.
        self._token: str | None = None
        self._token_received_at = 0.0
        self._warned_token: str | None = None
        # The last `unauthorized` error the server sent unasked: it explains the 4001 close
        # that follows (an expired token, a refused renewal).
        self._auth_error: dict[str, Any] | None = None
        self._expired_close = False

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
                if self._expired_close:
                    self.diag.line(
                        "-- the token expired before it could be renewed; reconnecting with a "
                        f"new one in {delay:.1f}s"
                    )
                else:
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
        received_at = time.time()
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
                if welcome.get("code") == "unauthorized" and not self.tokens.is_dev:
                    raise FatalError(
                        f"{format_error(welcome)} (pass a valid token with --token or "
                        "GATEWAY_TOKEN)"
                    )
                raise FatalError(format_error(welcome))
            raise FatalError(f"unexpected first frame from the server: {welcome.get('type')!r}")
        self.welcome = welcome
        self._dev_token_refusals = 0
        self._token, self._token_received_at = token, received_at
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
        self._auth_error = None
        self._expired_close = False
        self.connected.set()
        self._hook_task = asyncio.create_task(self._run_hook())
        renewal = asyncio.create_task(self._keep_token_fresh(), name="token-renewal")
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
            for task in (self._hook_task, renewal):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            rcvd = ws.protocol.close_rcvd
            fatal_close = rcvd is not None and rcvd.code in FATAL_CLOSE_CODES
            self._expired_close = fatal_close and self._token_expired()
            if fatal_close and not self.tokens.is_dev and not self._stopping:
                assert rcvd is not None
                self._fatal = FatalError(self._fatal_close_message(rcvd.code, rcvd.reason))

    def _token_expired(self) -> bool:
        """Whether the last 4001 was for the token's expiry: the server said so, or it is
        past the token's `exp` by this machine's reckoning."""
        message = str((self._auth_error or {}).get("message") or "")
        if "expired" in message:
            return True
        times = token_times(self._token, self._token_received_at) if self._token else None
        return times is not None and time.time() >= times.expires_at

    def _fatal_close_message(self, code: int, reason: str) -> str:
        if self._expired_close:
            times = token_times(self._token, self._token_received_at) if self._token else None
            when = f" at {clock(times.expires_at)}" if times is not None else ""
            return (
                f"the access token expired{when} and the gateway ended the session ({code}); "
                "start the client again with a fresh token (--token or GATEWAY_TOKEN)"
            )
        text = f"the server closed the connection ({code} {reason})".strip()
        if self._auth_error is not None:
            text += f": {format_error(self._auth_error)}"
        return text

    # -- token renewal --------------------------------------------------------------------

    async def _keep_token_fresh(self) -> None:
        """While this connection is open: renew a development token before it expires, or
        warn once about a token the client cannot renew."""
        with contextlib.suppress(ConnectionLost):  # the reconnect brings a new token
            await self._renewal_loop()

    async def _renewal_loop(self) -> None:
        while self._token is not None:
            times = token_times(self._token, self._token_received_at)
            if times is None:
                return
            await asyncio.sleep(max(0.0, times.renew_at - time.time()))
            if not self.tokens.is_dev:
                self._warn_expiry(self._token, times.expires_at)
                return
            while not await self._renew():
                left = times.expires_at - time.time()
                if left <= 0:
                    # The gateway ends this connection now; the reconnect fetches a new token.
                    return
                await asyncio.sleep(max(0.2, min(RENEW_RETRY_S, left / 2)))

    async def _renew(self) -> bool:
        """Fetch a new development token and say hello with it on the open socket. False
        when that failed but may work on a retry; ConnectionLost when the socket went."""
        try:
            token = await self.tokens.get()
            received_at = time.time()
            await self.request("hello", protocol=PROTOCOL_VERSION, token=token)
        except ServerError as exc:
            # `unavailable` (the gateway could not check the token right now): the current
            # token still holds, so try again. Anything else is followed by a 4001 close.
            self.diag.line(f"-- could not renew the token ({exc})")
            return False
        except (httpx.TransportError, FatalError) as exc:
            reason = _describe(exc) if isinstance(exc, httpx.TransportError) else str(exc)
            self.diag.line(f"-- could not get a new development token ({reason})")
            return False
        self._token, self._token_received_at = token, received_at
        self.renewals += 1
        times = token_times(token, received_at)
        until = f" (valid until {clock(times.expires_at)})" if times is not None else ""
        self.diag.line(f"-- token renewed{until}")
        return True

    def _warn_expiry(self, token: str, expires_at: float) -> None:
        if self._warned_token == token:
            return  # a reconnect with the same token: said already
        self._warned_token = token
        self.diag.line(
            f"-- warning: the access token expires at {clock(expires_at)} (in "
            f"{duration(expires_at - time.time())}); the gateway will then end the session. "
            "This client cannot renew a token it was given: start it again with a fresh one "
            "(--token or GATEWAY_TOKEN) to go on."
        )

    def _dispatch(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ping":
            asyncio.get_running_loop().create_task(_send_quietly(ws, '{"type":"pong"}'))
            return
        ref = frame.get("ref")
        # A renewing hello is answered by a `welcome` carrying its id, not by an `ack`.
        routed = {"ack", "error", "pong", "welcome"}
        if kind in routed and isinstance(ref, str) and ref in self._pending:
            future = self._pending.pop(ref)
            if not future.done():
                future.set_result(frame)
            return
        if kind == "error":
            if frame.get("code") == "unauthorized" and ref is None:
                # The 4001 close that follows reports it, in words fit for a user.
                self._auth_error = frame
                return
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
