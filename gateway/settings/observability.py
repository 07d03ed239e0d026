"""Settings of what the gateway tells its operators: logs, traces and metrics."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from gateway.settings.group import SettingsGroup


class ObservabilitySettings(SettingsGroup):
    """What the gateway logs and in what format, where its traces go, and where Prometheus
    scrapes its metrics."""

    section_key: ClassVar[str] = "observability"
    section_title: ClassVar[str] = "logs, traces and metrics"

    log_level: str = Field(
        "info",
        description=(
            "One of `critical`, `error`, `warning`, `info`, `debug`; applies to the gateway and "
            "uvicorn."
        ),
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description=(
            "`text`, or `json`: one JSON object per line (`time`, `level`, `logger`, `message`, and"
            " `thread_id`, `run_id`, `agent`, `connection_id` where the line belongs to a run or a "
            "connection), for the gateway's lines and uvicorn's alike. See docs/operations.md "
            '"Logs".'
        ),
    )
    tracing: bool = Field(
        False,
        description=(
            "Send SDK traces to the SDK's configured trace exporter. Off by default, so nothing "
            "leaves the machine."
        ),
    )
    otel: bool = Field(
        False,
        description=(
            "Export the gateway's OpenTelemetry spans (WebSocket sessions, run segments, model and "
            "tool calls, approval waits, event-log transactions) over OTLP/HTTP to the endpoint of "
            "the standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` "
            "variables; needs the `otel` extra (`pip install 'agents-ws-gateway[otel]'`). "
            'Independent of `GATEWAY_TRACING`. See docs/operations.md "Traces".'
        ),
    )
    metrics: bool = Field(
        False,
        description=(
            "Serve Prometheus metrics at `GET /metrics` on the gateway's port (docs/operations.md, "
            '"Metrics"). Off, there is no such route and nothing is counted. Not protected by a '
            "token: expose it to the scraper only."
        ),
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description=(
            "Serve `GET /metrics` on this port (0: any free one, logged as `metrics at "
            "http://…/metrics`) instead of the gateway's, which then has no such route. Not with "
            "`GATEWAY_WORKERS` above 1 (a scrape of the gateway's port already adds up every "
            "worker)."
        ),
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="The address of the `GATEWAY_METRICS_PORT` listener.",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError("must be one of critical, error, warning, info, debug")
        return level
