"""The relay over Redis pub/sub (redis-py's asyncio client).

Every process publishes to and listens on one channel, `<prefix>:bus`; each message names the
process that sent it (`GATEWAY_INSTANCE_ID`), which skips its own. Publishing never waits:
messages queue up (bounded) for one sender task, which merges the wake-ups that queued
together into one message. While Redis is unreachable, messages are dropped (readers catch up
from the database, at the log watch's interval), the listener retries with back-off, and once
Redis answers again every local watcher is woken once (`on_reconnect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from gateway.event_log.relay import MessageHandler, ReconnectHandler, Relay, RelayConfigError
from gateway.protocol.error_codes import CodedError

if TYPE_CHECKING:
    from gateway.observability.metrics import GatewayMetrics

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'agents-ws-gateway[redis]' (or: pip install redis)"
MAX_QUEUED = 10_000
# How long `close` waits for queued messages to go out.
CLOSE_FLUSH_S = 2.0
RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0)
# A Redis that is frozen (stopped, or behind a network that drops packets) closes nothing: a
# subscription just hears nothing. While subscribed, Redis is asked to answer a PING every
# PROBE_EVERY_S; one that does not answer (nor a subscribe) within PROBE_TIMEOUT_S is lost.
PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 3.0


class RedisFrozen(CodedError):
    """Redis accepted the connection but did not answer within PROBE_TIMEOUT_S."""


class RedisRelay(Relay):
    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        instance_id: str,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        try:
            import redis.asyncio as aioredis
        except ModuleNotFoundError as exc:
            raise RelayConfigError(f"the Redis client is not installed: {INSTALL_HINT}") from exc
        self._redis = aioredis.from_url(
            url, socket_connect_timeout=2.0, health_check_interval=5, retry_on_timeout=False
        )
        self._channel = f"{prefix}:bus"
        self._instance_id = instance_id
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_QUEUED)
        self._tasks: list[asyncio.Task[None]] = []
        self._up = False
        self.dropped = 0
        self._metrics = metrics

    async def start(self, on_message: MessageHandler, on_reconnect: ReconnectHandler) -> None:
        connected = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._listen(on_message, on_reconnect, connected), name="relay"),
            asyncio.create_task(self._send(), name="relay-sender"),
        ]
        # Serve at once either way; but give a reachable Redis a moment, so the first events
        # of a fresh process already go out over it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(connected.wait(), 2.0)

    def publish(self, message: dict[str, Any]) -> None:
        if not self._up:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped += 1

    async def close(self) -> None:
        # What was published last (a shutdown's hand-over) goes out before the connection.
        if self._up and self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), CLOSE_FLUSH_S)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    async def _listen(
        self, on_message: MessageHandler, on_reconnect: ReconnectHandler, connected: asyncio.Event
    ) -> None:
        failures = 0
        lost = False
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await self._answered(pubsub.subscribe(self._channel))
                self._up = True
                connected.set()
                failures = 0
                if lost:
                    log.warning(
                        "bus back: Redis answers again (%d message(s) not sent meanwhile); "
                        "waking every watcher once",
                        self.dropped,
                    )
                    lost = False
                    on_reconnect()
                await self._follow(pubsub, on_message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._up or not lost:
                    log.warning(
                        "bus lost: Redis unreachable (%s); readers fall back to the log watch",
                        type(exc).__name__,
                    )
                    if self._metrics is not None:
                        self._metrics.bus_outages.inc()
                self._up = False
                lost = True
                connected.set()
                await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _answered(self, request: Awaitable[Any]) -> Any:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                return await request
        except TimeoutError:
            raise RedisFrozen(f"no answer within {PROBE_TIMEOUT_S:g} s") from None

    async def _follow(self, pubsub: Any, on_message: MessageHandler) -> None:
        """Deliver the subscription's messages; raises when Redis stops answering (a PING on
        another connection of the pool, every PROBE_EVERY_S) or the subscription breaks."""
        reader = asyncio.ensure_future(self._read(pubsub, on_message))
        try:
            while True:
                done, _ = await asyncio.wait({reader}, timeout=PROBE_EVERY_S)
                if done:
                    reader.result()
                    return
                await self._answered(self._redis.ping())
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _read(self, pubsub: Any, on_message: MessageHandler) -> None:
        async for item in pubsub.listen():
            self._deliver(item, on_message)

    def _deliver(self, item: dict[str, Any], on_message: MessageHandler) -> None:
        if item.get("type") != "message":
            return
        try:
            message = orjson.loads(item["data"])
        except orjson.JSONDecodeError:
            log.warning("bus: a message that is not JSON was ignored")
            return
        if not isinstance(message, dict) or message.get("from") == self._instance_id:
            return
        if self._metrics is not None:
            self._metrics.bus_received.inc()
        try:
            on_message(message)
        except Exception:
            log.error("bus message handler failed", exc_info=True)

    async def _send(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            payloads = [orjson.dumps({**m, "from": self._instance_id}) for m in _merged(batch)]
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for payload in payloads:
                        pipe.publish(self._channel, payload)
                    await self._answered(pipe.execute())
                if self._metrics is not None:
                    self._metrics.bus_sent.inc(len(payloads))
            except asyncio.CancelledError:
                raise
            except Exception:
                # The listener notices the outage too and reconnects; these are dropped.
                self.dropped += len(payloads)
            finally:
                for _ in batch:
                    self._queue.task_done()


def _merged(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch with its wake-ups merged into one message (the newest head of each thread)."""
    heads: dict[str, int] = {}
    others: list[dict[str, Any]] = []
    for message in batch:
        if message.get("kind") == "wake":
            for thread_id, head in message["threads"].items():
                heads[thread_id] = max(heads.get(thread_id, 0), head)
        else:
            others.append(message)
    return ([{"kind": "wake", "threads": heads}] if heads else []) + others
