"""Delivers the webhook outbox (persistence/webhooks.py; docs/protocol.md §10).

One dispatcher per process: it claims due deliveries for a little longer than an attempt can
take, POSTs each signed body to its endpoint, and settles it: a 2xx deletes it; anything else
(another status, a timeout, a refused connection) schedules it again after an exponential
back-off with jitter, until it has been tried GATEWAY_WEBHOOK_MAX_ATTEMPTS times or is older
than GATEWAY_WEBHOOK_MAX_AGE_S, when it is marked failed with a warning.

The event log wakes it as soon as a commit added deliveries; between wake-ups it polls every
GATEWAY_WEBHOOK_POLL_S (or sooner, when a retry falls due) for retries and for deliveries
other processes left, a killed one's included once its claims run out.

Logs name the delivery's message id, type and endpoint host: never the secret, the signature,
the body (which may hold tool arguments) or the endpoint's path and query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import httpx

from gateway.event_log.webhook_signature import signature
from gateway.observability.metrics import GatewayMetrics
from persistence.clock import utcnow
from persistence.errors import StorageUnavailable
from persistence.events import Announce, NewEvent
from persistence.store import Store
from persistence.webhook_targets import forbidden_address, forbidden_host
from persistence.webhooks import Delivery, WebhookPlan, WebhookRepository

log = logging.getLogger(__name__)

# Deliveries attempted at once (one claim).
CLAIM_BATCH = 16
# A claim outlives the attempt's timeout by this much, so no other process starts the same
# delivery while this one may still be waiting for its answer.
CLAIM_MARGIN_S = 5.0


@dataclass(frozen=True)
class WebhookConfig:
    plan: WebhookPlan
    secret: str
    timeout_s: float
    max_attempts: int
    max_age_s: float
    backoff_s: float
    max_backoff_s: float
    poll_s: float
    # GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL (gateway/event_log/webhook_targets.py).
    allow_link_local: bool = False


async def resolves_to_forbidden(host: str, port: int | None) -> str | None:
    """The forbidden address (persistence/webhook_targets.py) `host` resolves to, if any (None
    when it cannot be resolved: the delivery then fails as any unreachable endpoint's). httpx
    resolves it again, so this narrows a name that points there, not a resolver that lies."""
    if forbidden_host(host):
        return host
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port or 443, type=socket.SOCK_STREAM
        )
    except OSError:
        return None
    for *_, sockaddr in found:
        if forbidden_address(str(sockaddr[0])):
            return str(sockaddr[0])
    return None


def backoff_s(attempts: int, base_s: float, cap_s: float) -> float:
    """The wait after the `attempts`-th failed attempt: doubling from `base_s` up to `cap_s`,
    each drawn from its upper half so receivers that failed together are not retried in step."""
    ceiling = min(cap_s, base_s * 2.0 ** max(0, attempts - 1))
    return ceiling * random.uniform(0.5, 1.0)  # jitter, not a secret


def endpoint_host(endpoint: str) -> str:
    """What logs may say of an endpoint: its host and port (paths and queries can hold
    tokens)."""
    parts = urlsplit(endpoint)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else "?"


class _EndpointRequests(logging.Filter):
    """Drops httpx's INFO line of each request to an endpoint: it shows the whole URL, and a
    webhook URL's path or query is often a credential of its own. This module logs each
    outcome instead."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        super().__init__()
        # As configured and as httpx writes them (a lowercased host, a default port dropped).
        self._endpoints = frozenset(endpoints) | {str(httpx.URL(e)) for e in endpoints}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) > 1 and str(args[1]) in self._endpoints)


