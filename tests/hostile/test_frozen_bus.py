"""A Redis that freezes (stopped with SIGSTOP, or behind a network that drops packets) closes no
connection: the relay must still notice within its probe's bound, report the bus lost, and
report it back once Redis answers again. Through a proxy to the machine's Redis that stops
forwarding, so the real server is never touched."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy.engine import make_url

from gateway.event_log.relay.redis import PROBE_EVERY_S, PROBE_TIMEOUT_S, RedisRelay
from tests.support.hostile import eventually
from tests.support.redis import bus_prefix, require_redis
from tests.support.tcp_proxy import tcp_proxy


async def test_a_frozen_redis_is_reported_as_bus_lost(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    server = make_url(require_redis())
    async with tcp_proxy(server.host or "127.0.0.1", server.port or 6379) as proxy:
        relay = RedisRelay(
            f"redis://127.0.0.1:{proxy.port}/{server.database or 0}",
            prefix=bus_prefix(),
            instance_id="frozen-test",
        )
        reconnected = asyncio.Event()
        await relay.start(lambda _message: None, reconnected.set)
        try:
            assert relay._up
            proxy.freeze()
            bound = PROBE_EVERY_S + PROBE_TIMEOUT_S + 2
            lost = await eventually(lambda: "bus lost" in caplog.text, bound)
            assert lost, caplog.text
            assert not relay._up
            proxy.thaw()
            await asyncio.wait_for(reconnected.wait(), 15)
            assert "bus back" in caplog.text
        finally:
            proxy.thaw()
            await relay.close()
