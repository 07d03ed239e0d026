"""Clients that subscribe to a thread of large events and never read: each may cost the
server only a bounded amount of memory while it is connected, and nothing once it has been
closed with 4009; its socket is gone within the close timeout (10 s) of the close frame,
whether or not the client ever answers it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from gateway.auth.access import TokenVerifier
from gateway.server.connection_limits import CLOSE_TIMEOUT_S
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess
from tests.support.hostile import (
    LARGE_EVENTS,
    close_all,
    established_to,
    eventually,
    memory_kib,
    never_reading_websocket,
    open_descriptors,
    reset_peak_memory,
    thread_of_large_events,
)

CLIENTS = 20
PER_CLIENT_KIB = 3 * 1024
TOKENS = TokenVerifier(TEST_SECRET)
CLOSED_LINE = "closing a connection that stopped reading"


async def test_clients_that_never_read_cost_little_and_are_dropped(
    spawn: Callable[..., GatewayProcess],
) -> None:
    gateway = spawn(env={**LARGE_EVENTS, "GATEWAY_SEND_TIMEOUT_S": "1"})
    thread_id = await thread_of_large_events(gateway)
    # One reader replays the whole thread first: what a normal replay costs is baseline.
    reader = await Client.connect(gateway.ws_url, TOKENS.issue("carol", "acme", ["viewer"]))
    await reader.request("thread.subscribe", thread_id=thread_id, after_seq=0)
    await reader.wait_event("run.completed")
    await reader.close()
    pid = gateway.process.pid
    descriptors = open_descriptors(pid)
    before = memory_kib(pid)
    peak_reset = reset_peak_memory(pid)
    hello = json.dumps(
        {"type": "hello", "protocol": 1, "token": TOKENS.issue("mallory", "acme", ["viewer"])}
    )
    subscribe = json.dumps({"type": "thread.subscribe", "thread_id": thread_id, "after_seq": 0})
    sockets = [never_reading_websocket(gateway.port, [hello, subscribe]) for _ in range(CLIENTS)]
    try:
        closed = await eventually(lambda: gateway.log().count(CLOSED_LINE) >= CLIENTS, 30)
        closed_at = time.monotonic()
        peak = memory_kib(pid)
        gone = await eventually(lambda: established_to(gateway.port) == 0, 30, step=0.2)
        gone_after = time.monotonic() - closed_at
        still_open = established_to(gateway.port)
        after = memory_kib(pid)
        released = await eventually(lambda: open_descriptors(pid) <= descriptors, 5)
    finally:
        close_all(sockets)
    baseline = before["VmRSS"] if peak_reset else before["VmHWM"]
    # The peak of the whole attack, the ten seconds of closing handshakes included.
    peak_growth = after["VmHWM"] - baseline
    left = after["VmRSS"] - before["VmRSS"]
    print(
        f"{CLIENTS} clients: peak +{peak_growth} KiB ({peak_growth // CLIENTS} KiB each), "
        f"+{left} KiB after they were dropped; sockets gone {gone_after:.1f} s after the last close"
    )
    assert peak_growth <= CLIENTS * PER_CLIENT_KIB, (before, after)
    assert closed, f"only {gateway.log().count(CLOSED_LINE)} of {CLIENTS} closed with 4009"
    assert gone, f"{still_open} connections still open"
    # Within the close timeout of the last close frame, plus a margin.
    assert gone_after <= CLOSE_TIMEOUT_S + 5
    # What they held is released: their sockets, and closing them cost nothing more than
    # what they had at the 4009 (the allocator keeps freed pages for reuse, so resident
    # memory does not drop back below it).
    assert released, (descriptors, open_descriptors(pid))
    assert after["VmRSS"] - peak["VmRSS"] <= 1024, (peak, after)
