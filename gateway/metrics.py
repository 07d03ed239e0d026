"""Prometheus metrics of one gateway process (docs/operations.md, "Metrics").

The registry belongs to the application (created in the lifespan, never the library's global
default), so two gateways in one process, as the tests run them, count apart. Labels are bounded
sets (run states, decision outcomes): never a thread, run or user id.

Counting follows the event log: a run's lifecycle is its `run.*` events, so what is counted is
what was durably stored, once per commit, not once per event on the streaming path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import orjson
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.protocol import EventType
from persistence.events import EventRecord

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "metrics_route"]

# The `state` label of gateway_runs_total: the run event that moved a run into it.
RUN_STATES: dict[str, str] = {
    EventType.RUN_STARTED: "started",
    EventType.RUN_PAUSED: "paused",
    EventType.RUN_RESUMED: "resumed",
    EventType.RUN_COMPLETED: "completed",
    EventType.RUN_FAILED: "failed",
    EventType.RUN_CANCELLED: "cancelled",
    EventType.RUN_RECOVERED: "recovered",
}
# Anything else a decision might carry is counted as `other`, keeping the label set bounded.
OUTCOMES = frozenset({"approve", "reject"})
WEBHOOK_OUTCOMES = ("delivered", "retried", "failed")
# Storage commits are milliseconds on SQLite and tens of them on a loaded PostgreSQL.
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.runs = Counter(
            "gateway_runs", "Runs entering a state, by state.", ["state"], registry=reg
        )
        # Resolved once: `.labels()` per event would hash and lock on every commit.
        self._run_states = {kind: self.runs.labels(state) for kind, state in RUN_STATES.items()}
        self.approvals_requested = Counter(
            "gateway_approvals_requested", "Tool calls paused for a review.", registry=reg
        )
        self.approval_decisions = Counter(
            "gateway_approval_decisions",
            "Reviews decided, by outcome (system rejections included).",
            ["outcome"],
            registry=reg,
        )
        self._outcomes = {
            outcome: self.approval_decisions.labels(outcome) for outcome in (*OUTCOMES, "other")
        }
        self.events_appended = Counter(
            "gateway_events_appended", "Events stored in the thread logs.", registry=reg
        )
        self.commit_seconds = Histogram(
            "gateway_storage_commit_seconds",
            "Time of one event-log transaction.",
            buckets=COMMIT_BUCKETS_S,
            registry=reg,
        )
        self.commit_batch = Histogram(
            "gateway_storage_commit_batch_events",
            "Events stored by one event-log transaction.",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.storage_errors = Counter(
            "gateway_storage_errors", "Event-log transactions that failed.", registry=reg
        )
        self.connections = Gauge("gateway_connections", "Open WebSocket connections.", registry=reg)
        self.webhook_attempts = Counter(
            "gateway_webhook_attempts",
            "Webhook delivery attempts, by outcome: delivered, retried, failed (given up).",
            ["outcome"],
            registry=reg,
        )
        self._webhook_outcomes = {
            outcome: self.webhook_attempts.labels(outcome) for outcome in WEBHOOK_OUTCOMES
        }

    def count_connections(self, current: Callable[[], int]) -> None:
        """Read at scrape time, so opening a socket costs nothing here."""
        self.connections.set_function(lambda: float(current()))

    def committed(self, records: Sequence[EventRecord], seconds: float) -> None:
        """One event-log transaction stored `records`. A flush stores nothing: not counted."""
        if not records:
            return
        self.commit_seconds.observe(seconds)
        self.commit_batch.observe(len(records))
        self.events_appended.inc(len(records))
        for record in records:
            kind = record.type
            state = self._run_states.get(kind)
            if state is not None:
                state.inc()
            elif kind == EventType.APPROVAL_REQUESTED:
                self.approvals_requested.inc()
            elif kind == EventType.APPROVAL_DECIDED:
                # Rare (one per review): decoding its data here stays off the streaming path.
                decision = orjson.loads(record.data).get("decision")
                self._outcomes[decision if decision in OUTCOMES else "other"].inc()

    def failed(self) -> None:
        self.storage_errors.inc()

    def webhook_attempt(self, outcome: str) -> None:
        """One webhook attempt settled: `delivered`, `retried` or `failed`."""
        self._webhook_outcomes[outcome].inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def _scrape(request: Request) -> Response:
    metrics: GatewayMetrics | None = request.app.state.services.metrics
    if metrics is None:
        return Response(status_code=404)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE)


def metrics_route() -> Route:
    """GET /metrics, served only when GATEWAY_METRICS is on: it carries no secret, and still
    says how busy the gateway is, so an operator chooses who may reach it."""
    return Route("/metrics", _scrape, methods=["GET"])