class WebhookDispatcher:
    def __init__(
        self,
        store: Store,
        config: WebhookConfig,
        *,
        instance_id: str,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._repository = WebhookRepository(store)
        self._config = config
        self._metrics = metrics
        # This run of the process: a restarted process with the same instance id must not
        # take its predecessor's claims for its own.
        self._owner = f"{instance_id}:{secrets.token_hex(4)}"
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._quiet = _EndpointRequests(config.plan.endpoints)

    # -- the event log's side ---------------------------------------------------------------

    def announcer(self, events: Sequence[NewEvent]) -> Announce | None:
        return self._config.plan.announcer(events)

    def announced(self) -> None:
        """A commit stored deliveries: attempt them now rather than at the next poll."""
        self._wake.set()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        logging.getLogger("httpx").addFilter(self._quiet)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._config.timeout_s),
            follow_redirects=False,
            headers={"User-Agent": "agents-ws-gateway-webhooks"},
        )
        self._task = asyncio.create_task(self._loop(), name="webhook-dispatch")

    async def close(self) -> None:
        # Deliveries in flight are abandoned and their claims given back: the next process
        # sends them again (receivers dedupe on Webhook-Id). Should that fail, the claims run
        # out instead.
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            with contextlib.suppress(StorageUnavailable):
                await self._repository.release(self._owner)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        logging.getLogger("httpx").removeFilter(self._quiet)

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                if await self._round():
                    continue
            except StorageUnavailable:
                log.warning("webhook deliveries not claimed: storage unavailable")
            except Exception:
                # A bug must not end the deliveries of the process for good.
                log.error("webhook dispatch failed", exc_info=True)
            await self._sleep()

    async def _round(self) -> bool:
        """Claim and attempt the due deliveries; whether there were any."""
        claimed = await self._repository.claim(
            self._owner, hold_s=self._config.timeout_s + CLAIM_MARGIN_S, limit=CLAIM_BATCH
        )
        await asyncio.gather(*(self._attempt(delivery) for delivery in claimed))
        return bool(claimed)

    async def _sleep(self) -> None:
        wait_s = self._config.poll_s
        with contextlib.suppress(StorageUnavailable):
            due = await self._repository.next_due()
            if due is not None:
                wait_s = max(0.0, min(wait_s, (due - utcnow()).total_seconds()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait_s)

    # -- one attempt ------------------------------------------------------------------------

    async def _attempt(self, delivery: Delivery) -> None:
        error = await self._post(delivery)
        try:
            await self._settle(delivery, error)
        except StorageUnavailable:
            # The claim runs out and the delivery is attempted again: at least once.
            log.warning(
                "webhook %s (%s): outcome not recorded, storage unavailable",
                delivery.message_id,
                delivery.type,
            )

    async def _post(self, delivery: Delivery) -> str | None:
        """None if the endpoint took the delivery, else why not."""
        assert self._client is not None
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "Webhook-Id": delivery.message_id,
            "Webhook-Timestamp": timestamp,
            "Webhook-Signature": signature(self._config.secret, timestamp, delivery.payload),
        }
        if not self._config.allow_link_local:
            parts = urlsplit(delivery.endpoint)
            if await resolves_to_forbidden(parts.hostname or "", parts.port):
                return "forbidden address"
        try:
            # Overall, not per phase: a receiver that trickles its answer is cut off too.
            async with asyncio.timeout(self._config.timeout_s):
                response = await self._client.post(
                    delivery.endpoint, content=delivery.payload.encode(), headers=headers
                )
        except (TimeoutError, httpx.TimeoutException):
            return "timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}"

    async def _settle(self, delivery: Delivery, error: str | None) -> None:
        config = self._config
        if error is None:
            await self._repository.delivered(delivery, self._owner)
            self._count("delivered")
            return
        attempts = delivery.attempts + 1
        age_s = (utcnow() - delivery.created_at).total_seconds()
        delay_s = backoff_s(attempts, config.backoff_s, config.max_backoff_s)
        if attempts >= config.max_attempts or age_s + delay_s > config.max_age_s:
            await self._repository.give_up(delivery, self._owner, attempts=attempts, error=error)
            self._count("failed")
            log.warning(
                "webhook %s (%s) to %s failed after %d attempts (%s): given up",
                delivery.message_id,
                delivery.type,
                endpoint_host(delivery.endpoint),
                attempts,
                error,
            )
            return
        log.info(
            "webhook %s (%s) to %s: attempt %d failed (%s), retried in %.1fs",
            delivery.message_id,
            delivery.type,
            endpoint_host(delivery.endpoint),
            attempts,
            error,
            delay_s,
        )
        await self._repository.retry(
            delivery,
            self._owner,
            attempts=attempts,
            at=utcnow() + timedelta(seconds=delay_s),
            error=error,
        )
        self._count("retried")

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.webhook_attempt(outcome)
