"""One run's log as the Vercel AI SDK's UI message chunks (docs/protocol.md §11).

A run is one assistant message, whose id is the run's id. `RunChunks` folds the run's stored
events, from its `run.started`, into the chunks `useChat` understands; it is deterministic, so
a replay from the log gives exactly the chunks a live reader got. Every chunk is one of the
types the AI SDK's stream schema knows (an unknown type fails the client's whole request), and
each stored event that gives chunks is followed by a `message-metadata` chunk carrying its
`seq`, so an app can correlate what it shows with the gateway's own API.

A pause for approvals ends the response (`finish` with reason `tool-calls`, which keeps
useChat's automatic follow-up working) when its reader may decide at least one call of the
pause: useChat sends an answer only once the response has ended, so a response kept open
would leave that reader's calls waiting forever. The reader answers with
`addToolApprovalResponse`, and the next request continues the same message, following the run
live while a reviewer decides the calls that are not the reader's. When only a reviewer may
decide, the response stays open through the pause, and the continuation arrives in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gateway.frontends.thread_log import LogEntry
from gateway.protocol.frames import (
    MODEL_USAGE,
    REASONING_COMPLETED,
    REASONING_DELTA,
    REASONING_STARTED,
    TOOL_NEEDS_RECONCILIATION,
    EventType,
)

USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cached_tokens",
    "reasoning_tokens",
)

Chunk = dict[str, Any]


class Boundary(Enum):
    """Where a response may end."""

    # The run paused on calls this reader may decide (some or all of the pause's): the
    # response ends here unless the log already goes on past it (a replay of a pause since
    # decided).
    CALLER_DECIDES = "caller_decides"
    # The run finished: every response ends here.
    FINISHED = "finished"


@dataclass
class Step:
    """What one stored event gives: its chunks, and, where a response may end there, the
    boundary and the chunks that close the response when it does."""

    chunks: list[Chunk] = field(default_factory=list)
    boundary: Boundary | None = None
    closing: list[Chunk] = field(default_factory=list)


@dataclass
class _Call:
    tool_name: str
    approval_id: str | None = None
    denied: bool = False


class RunChunks:
    """The chunks of one run, event by event. `may_decide(tool_name)`: whether the reader
    may decide that tool's calls in this run (the access table, reviewer roles, four-eyes)."""

    def __init__(self, thread_id: str, run_id: str, may_decide: Callable[[str], bool]) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self._may_decide = may_decide
        self._calls: dict[str, _Call] = {}
        self._approvals: dict[str, str] = {}  # approval id -> call id
        self._pause: list[str] = []  # the tools of the approvals since the last pause
        # Open text parts, with the characters streamed into each so far.
        self._open_texts: dict[str, int] = {}
        self._open_reasonings: set[str] = set()
        # The message's tokens so far (its run's model calls), in its metadata as `usage`.
        self._usage: dict[str, int] = {}
        self._step_has_output = False
        # The current step shows model output (text, tool calls) of the turn under way, and
        # whether any of its calls asked for approval (restored from a checkpoint, they carry on).
        self._step_has_turn = False
        self._step_has_approval = False

    def start(self, seq: int, status: str = "running") -> Chunk:
        """The `start` chunk of a response over this run, as of `seq`."""
        return {
            "type": "start",
            "messageId": self.run_id,
            "messageMetadata": self.meta(seq, status),
        }

    def meta(self, seq: int, status: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {"threadId": self.thread_id, "runId": self.run_id, "seq": seq}
        if status is not None:
            data["status"] = status
        return data

    def feed(self, entry: LogEntry) -> Step:
        step = self._translate(entry)
        if step.chunks:
            # Only the seq: metadata merges, and `start` gave the thread and run.
            step.chunks.append({"type": "message-metadata", "messageMetadata": {"seq": entry.seq}})
        return step

    # -- the translation, event by event ----------------------------------------------------

    def _translate(self, entry: LogEntry) -> Step:
        data = entry.data
        kind = entry.type
        if kind == EventType.RUN_STARTED:
            return Step([{"type": "start-step"}])
        if kind == EventType.MESSAGE_STARTED:
            self._open_texts[data["message_id"]] = 0
            step = self._next_step()
            self._step_has_turn = True
            return Step([*step, {"type": "text-start", "id": data["message_id"]}])
        if kind == EventType.MESSAGE_DELTA:
            message_id = data["message_id"]
            if message_id in self._open_texts:
                self._open_texts[message_id] += len(data["delta"])
            return Step([{"type": "text-delta", "id": message_id, "delta": data["delta"]}])
        if kind in (EventType.MESSAGE_COMPLETED, EventType.MESSAGE_ABORTED):
            # A stopped or cut message keeps the text it streamed.
            message_id = data["message_id"]
            if message_id not in self._open_texts:
                return Step()
            streamed = self._open_texts.pop(message_id)
            chunks: list[Chunk] = []
            text = data.get("text")
            if (
                kind == EventType.MESSAGE_COMPLETED
                and isinstance(text, str)
                and len(text) > streamed
            ):
                # Text the model gave whole, not as deltas (a refusal): the completed message
                # is the only place it is, and the client shows only what its deltas gave.
                chunks.append({"type": "text-delta", "id": message_id, "delta": text[streamed:]})
            return Step([*chunks, {"type": "text-end", "id": message_id}])
        if kind == REASONING_STARTED:
            self._open_reasonings.add(data["reasoning_id"])
            step = self._next_step()
            self._step_has_turn = True
            return Step([*step, {"type": "reasoning-start", "id": data["reasoning_id"]}])
        if kind == REASONING_DELTA:
            delta = {"type": "reasoning-delta", "id": data["reasoning_id"], "delta": data["delta"]}
            return Step([delta])
        if kind == REASONING_COMPLETED:
            if data["reasoning_id"] not in self._open_reasonings:
                return Step()
            self._open_reasonings.discard(data["reasoning_id"])
            return Step([{"type": "reasoning-end", "id": data["reasoning_id"]}])
        if kind == MODEL_USAGE:
            for name in USAGE_FIELDS:
                self._usage[name] = self._usage.get(name, 0) + int(data.get(name) or 0)
            self._usage["requests"] = self._usage.get("requests", 0) + 1
            usage = {"type": "message-metadata", "messageMetadata": {"usage": dict(self._usage)}}
            return Step([usage])
        if kind == EventType.TOOL_CALLED:
            step = self._next_step()
            self._step_has_turn = True
            return Step([*step, *self._called(data)])
        if kind == EventType.TOOL_OUTPUT:
            return Step(self._output(data))
        if kind == EventType.APPROVAL_REQUESTED:
            return Step(self._approval_requested(data))
        if kind == EventType.APPROVAL_DECIDED:
            return Step(self._approval_decided(data))
        if kind == EventType.RUN_PAUSED:
            return self._paused(entry)
        if kind == EventType.RUN_RECOVERED:
            self._pause = []
            return Step([*self._end_cut_turn(), self._status(entry.seq, "running")])
        if kind == EventType.RUN_RESUMED:
            self._pause = []
            return Step([self._status(entry.seq, "running")])
        if kind == EventType.AGENT_CHANGED:
            return Step([{"type": "data-agent", "data": {"agent": data.get("agent")}}])
        if kind == TOOL_NEEDS_RECONCILIATION:
            return Step([{"type": "data-needs-reconciliation", "data": data}])
        if kind == EventType.RUN_COMPLETED:
            closing: list[Chunk] = [
                {"type": "finish-step"},
                {
                    "type": "finish",
                    "finishReason": "stop",
                    "messageMetadata": self._final_meta(entry, "completed"),
                },
            ]
            return Step(self._close_texts(), Boundary.FINISHED, closing)
        if kind == EventType.RUN_FAILED:
            error = data.get("error") or {}
            text = f"{error.get('code', 'run_error')}: {error.get('message', 'the run failed')}"
            return Step(
                self._close_texts(), Boundary.FINISHED, [{"type": "error", "errorText": text}]
            )
        if kind == EventType.RUN_CANCELLED:
            closing = [
                {"type": "abort", "reason": "cancelled"},
                {
                    "type": "finish",
                    "finishReason": "other",
                    "messageMetadata": self._final_meta(entry, "cancelled"),
                },
            ]
            return Step(self._close_texts(), Boundary.FINISHED, closing)
        # input.staged / input.queued belong to later turns, not to this message.
        return Step()

    def _end_cut_turn(self) -> list[Chunk]:
        """A run taken over after its process stopped runs the cut turn again from its
        checkpoint: what the current step showed of that turn (its partial text, its calls)
        is replaced by the new attempt, as `message.aborted` tells native clients to drop it.
        A step that already holds tool outputs or approvals is kept: its calls may be an
        earlier turn's, which the checkpoint carries on (an approved call runs under its own
        id), and a repeated call shows beside them. Texts and reasoning the cut turn left open
        never go on: dropped with the step they are in, else ended (the client refuses an end
        for a part that `reset-step` removed)."""
        if not self._step_has_turn or self._step_has_output or self._step_has_approval:
            return self._close_texts()
        self._step_has_turn = False
        self._open_texts.clear()
        self._open_reasonings.clear()
        return [{"type": "reset-step"}]

    def _next_step(self) -> list[Chunk]:
        """A model turn that follows tool outputs is a new step of the message."""
        if not self._step_has_output:
            return []
        self._step_has_output = False
        self._step_has_turn = False
        self._step_has_approval = False
        return [{"type": "finish-step"}, {"type": "start-step"}]

    def _called(self, data: dict[str, Any]) -> list[Chunk]:
        call_id = data["call_id"]
        self._calls[call_id] = _Call(data["tool_name"])
        return [
            {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": data["tool_name"],
                "input": data.get("arguments", {}),
            }
        ]

    def _known_call(self, call_id: str, tool_name: str, arguments: Any) -> list[Chunk]:
        """A call this message has not shown yet (made inside an agent used as a tool) is
        shown before anything refers to it: the client fails on an unknown tool call id."""
        if call_id in self._calls:
            return []
        return self._called({"call_id": call_id, "tool_name": tool_name, "arguments": arguments})

    def _output(self, data: dict[str, Any]) -> list[Chunk]:
        call_id = data["call_id"]
        self._step_has_output = True
        known = self._known_call(call_id, data["tool_name"], {})
        if self._calls[call_id].denied:
            # The model's copy of the rejection; the part already says `output-denied`.
            return known
        return [
            *known,
            {"type": "tool-output-available", "toolCallId": call_id, "output": data["output"]},
        ]

    def _approval_requested(self, data: dict[str, Any]) -> list[Chunk]:
        call_id = data["call_id"]
        known = self._known_call(call_id, data["tool_name"], data.get("arguments", {}))
        self._calls[call_id].approval_id = data["approval_id"]
        self._step_has_approval = True
        self._approvals[data["approval_id"]] = call_id
        self._pause.append(data["tool_name"])
        descriptor = {
            "expiresAt": data.get("expires_at"),
            "reviewerRoles": data.get("reviewer_roles", []),
            "canDecide": self._may_decide(data["tool_name"]),
        }
        return [
            *known,
            {
                "type": "tool-approval-request",
                "approvalId": data["approval_id"],
                "toolCallId": call_id,
                "approvalDescriptor": descriptor,
            },
        ]

    def _approval_decided(self, data: dict[str, Any]) -> list[Chunk]:
        call_id = self._approvals.get(data["approval_id"])
        if call_id is None:
            return []
        approved = data.get("decision") == "approve"
        response: Chunk = {
            "type": "tool-approval-response",
            "approvalId": data["approval_id"],
            "approved": approved,
        }
        if data.get("reason"):
            response["reason"] = data["reason"]
        if approved:
            return [response]
        self._calls[call_id].denied = True
        return [response, {"type": "tool-output-denied", "toolCallId": call_id}]

    def _paused(self, entry: LogEntry) -> Step:
        if entry.data.get("reason") != "approval":
            return Step([*self._close_texts(), self._status(entry.seq, "suspended")])
        tools, self._pause = self._pause, []
        chunks = [*self._close_texts(), self._status(entry.seq, "waiting_for_review")]
        if not any(self._may_decide(tool) for tool in tools):
            # Only a reviewer decides, elsewhere; the continuation comes in this response.
            return Step(chunks)
        closing: list[Chunk] = [
            {"type": "finish-step"},
            {
                "type": "finish",
                "finishReason": "tool-calls",
                "messageMetadata": self.meta(entry.seq, "waiting_for_review"),
            },
        ]
        return Step(chunks, Boundary.CALLER_DECIDES, closing)

    def _final_meta(self, entry: LogEntry, status: str) -> dict[str, Any]:
        """The metadata a finished run leaves: its status, and its token totals (the SDK's
        count over all its model calls) when the run reported them."""
        meta = self.meta(entry.seq, status)
        if isinstance(entry.data.get("usage"), dict):
            meta["usage"] = entry.data["usage"]
        return meta

    def _status(self, seq: int, status: str) -> Chunk:
        return {"type": "message-metadata", "messageMetadata": self.meta(seq, status)}

    def _close_texts(self) -> list[Chunk]:
        """Texts and reasoning still open when the run stops or pauses are ended (their
        `message.aborted` / `reasoning.completed` come first in the log; this covers a log
        cut short)."""
        closing: list[Chunk] = [
            {"type": "text-end", "id": message_id} for message_id in sorted(self._open_texts)
        ]
        closing += [
            {"type": "reasoning-end", "id": reasoning_id}
            for reasoning_id in sorted(self._open_reasonings)
        ]
        self._open_texts.clear()
        self._open_reasonings.clear()
        return closing
