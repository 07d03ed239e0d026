"""The logging configuration of `python -m gateway serve`: the gateway's lines and uvicorn's,
as text (the default) or as one JSON object per line (`GATEWAY_LOG_FORMAT=json`), each carrying
the thread, run, agent and connection it belongs to (gateway/observability/log_fields.py).

One configuration serves both: the gateway applies it at start-up (the supervisor of
`--workers` and the migration log too) and hands it to uvicorn, which applies it again.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from gateway.observability.log_fields import FIELD_NAMES, ContextFields
from gateway.observability.log_noise import ClientCausedErrors

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# uvicorn adds an ANSI-coloured copy of some messages to its records: not for a log pipeline.
JSON_SKIPPED = (*RESERVED_ATTRS, "color_message")

# Libraries whose lines stay at or above a level, whatever the gateway's:
# - aiosqlite's debug lines print every statement's parameters: conversation text, tool
#   arguments (sensitive ones included);
# - websockets' print every frame at debug, contents included, and at info "connection open"
#   for every connection, which uvicorn's "[accepted]" line says with the peer's address (a
#   refused handshake has its own line, gateway/server/ws_guard.py).
LIBRARY_FLOORS: tuple[tuple[str, int], ...] = (
    ("aiosqlite", logging.INFO),
    ("websockets", logging.WARNING),
)


class TextWithFields(logging.Formatter):
    """The text format, with the record's ids appended: `... [thread_id=t run_id=r]`."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [
            f"{name}={getattr(record, name)}" for name in FIELD_NAMES if hasattr(record, name)
        ]
        return f"{line} [{' '.join(fields)}]" if fields else line


def json_formatter() -> JsonFormatter:
    """`{"time": ..., "level": ..., "logger": ..., "message": ..., "thread_id": ...}`."""
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        reserved_attrs=JSON_SKIPPED,
        # ISO 8601 in UTC, from the record's own time.
        timestamp="time",
    )


def logging_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """uvicorn's own default configuration, plus the gateway's loggers on the same stream,
    the context fields on every handler, and the filter of client-caused errors."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {
        "client_caused_errors": {"()": ClientCausedErrors},
        "context_fields": {"()": ContextFields},
    }
    if log_format == "json":
        for name in ("default", "access"):
            config["formatters"][name] = {"()": json_formatter}
        config["formatters"]["gateway"] = {"()": json_formatter}
    else:
        config["formatters"]["gateway"] = {"()": TextWithFields, "fmt": TEXT_FORMAT}
    handlers = config["handlers"]
    handlers["gateway"] = {
        "formatter": "gateway",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    for handler in handlers.values():
        handler["filters"] = ["context_fields"]
    config["loggers"]["uvicorn.error"]["filters"] = ["client_caused_errors"]
    config["root"] = {"handlers": ["gateway"], "level": level.upper()}
    for name, floor in LIBRARY_FLOORS:
        config["loggers"][name] = {"level": max(floor, logging.getLevelName(level.upper()))}
    return config
