"""OpenTelemetry spans of a real gateway's work, recorded with an in-memory exporter through
the provider an embedding application hands to `create_app` (docs/operations.md "Traces")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.observability.tracing import Telemetry, TelemetryConfigError
from gateway.settings import load_settings
from tests.support.agents import call
from tests.support.client import Client
from tests.support.gateway import Gateway

REFUND = "refund order 42 for 30 dollars"
STATUS = "status of orders 11, 12 and 13"


def recorder() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def connect(gw: Gateway, user: str, *roles: str) -> Client:
    return await Client.connect(gw.ws_url, gw.token(user, *roles))


async def test_a_run_with_a_review_is_traced(gateway_factory: Callable[..., Any]) -> None:
    provider, exporter = recorder()
    async with gateway_factory(tracer_provider=provider) as gw:
        alice = await connect(gw, "alice", "user")
        bob = await connect(gw, "bob", "reviewer")
        ack = await alice.request("run.start", input=REFUND)
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        status = await alice.request("run.start", input=STATUS, thread_id=ack["thread_id"])
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f.get("run_id") == status["run_id"]
        )
        await alice.close()
        await bob.close()
    spans = exporter.get_finished_spans()
    run_id = ack["run_id"]

    # The refund run: a segment up to the pause, and the continuation after the decision.
    segments = [
        s for s in named(spans, "gateway.run.segment") if s.attributes["gateway.run.id"] == run_id
    ]
    assert [s.attributes["gateway.run.outcome"] for s in segments] == ["paused", "completed"]
    for segment in segments:
        assert segment.attributes["gateway.thread.id"] == ack["thread_id"]
        assert segment.attributes["gateway.agent"] == "assistant"
    segment_ids = {s.context.span_id for s in segments}

    # Model calls inside each segment, as its children.
    models = [
        s for s in named(spans, "gateway.model.call") if s.attributes["gateway.run.id"] == run_id
    ]
    assert len(models) >= 2
    assert {s.parent.span_id for s in models if s.parent} == segment_ids

    # The gated call was not run by the first segment: its span says so.
    [gated] = [
        s
        for s in named(spans, "gateway.tool.call")
        if s.attributes["gen_ai.tool.name"] == "issue_refund"
    ]
    assert gated.attributes["gateway.tool.outcome"] == "not_run"
    assert gated.attributes["gen_ai.tool.call.id"] == requested["data"]["call_id"]

    # The three lookups of the second run ran: each a span of its own, ended by its output.
    lookups = [
        s
        for s in named(spans, "gateway.tool.call")
        if s.attributes["gateway.run.id"] == status["run_id"]
    ]
    assert len(lookups) == 3
    assert all("gateway.tool.outcome" not in s.attributes for s in lookups)
    assert all(s.end_time >= s.start_time for s in lookups)

    # The wait for the review, from the request to the decision.
    [wait] = named(spans, "gateway.approval.wait")
    assert wait.attributes["gateway.approval.id"] == requested["data"]["approval_id"]
    assert wait.attributes["gateway.approval.outcome"] == "approve"
    assert wait.attributes["gateway.run.id"] == run_id
    assert wait.end_time >= wait.start_time
    assert segments[0].start_time <= wait.start_time <= segments[1].start_time

    # Each event-log transaction: its events stored, and together every event the runs logged.
    commits = named(spans, "gateway.storage.commit")
    assert all(s.attributes["gateway.storage.events"] >= 1 for s in commits)
    assert sum(s.attributes["gateway.storage.events"] for s in commits) >= len(alice.events)

    # One span per WebSocket session, and nothing of the conversation in any attribute.
    assert len(named(spans, "gateway.websocket")) == 2
    for span in spans:
        assert not any("refund order" in str(v) for v in span.attributes.values())


async def test_spans_off_unless_asked_for_and_a_clear_error_without_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not Telemetry.from_settings(load_settings().otel).enabled
    exporting = Telemetry.from_settings(True)
    assert exporting.enabled
    await exporting.close()
    # Without the extra installed: one line saying what to install.
    monkeypatch.setitem(
        __import__("sys").modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None
    )
    with pytest.raises(TelemetryConfigError, match=r"agents-ws-gateway\[otel\]"):
        Telemetry.from_settings(True)


async def test_a_failed_segment_has_the_error_status(gateway_factory: Callable[..., Any]) -> None:
    # A call to a tool the agent does not have: the SDK raises, the run fails.
    model = ScriptedModel([ModelStep(output=[call("no_such_tool", "c1")])])
    graph = AgentGraph(
        name="broken",
        version="1",
        build=lambda: Agent(name="broken", instructions="test agent", model=model),
    )
    provider, exporter = recorder()
    async with gateway_factory(registry=AgentRegistry([graph]), tracer_provider=provider) as gw:
        alice = await connect(gw, "alice", "user")
        ack = await alice.request("run.start", input="hello")
        await alice.wait_event("run.failed")
        await alice.close()
    [segment] = [
        s
        for s in named(exporter.get_finished_spans(), "gateway.run.segment")
        if s.attributes["gateway.run.id"] == ack["run_id"]
    ]
    assert segment.attributes["gateway.run.outcome"] == "failed"
    assert segment.status.status_code is StatusCode.ERROR
    assert segment.status.description == "ModelBehaviorError"
