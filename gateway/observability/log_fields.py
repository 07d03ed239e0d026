"""What each log line says it belongs to: the thread, run and agent of a run's work, the
connection of a socket's (docs/operations.md "Logs").

The fields live in a context variable, so a task and every task it starts carry them without
being passed anything, and a filter on the log handlers copies them onto each record: the SDK's
own lines inside a run carry the run's ids as well. Only ids go here, never user text.
"""

from __future__ import annotations

import logging
from contextvars import Context, ContextVar, Token, copy_context

# The record attributes the fields become (the JSON keys of docs/operations.md "Logs").
FIELD_NAMES = ("thread_id", "run_id", "agent", "connection_id")

# (name, value) pairs, immutable: `bound` replaces them whole, a context's copy never changes.
_FIELDS: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("gateway_log_fields", default=())


def bound(**fields: str | None) -> BoundFields:
    """Within the block (and the tasks it starts), log lines carry `fields`; a field given as
    None is dropped (a run started from a connection is not that connection's work)."""
    return BoundFields(fields)


class BoundFields:
    """The context manager `bound` returns. A class, not a generator: a connection's handler
    stays inside one for as long as it is open, and a generator's frame held 0.5 KiB more."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, str | None]) -> None:
        self._fields = fields
        self._token: Token[tuple[tuple[str, str], ...]] | None = None

    def __enter__(self) -> None:
        merged = {**dict(_FIELDS.get()), **self._fields}
        self._token = _FIELDS.set(
            tuple((key, value) for key, value in merged.items() if value is not None)
        )

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _FIELDS.reset(self._token)
            self._token = None


def current() -> dict[str, str]:
    """The fields log lines carry here and now."""
    return dict(_FIELDS.get())


def unbound_context() -> Context:
    """A copy of the current context without any fields: for a task that serves the whole
    process (a lease keeper, a storage probe, a recovery loop), however it was first started.
    A task inherits its creator's fields, so one created lazily from inside a run would tag
    its lines, about other runs too, with that run's ids for the rest of its life."""
    context = copy_context()
    context.run(_FIELDS.set, ())
    return context


class ContextFields(logging.Filter):
    """On a handler: copies the current fields onto each record it formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _FIELDS.get():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
