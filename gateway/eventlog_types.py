"""A committed log entry, with its wire frame encoded once for every subscriber."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from persistence.events import EventRecord


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    thread_id: str
    seq: int
    run_id: str | None
    type: str
    ts: str
    frame: str  # the complete `event` frame as JSON text

    @classmethod
    def from_record(cls, record: EventRecord) -> LoggedEvent:
        return cls(
            thread_id=record.thread_id,
            seq=record.seq,
            run_id=record.run_id,
            type=record.type,
            ts=record.ts,
            frame=encode_event_frame(record),
        )


def encode_event_frame(record: EventRecord) -> str:
    # `data` is stored as compact JSON text; splicing it in avoids decoding and re-encoding
    # every event on the hot path and on replay.
    return (
        '{"type":"event","thread_id":'
        + orjson.dumps(record.thread_id).decode()
        + ',"seq":'
        + str(record.seq)
        + ',"run_id":'
        + orjson.dumps(record.run_id).decode()
        + ',"event":'
        + orjson.dumps(record.type).decode()
        + ',"ts":"'
        + record.ts
        + '","data":'
        + record.data
        + "}"
    )
