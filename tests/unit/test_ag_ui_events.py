"""The thread log as AG-UI events (gateway/frontends/ag_ui/events.py), without a server: the
same log gives the same events, every construct closes before its run ends, each client is
sent only what it accepts, and a prelude restates a run met mid-way."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.frontends.ag_ui.events import (
    METADATA_KEY,
    RESPONSE_SCHEMA,
    Dialect,
    ThreadProjection,
)
from gateway.frontends.thread_log import LogEntry
from tests.support.ag_ui_logs import reasoning_log, refund_log

# Every event type @ag-ui/client 0.0.59 knows (its EventType enum, as CopilotKit ships it) that
# the gateway could send; anything else is fatal there.
LEGACY_TYPES = {
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "MESSAGES_SNAPSHOT",
    "CUSTOM",
    "RUN_STARTED",
    "RUN_FINISHED",
    "RUN_ERROR",
    "STEP_STARTED",
    "STEP_FINISHED",
}
TERMINAL = {"RUN_FINISHED", "RUN_ERROR"}


def project(
    entries: list[LogEntry], dialect: Dialect = Dialect.V1
) -> list[tuple[int, dict[str, Any]]]:
    projection = ThreadProjection("t_1", dialect)
    return [(entry.seq, event) for entry in entries for event in projection.apply(entry)]


def runs(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events split into AG-UI runs (RUN_STARTED through its terminal event)."""
    out: list[list[dict[str, Any]]] = []
    for event in events:
        if event["type"] == "RUN_STARTED":
            out.append([])
        out[-1].append(event)
    return out


def test_the_same_log_gives_the_same_events() -> None:
    assert project(refund_log()) == project(refund_log())


def test_a_pause_ends_the_run_with_interrupts_and_the_continuation_is_a_new_run() -> None:
    events = [e for _, e in project(refund_log(expires_at="2026-12-05T11:00:00.000Z"))]
    first, second = runs(events)
    assert [e["runId"] for e in (first[0], first[-1])] == ["r_1", "r_1"]
    [interrupt] = first[-1]["outcome"]["interrupts"]
    assert first[-1]["outcome"]["type"] == "interrupt"
    assert interrupt["id"] == "ap_1" and interrupt["toolCallId"] == "call_1"
    assert interrupt["reason"] == "tool_call"
    assert interrupt["expiresAt"] == "2026-12-05T11:00:00.000Z"
    assert interrupt["responseSchema"] == RESPONSE_SCHEMA
    assert "editedArgs" not in interrupt["responseSchema"]["properties"]
    assert second[0]["runId"] == "r_1.1"
    types = [e["type"] for e in second]
    assert "TOOL_CALL_START" not in types
    [result] = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == "call_1" and result["content"] == "done"
    assert types[-1] == "RUN_FINISHED" and "outcome" not in second[-1]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_construct_closes_before_its_run_ends(dialect: Dialect) -> None:
    cancelled = refund_log()[:3]
    cancelled.append(LogEntry(4, "r_1", "run.cancelled", "2026-12-05T10:00:04.000Z", {}))
    for entries in (refund_log(), cancelled):
        for run in runs([e for _, e in project(entries, dialect)]):
            open_messages: set[str] = set()
            open_steps: set[str] = set()
            for event in run:
                kind = event["type"]
                if kind == "TEXT_MESSAGE_START":
                    open_messages.add(event["messageId"])
                elif kind == "TEXT_MESSAGE_END":
                    open_messages.remove(event["messageId"])
                elif kind == "STEP_STARTED":
                    open_steps.add(event["stepName"])
                elif kind == "STEP_FINISHED":
                    open_steps.remove(event["stepName"])
                elif kind in TERMINAL:
                    assert not open_messages and not open_steps, run
            assert run[-1]["type"] in TERMINAL


