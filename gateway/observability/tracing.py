"""OpenTelemetry spans of the gateway's work (docs/operations.md "Traces"), off by default.

With `GATEWAY_OTEL=true` (and the `otel` extra installed) the gateway exports, over OTLP to the
endpoint of the standard `OTEL_EXPORTER_OTLP_*` variables: a span per WebSocket session, per
run segment (a run's work on one process from its start, continuation or recovery to its pause
or end), per model call and tool call inside it, per approval wait (from the request to the
decision, recorded when the decision is stored, however long the wait and whichever process
took it), and per event-log transaction. Spans carry thread, run, approval and connection ids
as attributes, never user text or tool arguments. An application embedding the gateway can
pass its own `TracerProvider` to `create_app` instead.

The SDK's own tracing is separate (`GATEWAY_TRACING`, off by default): its exporter never runs
unless that is on.

Model and tool spans follow the SDK's stream as the gateway reads it: a model call from
`response.created` to the response's end, a tool call from its `tool.called` to its
`tool.output`.
They are as late as the gateway's reading of the stream, a few milliseconds at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agents import RawResponsesStreamEvent

from gateway.protocol.error_codes import CodedError
from gateway.protocol.frames import EventType
from persistence.clock import as_utc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

INSTALL_HINT = "pip install 'agents-ws-gateway[otel]'"
TRACER_NAME = "agents_ws_gateway"
SERVICE_NAME = "agents-ws-gateway"
# The raw response events that end a model call.
RESPONSE_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})

Attributes = Mapping[str, str | int | float | bool]


class TelemetryConfigError(CodedError, RuntimeError):
    """The telemetry settings cannot be used; the message says why."""


class SegmentSpans:
    """The spans of one run segment: the segment's, current while it runs, and its model and
    tool calls' as the stream shows them."""

    def __init__(self, tracer: Tracer, attributes: Attributes) -> None:
        from opentelemetry import context, trace

        self._tracer = tracer
        self._attributes = attributes
        self._span = tracer.start_span("gateway.run.segment", attributes=attributes)
        self._context = trace.set_span_in_context(self._span)
        # Current in the run's task: spans the SDK or the tools start are children of it.
        self._token = context.attach(self._context)
        self._model: Span | None = None
        self._tools: dict[str, Span] = {}
        self._failed = False

    def observe(self, event: Any, emitted: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """One SDK stream event and the gateway events it became."""
        if isinstance(event, RawResponsesStreamEvent):
            kind = getattr(event.data, "type", None)
            if kind == "response.created":
                self._end_model()
                model = getattr(getattr(event.data, "response", None), "model", None)
                self._model = self._child("gateway.model.call", {"gen_ai.request.model": model})
            elif kind in RESPONSE_ENDS:
                self._end_model(kind)
            return
        for type_, data in emitted:
            if type_ == EventType.TOOL_CALLED:
                call_id = data["call_id"]
                self._tools[call_id] = self._child(
                    "gateway.tool.call",
                    {"gen_ai.tool.name": data["tool_name"], "gen_ai.tool.call.id": call_id},
                )
            elif type_ == EventType.TOOL_OUTPUT:
                span = self._tools.pop(data["call_id"], None)
                if span is not None:
                    span.end()

    def fail(self, error: BaseException) -> None:
        """The segment ends in `run.failed`: the span's status says so, with the error's class
        only (its text can hold model output or tool arguments)."""
        from opentelemetry.trace import Status, StatusCode

        self._failed = True
        self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))

    def close(self, outcome: str) -> None:
        """At the segment's end: `outcome` is how it ended (completed, paused, failed, ...).
        A tool call still open is one waiting for a review (or cut by the end)."""
        from opentelemetry import context

        self._end_model("interrupted")
        for span in self._tools.values():
            span.set_attribute("gateway.tool.outcome", "not_run")
            span.end()
        self._tools.clear()
        self._span.set_attribute("gateway.run.outcome", "failed" if self._failed else outcome)
        self._span.end()
        context.detach(self._token)

    def _child(self, name: str, attributes: Mapping[str, Any]) -> Span:
        merged = {**self._attributes, **{k: v for k, v in attributes.items() if v is not None}}
        return self._tracer.start_span(name, context=self._context, attributes=merged)

    def _end_model(self, how: str | None = None) -> None:
        if self._model is not None:
            if how is not None:
                self._model.set_attribute("gateway.model.outcome", how.removeprefix("response."))
            self._model.end()
            self._model = None


class NoSpans:
    """What a segment gets while telemetry is off: every call does nothing."""

    def observe(self, event: Any, emitted: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass

    def close(self, outcome: str) -> None:
        pass


NO_SPANS = NoSpans()


class Telemetry:
    """The gateway's tracer, or none (off). Created in the lifespan and passed down."""

    def __init__(self, provider: TracerProvider | None, *, owned: bool = False) -> None:
        self._provider = provider
        # A provider the gateway built is the gateway's to shut down; one it was handed is not.
        self._owned = owned
        self._tracer: Tracer | None = (
            provider.get_tracer(TRACER_NAME) if provider is not None else None
        )

    @classmethod
    def from_settings(cls, enabled: bool, provider: TracerProvider | None = None) -> Telemetry:
        if provider is not None:
            return cls(provider)
        if not enabled:
            return cls(None)
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ModuleNotFoundError as exc:
            raise TelemetryConfigError(
                f"GATEWAY_OTEL is on but OpenTelemetry is not installed: {INSTALL_HINT}"
            ) from exc
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES still apply over this default.
        built = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        built.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(built, owned=True)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def segment(self, attributes: Attributes) -> SegmentSpans | NoSpans:
        if self._tracer is None:
            return NO_SPANS
        return SegmentSpans(self._tracer, attributes)

    def span(self, name: str, attributes: Attributes) -> AbstractContextManager[object]:
        """A span around the block, current within it (a WebSocket session's). Not a
        generator: a connection's handler stays inside it while the connection is open."""
        if self._tracer is None:
            return nullcontext()
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def record(
        self, name: str, start: datetime | float, end: datetime | float, attributes: Attributes
    ) -> None:
        """A span of work that is over, with its own times (datetimes or epoch seconds): an
        approval wait, an event-log transaction."""
        if self._tracer is None:
            return
        span = self._tracer.start_span(name, start_time=_ns(start), attributes=attributes)
        span.end(end_time=_ns(end))

    async def close(self) -> None:
        if self._provider is not None and self._owned:
            # Flushes what is queued (a blocking export): off the event loop.
            await asyncio.to_thread(self._provider.shutdown)


def _ns(moment: datetime | float) -> int:
    if isinstance(moment, datetime):
        utc = as_utc(moment)  # stored times are UTC; SQLite hands them back naive
        assert utc is not None
        return int(utc.timestamp() * 1e9)
    return int(moment * 1e9)
