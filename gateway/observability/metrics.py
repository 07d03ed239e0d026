"""Prometheus metrics of a gateway (docs/operations.md, "Metrics").

The registry belongs to the application (created in the lifespan, never the library's global
default), so two gateways in one process, as the tests run them, count apart. Labels are bounded
sets (run states, decision outcomes, the registry's agents and tools, limit kinds): never a
thread, run or user id.

Counting follows the event log where it can: a run's lifecycle is its `run.*` events, so what
is counted is what was durably stored, once per commit, not once per event on the streaming
path. The streaming path itself pays at most a float stamp per event (the commit time, for the
delivery lag) and one histogram observation per frame written.

Under `serve --workers N` the supervisor gives every worker one `PROMETHEUS_MULTIPROC_DIR`
(prometheus-client's multiprocess mode): each process writes its values to files there, and a
scrape, whichever worker answers it, adds up every worker's (`multiprocess_dir`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway.protocol.close_codes import CloseCode
from gateway.protocol.frames import EventType
from persistence.events import EventRecord

__all__ = ["CONTENT_TYPE", "MULTIPROC_ENV", "GatewayMetrics", "worker_died"]

# prometheus-client's own variable: set before it is imported, it writes values to files there.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

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
# A started run that answers again: a regenerate (`supersedes`) or a retry (`retries`), told by
# its `run.started` data's key (orjson writes keys as `"name":`; a quote inside a value is
# escaped, so the input cannot fake one).
STARTS_AGAIN: tuple[tuple[str, str], ...] = (
    ('"supersedes":', "regenerated"),
    ('"retries":', "retried"),
)
# Anything else a decision might carry is counted as `other`, keeping the label set bounded.
OUTCOMES = frozenset({"approve", "reject"})
# The label every value outside a bounded set is counted under.
OTHER = "other"
# Tool names come from the agents' code, a bounded set; an MCP server could list any number,
# so past this many distinct tools the rest are counted as `other`.
MAX_TOOLS = 100
# What a takeover (gateway_run_takeovers_total{kind}) was: docs/architecture.md
# "Shutdown and crash recovery".
TAKEOVER_KINDS = ("startup", "lease_expired", "handover")
WEBHOOK_OUTCOMES = ("delivered", "retried", "failed")
# Storage commits are milliseconds on SQLite and tens of them on a loaded PostgreSQL.
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)
# A model call is tens of milliseconds offline and seconds against a real model.
MODEL_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A review takes seconds to days.
REVIEW_BUCKETS_S = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
CHECKPOINT_BUCKETS_BYTES = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
# Commit to socket write: well under a millisecond when idle, more behind a busy loop.
LAG_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


# `gateway_model_tokens` kinds and the `model.usage` fields they count.
TOKEN_KINDS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cached", "cached_tokens"),
    ("reasoning", "reasoning_tokens"),
)


class Bounded:
    """The children of a metric for the label values of a bounded set: values outside `known`
    (or, with no `known`, past the first `limit` distinct ones) share the child `other`.
    Children are resolved once: `.labels()` per observation would hash and lock each time."""

    def __init__(
        self, metric: MetricWrapperBase, known: Iterable[str] = (), limit: int = MAX_TOOLS
    ) -> None:
        self._metric = metric
        self._known = frozenset(known)
        self._limit = limit
        self._children: dict[tuple[str, ...], Any] = {}

    def get(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*self._bounded(values))
        return child

    def _bounded(self, values: tuple[str, ...]) -> tuple[str, ...]:
        *fixed, last = values
        if self._known:
            return (*fixed, last if last in self._known else OTHER)
        if len(self._children) >= self._limit:
            return (*fixed, OTHER)
        return values


class GatewayMetrics:
    def __init__(self, *, agents: Iterable[str] = (), multiprocess_dir: str | None = None) -> None:
        # Under multiprocess mode prometheus-client writes every value to a file of
        # `multiprocess_dir` whatever registry a metric is in; this one then serves only to
        # keep names unique, and a scrape reads the files (`exposition`).
        self._multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.runs = Counter(
            "gateway_runs",
            "Runs entering a state, by state and agent.",
            ["state", "agent"],
            registry=reg,
        )
        self._runs = Bounded(self.runs, agents)
        self.approvals_requested = Counter(
            "gateway_approvals_requested", "Tool calls paused for a review.", registry=reg
        )
        self.approval_decisions = Counter(
            "gateway_approval_decisions",
            "Reviews decided, by outcome (system rejections included).",
            ["outcome"],
            registry=reg,
        )
        self._outcomes = Bounded(self.approval_decisions, OUTCOMES)
        # A rule's decisions are also among `gateway_approval_decisions` (their events).
        self.approval_rules = Counter(
            "gateway_approval_rule_evaluations",
            "Calls a graph's approval rule was asked about, by outcome (approve, reject, "
            "undecided: left to a person, error: it raised, a person decides) and rule.",
            ["outcome", "rule"],
            registry=reg,
        )
        self._rule_outcomes = Bounded(self.approval_rules)
        # Read from the database at scrape time (`refresh`): one process cannot count the
        # approvals another one created or decided. The scraped process has the newest value.
        self.approvals_pending = Gauge(
            "gateway_approvals_pending",
            "Approvals waiting for a decision (all processes: read from the database).",
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        self.review_wait = Histogram(
            "gateway_approval_wait_seconds",
            "Time from an approval's request to its decision.",
            buckets=REVIEW_BUCKETS_S,
            registry=reg,
        )
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
        self.checkpoint_bytes = Histogram(
            "gateway_checkpoint_bytes",
            "Size of one stored run checkpoint (its state JSON).",
            buckets=CHECKPOINT_BUCKETS_BYTES,
            registry=reg,
        )
        self.checkpoint_seconds = Histogram(
            "gateway_checkpoint_write_seconds",
            "Time of the transaction that stored a checkpoint.",
            buckets=COMMIT_BUCKETS_S,
            registry=reg,
        )
        self.model_calls = Histogram(
            "gateway_model_call_seconds",
            "Model calls, by agent, and their duration (its _count is the number of calls).",
            ["agent"],
            buckets=MODEL_BUCKETS_S,
            registry=reg,
        )
        self._model_calls = Bounded(self.model_calls, agents)
        self.model_tokens = Counter(
            "gateway_model_tokens",
            "Tokens the model calls used, by agent and kind (input, output, cached input, "
            "reasoning output), as the provider reported them.",
            ["kind", "agent"],
            registry=reg,
        )
        self._model_tokens = Bounded(self.model_tokens, agents)
        self.tool_calls = Histogram(
            "gateway_tool_call_seconds",
            "Tool calls, by tool, and their duration (its _count is the number of calls).",
            ["tool"],
            buckets=TOOL_BUCKETS_S,
            registry=reg,
        )
        self._tool_calls = Bounded(self.tool_calls)
        self.delivery_lag = Histogram(
            "gateway_delivery_lag_seconds",
            "Time from an event's commit to its frame's write on a WebSocket (live events).",
            buckets=LAG_BUCKETS_S,
            registry=reg,
        )
        # Moved by each open and close (not read at scrape time): under multiprocess mode
        # every worker's file holds its own count, and `livesum` adds the live ones.
        self.connections = Gauge(
            "gateway_connections",
            "Open WebSocket connections.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.subscriptions = Gauge(
            "gateway_subscriptions",
            "Thread subscriptions being followed (WebSocket and SSE).",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.thread_lists = Gauge(
            "gateway_thread_lists",
            "Live thread lists being followed (threads.subscribe, WebSocket and SSE).",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.thread_changes = Counter(
            "gateway_thread_changes",
            "Threads renamed, archived, brought back or deleted, by action.",
            ["action"],
            registry=reg,
        )
        self._thread_changes = Bounded(
            self.thread_changes, ("renamed", "archived", "unarchived", "deleted")
        )
        self.slow_closes = Counter(
            "gateway_slow_consumer_closes",
            f"Connections closed with {int(CloseCode.TOO_SLOW)}: their send queue stayed full.",
            registry=reg,
        )
        self.refusals = Counter(
            "gateway_rate_limit_refusals",
            "Requests refused by a limit, by limit kind.",
            ["limit"],
            registry=reg,
        )
        self._refusals = Bounded(
            self.refusals,
            ("frames", "subscriptions", "connections", "run_starts", "pending_inputs"),
        )
        self.takeovers = Counter(
            "gateway_run_takeovers",
            "Runs this process took over from a process that was gone, by kind.",
            ["kind"],
            registry=reg,
        )
        self._takeovers = Bounded(self.takeovers, TAKEOVER_KINDS)
        self.bus_sent = Counter(
            "gateway_bus_messages_sent", "Messages published to the shared bus.", registry=reg
        )
        self.bus_received = Counter(
            "gateway_bus_messages_received",
            "Messages from other processes heard on the shared bus.",
            registry=reg,
        )
        self.bus_outages = Counter(
            "gateway_bus_outages", "Times the shared bus became unreachable.", registry=reg
        )
        self.webhook_attempts = Counter(
            "gateway_webhook_attempts",
            "Webhook delivery attempts, by outcome: delivered, retried, failed (given up).",
            ["outcome"],
            registry=reg,
        )
        self._webhook_outcomes = {
            outcome: self.webhook_attempts.labels(outcome) for outcome in WEBHOOK_OUTCOMES
        }
        self._pending: Callable[[], Awaitable[int]] | None = None

    # -- wiring, at start-up ---------------------------------------------------------------

    def know_agents(self, agents: Iterable[str]) -> None:
        """The registry's agent names: any other is counted as `other`."""
        self._runs = Bounded(self.runs, agents)
        self._model_calls = Bounded(self.model_calls, agents)
        self._model_tokens = Bounded(self.model_tokens, agents)

    def count_pending(self, count: Callable[[], Awaitable[int]]) -> None:
        """How to count pending approvals; called on each scrape."""
        self._pending = count

    # -- counting --------------------------------------------------------------------------

    def committed(
        self, records: Sequence[EventRecord], seconds: float, agent: str | None = None
    ) -> None:
        """One event-log transaction stored `records` (a run's, of `agent`, when it carries
        run events). A flush stores nothing: not counted."""
        if not records:
            return
        self.commit_seconds.observe(seconds)
        self.commit_batch.observe(len(records))
        self.events_appended.inc(len(records))
        for record in records:
            kind = record.type
            state = RUN_STATES.get(kind)
            if state is not None:
                self._runs.get(state, agent or OTHER).inc()
                if kind == EventType.RUN_STARTED:
                    self._started_again(record.data, agent or OTHER)
            elif kind == EventType.APPROVAL_REQUESTED:
                self.approvals_requested.inc()
            elif kind == EventType.APPROVAL_DECIDED:
                # Rare (one per review): decoding its data here stays off the streaming path.
                self._outcomes.get(str(orjson.loads(record.data).get("decision"))).inc()

    def cancelled_elsewhere(self, agent: str) -> None:
        """A run of `agent` cancelled by a process that counts nothing (the operator's
        command line), whose cancel this process claimed (persistence/uncounted_cancels.py)."""
        self._runs.get(RUN_STATES[EventType.RUN_CANCELLED], agent).inc()

    def _started_again(self, data: str, agent: str) -> None:
        for key, state in STARTS_AGAIN:
            if key in data:
                self._runs.get(state, agent).inc()

    def failed(self) -> None:
        self.storage_errors.inc()

    def checkpoint_stored(self, size: int, seconds: float) -> None:
        self.checkpoint_bytes.observe(size)
        self.checkpoint_seconds.observe(seconds)

    def rule_evaluated(self, rule: str, outcome: str) -> None:
        self._rule_outcomes.get(outcome, rule).inc()

    def reviewed(self, waited_s: float) -> None:
        self.review_wait.observe(max(0.0, waited_s))

    def model_call(self, agent: str, seconds: float) -> None:
        self._model_calls.get(agent).observe(seconds)

    def tokens(self, agent: str, usage: Mapping[str, Any]) -> None:
        """One model call's `model.usage` counts (docs/protocol.md §6)."""
        for kind, key in TOKEN_KINDS:
            count = usage.get(key) or 0
            if count:
                self._model_tokens.get(kind, agent).inc(count)

    def tool_call(self, tool: str, seconds: float) -> None:
        self._tool_calls.get(tool).observe(seconds)

    def delivered(self, committed: float) -> None:
        """A frame of an event committed at `committed` (`time.perf_counter`) was written."""
        self.delivery_lag.observe(time.perf_counter() - committed)

    def thread_changed(self, action: str) -> None:
        self._thread_changes.get(action).inc()

    def refused(self, limit: str) -> None:
        self._refusals.get(limit).inc()

    def took_over(self, kind: str, runs: int = 1) -> None:
        if runs:
            self._takeovers.get(kind).inc(runs)

    def webhook_attempt(self, outcome: str) -> None:
        """One webhook attempt settled: `delivered`, `retried` or `failed`."""
        self._webhook_outcomes[outcome].inc()

    # -- scraping --------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Values read at scrape time, before the exposition."""
        if self._pending is not None:
            self.approvals_pending.set(await self._pending())

    def exposition(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        # A fresh registry per scrape, as prometheus-client's multiprocess guide does: the
        # collector reads every worker's files each time.
        registry = CollectorRegistry()
        # prometheus_client.multiprocess carries no annotations.
        multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
            registry, path=self._multiprocess_dir
        )
        return generate_latest(registry)


def worker_died(directory: str, pid: int) -> None:
    """Drop a gone worker's `live*` gauges (its counters stay: they are totals)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]  # unannotated
