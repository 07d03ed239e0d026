"""The thread log as the AI SDK's UI message chunks (gateway/frontends/ai_sdk/ui_chunks.py), and
the same chunks folded into the UIMessage the history endpoint serves (ui_messages.py)."""

from __future__ import annotations

from typing import Any

from gateway.frontends.ai_sdk.chat_requests import chat_request
from gateway.frontends.ai_sdk.ui_chunks import Boundary, RunChunks
from gateway.frontends.ai_sdk.ui_messages import MessageFold
from gateway.frontends.thread_log import LogEntry
from gateway.protocol.error_codes import GatewayError

RUN = "r_1"


class Log:
    """A run's stored events, numbered as the log numbers them."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []

    def add(self, kind: str, **data: Any) -> LogEntry:
        entry = LogEntry(len(self.entries) + 1, RUN, kind, "2026-12-05T00:00:00.000Z", data)
        self.entries.append(entry)
        return entry


def types_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks if c["type"] != "message-metadata"]


def paused_run(log: Log) -> None:
    log.add("run.started", input="refund", agent="assistant")
    log.add("message.started", message_id="m1", agent="assistant")
    log.add("message.delta", message_id="m1", delta="I will")
    log.add("message.completed", message_id="m1", text="I will")
    log.add("tool.called", call_id="c1", tool_name="issue_refund", arguments={"order_id": 42})
    log.add(
        "approval.requested",
        approval_id="ap_1",
        call_id="c1",
        tool_name="issue_refund",
        arguments={"order_id": 42},
        expires_at=None,
        reviewer_roles=[],
    )
    log.add("run.paused", reason="approval", checkpoint_version=1)


def test_a_pause_the_reader_decides_ends_the_response_with_tool_calls() -> None:
    log = Log()
    paused_run(log)
    chunks = RunChunks("t", RUN, lambda tool: True)
    steps = [chunks.feed(entry) for entry in log.entries]
    emitted = [c for step in steps for c in step.chunks]
    assert types_of(emitted) == [
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "tool-input-available",
        "tool-approval-request",
    ]
    request = next(c for c in emitted if c["type"] == "tool-approval-request")
    assert request["approvalDescriptor"]["canDecide"] is True
    assert steps[-1].boundary is Boundary.CALLER_DECIDES
    assert [c["type"] for c in steps[-1].closing] == ["finish-step", "finish"]
    assert steps[-1].closing[-1]["finishReason"] == "tool-calls"
    # Every stored event that gave chunks is followed by its seq.
    seqs = [c["messageMetadata"]["seq"] for c in emitted if c["type"] == "message-metadata"]
    assert seqs[:6] == [1, 2, 3, 4, 5, 6]


def test_a_pause_only_a_reviewer_decides_keeps_the_response_open() -> None:
    log = Log()
    paused_run(log)
    chunks = RunChunks("t", RUN, lambda tool: False)
    steps = [chunks.feed(entry) for entry in log.entries]
    assert all(step.boundary is None for step in steps)
    statuses = [c["messageMetadata"].get("status") for c in steps[-1].chunks]
    assert "waiting_for_review" in statuses


def test_a_rejection_denies_the_call_and_its_output_gives_no_second_chunk() -> None:
    log = Log()
    paused_run(log)
    log.add("approval.decided", approval_id="ap_1", decision="reject", reason="no", reviewer="bob")
    log.add("run.resumed", checkpoint_version=1)
    log.add("tool.output", call_id="c1", tool_name="issue_refund", output="no")
    log.add("run.completed", final_output="ok")
    chunks = RunChunks("t", RUN, lambda tool: True)
    steps = [chunks.feed(entry) for entry in log.entries]
    tail = [c for step in steps[7:] for c in step.chunks]
    assert types_of(tail) == ["tool-approval-response", "tool-output-denied"]
    assert tail[0] == {
        "type": "tool-approval-response",
        "approvalId": "ap_1",
        "approved": False,
        "reason": "no",
    }
    assert steps[-1].boundary is Boundary.FINISHED
    assert steps[-1].closing[-1]["finishReason"] == "stop"


def test_a_call_never_shown_is_shown_before_anything_refers_to_it() -> None:
    log = Log()
    log.add("run.started", input="x", agent="a")
    log.add("tool.output", call_id="nested", tool_name="lookup", output="found")
    chunks = RunChunks("t", RUN, lambda tool: True)
    emitted = [c for entry in log.entries for c in chunks.feed(entry).chunks]
    assert types_of(emitted) == ["start-step", "tool-input-available", "tool-output-available"]


def test_a_turn_after_tool_outputs_is_a_new_step() -> None:
    log = Log()
    log.add("run.started", input="status 7", agent="a")
    log.add("tool.called", call_id="c1", tool_name="get_order_status", arguments={"order_id": 7})
    log.add("tool.output", call_id="c1", tool_name="get_order_status", output="shipped")
    log.add("message.started", message_id="m2", agent="a")
    chunks = RunChunks("t", RUN, lambda tool: True)
    emitted = [c for entry in log.entries for c in chunks.feed(entry).chunks]
    assert types_of(emitted) == [
        "start-step",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
    ]


def test_a_recovered_run_replaces_its_cut_turn_and_the_fold_agrees() -> None:
    log = Log()
    log.add("run.started", input="story", agent="a")
    log.add("message.started", message_id="m1", agent="a")
    log.add("message.delta", message_id="m1", delta="Once up")
    log.add("message.aborted", message_id="m1", reason="gateway_restart")
    log.add("run.recovered", checkpoint_version=None)
    log.add("message.started", message_id="m2", agent="a")
    log.add("message.delta", message_id="m2", delta="Once upon a time")
    log.add("message.completed", message_id="m2", text="Once upon a time")
    log.add("run.completed", final_output="Once upon a time")
    chunks = RunChunks("t", RUN, lambda tool: True)
    fold = MessageFold(RUN)
    fold.add(chunks.start(0))
    emitted: list[dict[str, Any]] = []
    for entry in log.entries:
        step = chunks.feed(entry)
        emitted += step.chunks + step.closing
    for chunk in emitted:
        fold.add(chunk)
    assert "reset-step" in types_of(emitted)
    assert fold.message["parts"] == [
        {"type": "step-start"},
        {"type": "text", "text": "Once upon a time", "state": "done"},
    ]
    assert fold.message["metadata"]["status"] == "completed"


def test_a_recovery_keeps_a_step_whose_calls_the_checkpoint_carries_on() -> None:
    log = Log()
    paused_run(log)
    log.add("approval.decided", approval_id="ap_1", decision="approve", reason=None, reviewer="b")
    log.add("run.recovered", checkpoint_version=1)
    chunks = RunChunks("t", RUN, lambda tool: True)
    emitted = [c for entry in log.entries for c in chunks.feed(entry).chunks]
    assert "reset-step" not in types_of(emitted)


def test_the_newest_message_is_the_request() -> None:
    user = {"role": "user", "parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    asked = chat_request({"id": "c", "messages": [{"role": "user", "parts": []}, user]})
    assert (asked.text, asked.decisions) == ("ab", [])
    answer = {
        "id": "r_1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "x"},
            {"type": "tool-t", "state": "output-available"},
            {
                "type": "tool-t",
                "state": "approval-responded",
                "approval": {"id": "ap_1", "approved": False, "reason": "no"},
            },
        ],
    }
    answered = chat_request({"id": "c", "messages": [answer], "messageId": "r_1"})
    assert answered.text is None and answered.message_id == "r_1"
    assert [(d.approval_id, d.approve, d.reason) for d in answered.decisions] == [
        ("ap_1", False, "no")
    ]
    for bad in (
        {"id": "c", "messages": [{**answer, "parts": [answer["parts"][0]]}]},
        {"id": "c", "messages": [user], "messageId": 5},
        {"id": "", "messages": [user]},
    ):
        try:
            chat_request(bad)
        except GatewayError as exc:
            assert exc.code == "bad_request"
        else:
            raise AssertionError(f"accepted {bad}")