def test_old_clients_get_no_cancelled_outcome_and_no_event_type_they_do_not_know() -> None:
    entries = refund_log()[:3]
    entries.append(LogEntry(4, "r_1", "run.cancelled", "2026-12-05T10:00:04.000Z", {}))
    legacy = [e for _, e in project(entries, Dialect.LEGACY)]
    modern = [e for _, e in project(entries, Dialect.V1)]
    assert legacy[-1] == {**legacy[-1], "type": "RUN_ERROR", "code": "cancelled"}
    assert modern[-1]["outcome"] == {"type": "cancelled"}
    reconciliation = [
        *refund_log()[:10],
        LogEntry(11, "r_1", "tool.needs_reconciliation", "2026-12-05T10:00:11.000Z", {}),
    ]
    for events in (legacy, [e for _, e in project(reconciliation, Dialect.LEGACY)]):
        assert {e["type"] for e in events} <= LEGACY_TYPES
        assert all("pendingToolCallIds" not in (e.get("outcome") or {}) for e in events)


def test_a_run_cancelled_while_it_waits_gets_a_short_run_that_clears_the_interrupts() -> None:
    entries = refund_log()[:8]
    entries.append(LogEntry(9, "r_1", "run.cancelled", "2026-12-05T10:00:09.000Z", {}))
    events = project(entries)
    tail = [e["type"] for seq, e in events if seq == 9]
    assert tail == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STEP_STARTED",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert events[-1][1]["outcome"] == {"type": "cancelled"}


def test_an_aborted_message_is_closed_and_dropped() -> None:
    entries = refund_log()[:4]
    entries += [
        LogEntry(5, "r_1", "message.aborted", "2026-12-05T10:00:05.000Z", {"message_id": "m_1"}),
        LogEntry(
            6,
            "r_1",
            "run.failed",
            "2026-12-05T10:00:06.000Z",
            {"error": {"code": "run_error", "message": "boom"}},
        ),
    ]
    events = [e for seq, e in project(entries) if seq >= 5]
    assert [e["type"] for e in events] == [
        "TEXT_MESSAGE_END",
        "MESSAGES_SNAPSHOT",
        "STEP_FINISHED",
        "RUN_ERROR",
    ]
    assert [m["role"] for m in events[1]["messages"]] == ["user"]
    assert events[-1] == {**events[-1], "code": "run_error", "message": "boom"}


def test_a_handoff_closes_one_step_and_opens_the_next() -> None:
    entries = [
        *refund_log()[:1],
        LogEntry(2, "r_1", "agent.changed", "2026-12-05T10:00:02.000Z", {"agent": "billing"}),
        LogEntry(3, "r_1", "run.completed", "2026-12-05T10:00:03.000Z", {"final_output": ""}),
    ]
    steps = [(e["type"], e.get("stepName")) for _, e in project(entries) if "stepName" in e]
    assert steps == [
        ("STEP_STARTED", "assistant"),
        ("STEP_FINISHED", "assistant"),
        ("STEP_STARTED", "billing"),
        ("STEP_FINISHED", "billing"),
    ]


def test_the_run_a_client_asked_for_carries_its_run_id() -> None:
    projection = ThreadProjection("t_1", Dialect.V1)
    projection.name_next_run("client-run")
    events = [e for entry in refund_log()[:8] for e in projection.apply(entry)]
    assert {e["runId"] for e in events if "runId" in e} == {"client-run"}


def test_tool_calls_belong_to_the_turns_message_and_outputs_follow_their_call() -> None:
    projection = ThreadProjection("t_1", Dialect.V1)
    for entry in refund_log():
        projection.apply(entry)
    assert projection.messages == [
        {"id": "r_1.input", "role": "user", "content": "refund order 42"},
        {
            "id": "m_1",
            "role": "assistant",
            "content": "I will refund it.",
            "toolCalls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": '{"order_id":42}'},
                }
            ],
        },
        {"id": "call_1.output", "toolCallId": "call_1", "role": "tool", "content": "done"},
        {"id": "m_2", "role": "assistant", "content": "Refunded."},
    ]


