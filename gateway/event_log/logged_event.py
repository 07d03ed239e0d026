"""A committed log entry, with its wire frame encoded once for every subscriber."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

from persistence.events import EventRecord


class LoggedEvent(NamedTuple):
    # A named tuple, not a frozen dataclass: one is made per event and per replayed row, and
    # it is the cheaper immutable record by several microseconds (see docs/benchmarks.md).
    thread_id: str
    seq: int
    run_id: str | None
    type: str
    ts: str
    frame: str  # the complete `event` frame as JSON text

    @classmethod
    def from_record(cls, record: EventRecord) -> LoggedEvent:
        thread_id, seq, run_id, type_, ts, _ = record
        return cls(thread_id, seq, run_id, type_, ts, encode_event_frame(record))


def encode_event_frame(record: EventRecord) -> str:
    # `data` is stored as compact JSON text; splicing it in avoids decoding and re-encoding
    # every event on the hot path and on replay.
    thread_id, seq, run_id, type_, ts, data = record
    quote = orjson.dumps
    run = "null" if run_id is None else quote(run_id).decode()
    return (
        f'{{"type":"event","thread_id":{quote(thread_id).decode()},"seq":{seq},'
        f'"run_id":{run},"event":{quote(type_).decode()},"ts":"{ts}","data":{data}}}'
    )


def encode_page(records: Sequence[EventRecord]) -> list[LoggedEvent]:
    """`LoggedEvent.from_record` for a page of stored events, quoting each distinct id and
    type once per page (a replay page is one thread's, mostly one run's, few event types)."""
    quoted: dict[str | None, str] = {None: "null"}
    logged: list[LoggedEvent] = []
    append = logged.append
    for thread_id, seq, run_id, type_, ts, data in records:
        thread = quoted.get(thread_id)
        if thread is None:
            thread = quoted[thread_id] = orjson.dumps(thread_id).decode()
        run = quoted.get(run_id)
        if run is None:
            run = quoted[run_id] = orjson.dumps(run_id).decode()
        kind = quoted.get(type_)
        if kind is None:
            kind = quoted[type_] = orjson.dumps(type_).decode()
        frame = (
            f'{{"type":"event","thread_id":{thread},"seq":{seq},'
            f'"run_id":{run},"event":{kind},"ts":"{ts}","data":{data}}}'
        )
        append(LoggedEvent(thread_id, seq, run_id, type_, ts, frame))
    return logged
