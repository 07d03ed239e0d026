"""Stored thread logs for the AG-UI projection's tests (tests/unit/test_ag_ui_events.py) and
for feeding @ag-ui/client with them (tests/frontends/test_ag_ui.py): a run paused for an
approval and continued, and a run whose model reasons before it answers."""

from __future__ import annotations

from typing import Any

from gateway.frontends.thread_log import LogEntry


def log(*events: tuple[str, str, dict[str, Any]]) -> list[LogEntry]:
    return [
        LogEntry(seq, run_id, kind, f"2026-12-05T10:00:{seq % 60:02d}.000Z", data)
        for seq, (run_id, kind, data) in enumerate(events, start=1)
    ]


def refund_log(*, decision: str = "approve", expires_at: str | None = None) -> list[LogEntry]:
    """A run that says a sentence, calls an approval-gated tool, pauses, is decided, continues
    with the tool's output and a final answer."""
    call = {"call_id": "call_1", "tool_name": "issue_refund", "arguments": {"order_id": 42}}
    return log(
        ("r_1", "run.started", {"input": "refund order 42", "agent": "assistant"}),
        ("r_1", "message.started", {"message_id": "m_1", "agent": "assistant"}),
        ("r_1", "message.delta", {"message_id": "m_1", "delta": "I will "}),
        ("r_1", "message.delta", {"message_id": "m_1", "delta": "refund it."}),
        ("r_1", "message.completed", {"message_id": "m_1", "text": "I will refund it."}),
        ("r_1", "tool.called", {**call, "agent": "assistant"}),
        (
            "r_1",
            "approval.requested",
            {
                "approval_id": "ap_1",
                **call,
                "agent": "assistant",
                "checkpoint_version": 1,
                "requested_at": "2026-12-05T10:00:07.000Z",
                "expires_at": expires_at,
                "reviewer_roles": [],
            },
        ),
        ("r_1", "run.paused", {"reason": "approval", "checkpoint_version": 1}),
        ("r_1", "approval.decided", {"approval_id": "ap_1", "decision": decision}),
        ("r_1", "run.resumed", {"checkpoint_version": 1}),
        (
            "r_1",
            "tool.output",
            {"call_id": "call_1", "tool_name": "issue_refund", "output": "done"},
        ),
        ("r_1", "message.started", {"message_id": "m_2", "agent": "assistant"}),
        ("r_1", "message.delta", {"message_id": "m_2", "delta": "Refunded."}),
        ("r_1", "message.completed", {"message_id": "m_2", "text": "Refunded."}),
        ("r_1", "run.completed", {"final_output": "Refunded."}),
    )


def reasoning_log(*, cut: bool = False) -> list[LogEntry]:
    """A run whose model reasons (a summary streamed like a message) before it answers, with
    its token counts; `cut`: the run is cancelled in the middle of the summary."""
    head = log(
        ("r_1", "run.started", {"input": "why?", "agent": "assistant"}),
        ("r_1", "reasoning.started", {"reasoning_id": "rs_1", "agent": "assistant"}),
        ("r_1", "reasoning.delta", {"reasoning_id": "rs_1", "delta": "The user asks "}),
        ("r_1", "reasoning.delta", {"reasoning_id": "rs_1", "delta": "why."}),
    )
    if cut:
        return [*head, LogEntry(5, "r_1", "run.cancelled", "2026-12-05T10:00:05.000Z", {})]
    usage = {"input_tokens": 10, "output_tokens": 7, "total_tokens": 17, "cached_tokens": 2}
    tail = [
        ("r_1", "reasoning.completed", {"reasoning_id": "rs_1", "text": "The user asks why."}),
        ("r_1", "message.started", {"message_id": "m_1", "agent": "assistant"}),
        ("r_1", "message.delta", {"message_id": "m_1", "delta": "Because."}),
        ("r_1", "message.completed", {"message_id": "m_1", "text": "Because."}),
        (
            "r_1",
            "model.usage",
            {**usage, "reasoning_tokens": 4, "agent": "assistant", "model": "m"},
        ),
        (
            "r_1",
            "model.usage",
            {**usage, "reasoning_tokens": 0, "agent": "assistant", "model": "m"},
        ),
        ("r_1", "run.completed", {"final_output": "Because."}),
    ]
    return log(*[(str(e.run_id), e.type, e.data) for e in head], *tail)