@pytest.mark.parametrize("cursor", range(1, 16))
def test_a_connect_from_any_cursor_restates_the_run_and_goes_on_as_the_full_stream(
    cursor: int,
) -> None:
    entries = refund_log()
    full = project(entries)
    projection = ThreadProjection("t_1", Dialect.V1)
    for entry in entries[:cursor]:
        projection.apply(entry)
    prelude = projection.prelude()
    tail = [(entry.seq, e) for entry in entries[cursor:] for e in projection.apply(entry)]
    # The tail is exactly what an undisturbed client got after the cursor.
    assert tail == [(seq, e) for seq, e in full if seq > cursor]
    inside = projection_inside_run(entries[:cursor])
    if not inside:
        assert prelude == []
        return
    assert prelude[0]["type"] == "RUN_STARTED"
    started = [e for seq, e in full if seq <= cursor and e["type"] == "RUN_STARTED"][-1]
    assert prelude[0]["runId"] == started["runId"]
    assert prelude[1]["type"] == "MESSAGES_SNAPSHOT"
    assert prelude[2]["type"] == "STEP_STARTED"


def projection_inside_run(entries: list[LogEntry]) -> bool:
    projection = ThreadProjection("t_1", Dialect.V1)
    for entry in entries:
        projection.apply(entry)
    return projection.run is not None


def test_the_newest_pause_records_its_decisions() -> None:
    projection = ThreadProjection("t_1", Dialect.V1)
    for entry in refund_log(decision="reject")[:9]:
        projection.apply(entry)
    pause = projection.pause
    assert pause is not None and pause.seq == 8
    assert pause.decisions == {"ap_1": "reject"} and pause.open_ids == []
    assert projection.user_message_ids == {"r_1.input"}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_reasoning_summary_streams_as_reasoning_events_and_tokens_end_the_run(
    dialect: Dialect,
) -> None:
    events = [e for _, e in project(reasoning_log(), dialect)]
    types = [e["type"] for e in events]
    assert types[3:8] == [
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
    ]
    assert types[8] == "REASONING_END"
    assert {e["messageId"] for e in events if e["type"].startswith("REASONING")} == {"rs_1"}
    # 0.0.59 knows the reasoning events too.
    assert set(types) <= LEGACY_TYPES | {
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
    }
    assert events[-1]["usage"] == [
        {
            "model": "m",
            "inputTokens": 20,
            "outputTokens": 14,
            "totalTokens": 34,
            "reasoningTokens": 4,
            "cachedInputTokens": 4,
        }
    ]
    projection = ThreadProjection("t_1", dialect)
    for entry in reasoning_log():
        projection.apply(entry)
    assert projection.messages[1] == {
        "id": "rs_1",
        "role": "reasoning",
        "content": "The user asks why.",
    }


def test_a_summary_open_when_the_run_stops_is_closed_first_and_restated_by_a_prelude() -> None:
    events = [e["type"] for _, e in project(reasoning_log(cut=True))]
    assert events[-4:] == [
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    projection = ThreadProjection("t_1", Dialect.V1)
    for entry in reasoning_log()[:3]:
        projection.apply(entry)
    prelude = [e["type"] for e in projection.prelude()]
    assert prelude == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STEP_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
    ]


def test_a_stopped_message_stays_as_it_was_streamed() -> None:
    entries = refund_log()[:4]
    entries += [
        LogEntry(
            5,
            "r_1",
            "message.aborted",
            "2026-12-05T10:00:05.000Z",
            {"message_id": "m_1", "reason": "cancelled", "text": "I will refund it."},
        ),
        LogEntry(6, "r_1", "run.cancelled", "2026-12-05T10:00:06.000Z", {}),
    ]
    projection = ThreadProjection("t_1", Dialect.V1)
    events = [e for entry in entries for e in projection.apply(entry) if entry.seq >= 5]
    assert [e["type"] for e in events] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"]
    assert projection.messages[-1] == {
        "id": "m_1",
        "role": "assistant",
        "content": "I will refund it.",
    }


@pytest.mark.parametrize("decided_by", ["user", "either", None])
def test_an_interrupt_says_who_decides_the_call(decided_by: str | None) -> None:
    # docs/protocol.md §12: `decidedBy` is the approval's `decided_by` (absent in older logs).
    entries = [
        replace(entry, data={**entry.data, "decided_by": decided_by})
        if entry.type == "approval.requested" and decided_by is not None
        else entry
        for entry in refund_log()
    ]
    first, _ = runs([e for _, e in project(entries)])
    [interrupt] = first[-1]["outcome"]["interrupts"]
    assert interrupt["metadata"][METADATA_KEY]["decidedBy"] == decided_by
