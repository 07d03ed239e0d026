"""Hostile traffic against a gateway subprocess, on loopback only: raw HTTP over sockets that
misbehave on purpose, and what it costs the server (memory, descriptors, connections), read
from /proc.

Figures are always compared with a baseline taken in the same test: what is asserted is how
much an attack added, never an absolute amount or a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway

MiB = 1024 * 1024
# Events of about 60 KB: every run's input, its reply and its final output quote one word.
LARGE_WORD = "z" * 60_000
# The settings a gateway needs for runs of LARGE_WORD.
LARGE_EVENTS = {"GATEWAY_MAX_INPUT_CHARS": "61000", "GATEWAY_MAX_FRAME_BYTES": str(256 * 1024)}
# A thread that takes long to send to a client that stops reading.
LARGE_THREAD_BYTES = 8 * MiB


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident set since start), in KiB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in {"VmRSS", "VmHWM"}:
            values[name] = int(rest.split()[0])
    return values


def reset_peak_memory(pid: int) -> bool:
    """Start VmHWM again from the current RSS (Linux ≥ 4.0: write 5 to clear_refs); False
    where that is not allowed, and the caller compares against the earlier peak instead."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def established_to(port: int) -> int:
    """TCP connections in ESTABLISHED or CLOSE_WAIT with local port `port` (the server's
    side of each connection), from /proc/net/tcp."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        # 01 ESTABLISHED, 08 CLOSE_WAIT: the server still holds the socket.
        if int(local.rsplit(":", 1)[1], 16) == port and state in {"01", "08"}:
            count += 1
    return count


async def eventually(check: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)


@dataclass
class RawResponse:
    status: int | None
    head: bytes
    body: bytes


def parse_response(raw: bytes) -> RawResponse:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = None
    parts = head.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        status = int(parts[1])
    return RawResponse(status, head, body)


async def read_response(reader: asyncio.StreamReader, timeout: float) -> RawResponse:
    """What the server sends until it closes or `timeout` passes (a reset counts as closed)."""
    data = b""
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                data += chunk
                if b"\r\n\r\n" in data and _complete(data):
                    break
    return parse_response(data)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


async def post_stream(
    port: int,
    path: str,
    total: int,
    *,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
    chunk: int = 256 * 1024,
) -> RawResponse:
    """POST `total` bytes of body as fast as the server takes them (declared with
    Content-Length, or chunked), stopping as soon as the server answers or closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = asyncio.create_task(read_response(reader, timeout=60))
    block = b" " * chunk
    framed = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    sent = 0
    with contextlib.suppress(ConnectionError):
        while sent < total and not answer.done():
            writer.write(framed)
            await writer.drain()
            sent += chunk
        if chunked and not answer.done():
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    response = await answer
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return response


def silent_sockets(port: int, count: int) -> list[socket.socket]:
    """`count` connections that never send a byte (non-blocking, so a full accept queue
    does not hold the test up)."""
    opened = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        opened.append(sock)
    return opened


async def silent_flood(port: int, count: int, batch: int = 50) -> list[socket.socket]:
    """`count` silent connections, opened `batch` at a time with a pause between batches
    that lets the server accept them: faster, the kernel drops handshakes its listen queue
    has no room for, and the client's retries (1 s, 3 s, 7 s, ...) would spread the flood
    over half a minute instead of landing it at once."""
    opened: list[socket.socket] = []
    while len(opened) < count:
        opened += silent_sockets(port, min(batch, count - len(opened)))
        await asyncio.sleep(0.02)
    return opened


def closed_by_peer(sock: socket.socket) -> bool:
    """The server closed this connection (EOF or reset); a connection still being set up
    counts as open."""
    try:
        data = sock.recv(65536, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError as exc:
        # Not connected yet (the listener's queue was full): still waiting, not closed.
        return exc.errno != errno.ENOTCONN
    if data:
        # An answer (a 408 or 503) is followed by the close: read it away and look again.
        with contextlib.suppress(OSError):
            sock.recv(65536)
        return closed_by_peer(sock)
    return True


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def websocket_frame(text: str) -> bytes:
    """A masked client text frame (RFC 6455 §5.2)."""
    payload = text.encode()
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        header = bytes([0x81, 0x80 | length])
    elif length < 65536:
        header = bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0x80 | 127]) + length.to_bytes(8, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + masked


def never_reading_websocket(port: int, frames: list[str], *, rcvbuf: int = 4096) -> socket.socket:
    """A WebSocket client that upgrades, sends `frames` and then never reads again, with a
    small receive buffer so the kernel holds little for it on its side."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    for frame in frames:
        sock.sendall(websocket_frame(frame))
    return sock


@contextlib.contextmanager
def shared_gateway(
    factory: pytest.TempPathFactory, name: str, **kwargs: Any
) -> Iterator[GatewayProcess]:
    """One gateway subprocess for a module's tests (each costs seconds to start)."""
    process = spawn_gateway(factory.mktemp(name), **kwargs)
    try:
        yield process
    finally:
        process.terminate()


def never_reading_feed(
    port: int, path: str, token: str, *, method: str = "GET", body: bytes = b"", rcvbuf: int = 4096
) -> socket.socket:
    """An HTTP client that asks for a streaming response (an SSE feed) and never reads it,
    with a small receive buffer so the kernel holds little for it on its side."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}"]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return sock


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (or resets) the connection, or `timeout`."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def is_completion(frame: dict[str, object], run_id: str) -> bool:
    return frame.get("event") == "run.completed" and frame.get("run_id") == run_id


async def thread_of_large_events(gateway: GatewayProcess, size: int = LARGE_THREAD_BYTES) -> str:
    """A thread of alice's (tenant acme) holding `size` bytes of events, in runs that quote
    LARGE_WORD (the gateway runs with LARGE_EVENTS); its id."""
    token = TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])
    alice = await Client.connect(gateway.ws_url, token)
    try:
        thread_id = (await alice.request("thread.create"))["thread_id"]
        written = 0
        while written < size:
            start = await alice.request("run.start", thread_id=thread_id, input=LARGE_WORD)
            run_id = start["run_id"]
            await alice.wait_for(lambda f, run=run_id: is_completion(f, run), timeout=30)
            written = sum(len(json.dumps(e)) for e in alice.events_of(thread_id))
        return thread_id
    finally:
        await alice.close()
