"""The thread log as AG-UI events (docs/protocol.md §12): one pure, stateful projection.

A `ThreadProjection` reads a thread's stored events from its first seq, in order, and gives for
each the AG-UI events it stands for. It holds no clock and no randomness: the same log gives the
same events, so a replay or a connect from a cursor produces exactly what a live client was
sent. Every AG-UI event is tied to the seq of the stored event it comes from.

How the gateway's run maps onto AG-UI's:

- a gateway run that pauses for approvals ends its AG-UI run with `RUN_FINISHED` and an
  `interrupt` outcome (one interrupt per approval); its continuation after the decisions is a
  new AG-UI run, which answers the decided calls with `TOOL_CALL_RESULT` for their original
  `toolCallId`;
- every AG-UI run opens with `RUN_STARTED`, a `MESSAGES_SNAPSHOT` of the conversation as the
  gateway holds it (so client-made message ids and CopilotKit's synthetic tool messages give
  way to the gateway's own), and a step named after the agent; a handoff closes that step and
  opens the next;
- pauses that are not for approvals (a suspension, a graceful shutdown) and recoveries leave
  the AG-UI run open: to the client the run simply goes on;
- reasoning summaries are reasoning messages, and each AG-UI run ends with the tokens of its
  own model calls.

The projection also keeps the messages a client holds after applying these events (the same
shapes and key order as `@ag-ui/client`'s reducer builds), which is what a connect from the
middle of a run restates in its prelude.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol

import orjson
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.core.events import RunFinishedCancelledOutcome, RunFinishedInterruptOutcome

from gateway.frontends.answered_again import AnsweredAgain

Event = dict[str, Any]

# What an approval's answer may hold. `editedArgs` (a full replacement of the call's arguments)
# only where the graph lets a reviewer edit the tool's calls: its presence is the capability
# signal to clients (docs/protocol.md §12).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 4000},
    },
    "required": ["approved"],
}
EDITABLE_RESPONSE_SCHEMA: dict[str, Any] = {
    **RESPONSE_SCHEMA,
    "properties": {**RESPONSE_SCHEMA["properties"], "editedArgs": {"type": "object"}},
}
METADATA_KEY = "agents-gateway"
RECONCILIATION = "agents-gateway.tool.needs_reconciliation"
TERMINAL = frozenset({"RUN_FINISHED", "RUN_ERROR"})


class Dialect(Enum):
    """What the client accepts. `@ag-ui/client` 0.0.x (CopilotKit 1.74/1.75) sends no
    `protocolVersion` and fails on a `cancelled` outcome and on event types it does not know;
    1.0 sends `"1.0"`."""

    LEGACY = "0.x"
    V1 = "1.0"

    @classmethod
    def of(cls, protocol_version: str | None) -> Dialect:
        return cls.LEGACY if protocol_version is None else cls.V1


class StoredEvent(Protocol):
    """A thread log entry (`gateway.frontends.thread_log.LogEntry`)."""

    @property
    def seq(self) -> int: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def type(self) -> str: ...
    @property
    def ts(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...


@dataclass
class Pause:
    """The newest approval pause: its interrupts, and what has been decided of them."""

    run_id: str
    seq: int
    interrupts: dict[str, Event]
    decisions: dict[str, str] = field(default_factory=dict)
    continued: bool = False

    @property
    def open_ids(self) -> list[str]:
        return [i for i in self.interrupts if i not in self.decisions]


@dataclass
class _Run:
    """The AG-UI run open on the stream."""

    name: str
    gateway_run_id: str
    step: str
    message_id: str | None = None
    # The assistant message this turn's tool calls belong to: the turn's text, else its first
    # call (`@ag-ui/client` then keeps one assistant message for the turn's calls).
    turn_parent: str | None = None
    requested: list[Event] = field(default_factory=list)
    reasoning_id: str | None = None
    # This AG-UI run's tokens, per model: usage is not carried across a pause's gap.
    usage: dict[str, TokenUsage] = field(default_factory=dict)


def user_message_id(run_id: str) -> str:
    return f"{run_id}.input"


def tool_message_id(call_id: str) -> str:
    return f"{call_id}.output"


def _millis(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def _dump(event: BaseEvent) -> Event:
    return event.model_dump(mode="json", by_alias=True, exclude_none=True)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


class ThreadProjection:
    """A thread's log as AG-UI events, fed one stored event at a time from seq 1."""

    def __init__(self, thread_id: str, dialect: Dialect) -> None:
        self.thread_id = thread_id
        self.dialect = dialect
        self.seq = 0
        self.run: _Run | None = None
        self.pause: Pause | None = None
        # The newest pause's interrupts when a cancel made them void, until the next run.
        self.voided: Pause | None = None
        self.messages: list[Event] = []
        self.user_message_ids: set[str] = set()
        # Which messages each gateway run made, in order; how many of them stood at its
        # newest boundary (where a retry goes on from); and the run whose input each run
        # answers (its own, or a failed run's for a retry): what a regenerate or a retry
        # takes out of the conversation.
        self._made: dict[str, list[str]] = {}
        self._kept: dict[str, int] = {}
        self._turn: dict[str, str] = {}
        # The agent each gateway run is on, kept across its pauses.
        self._agents: dict[str, str] = {}
        self._next_name: str | None = None
        self._ts = 0

    # -- reading -------------------------------------------------------------------------

    def name_next_run(self, name: str) -> None:
        """The runId the client chose for the run it asked for: the next AG-UI run opened
        gets it instead of the gateway's name (RUN_STARTED and RUN_FINISHED echo it)."""
        self._next_name = name

    def apply(self, entry: StoredEvent) -> list[Event]:
        """The AG-UI events `entry` stands for (often none), in order."""
        self.seq = entry.seq
        self._ts = _millis(entry.ts)
        handler = _HANDLERS.get(entry.type)
        if handler is None or entry.run_id is None:
            return []
        return handler(self, entry.run_id, entry.data)

    def prelude(self) -> list[Event]:
        """For a client that comes back in the middle of a run: the run re-opened as it
        stands (same runId), the messages as of now, and the constructs still open, so that
        the events that follow apply exactly as they did for a client that never left."""
        run = self.run
        if run is None:
            return []
        events = [
            self._event(RunStartedEvent(thread_id=self.thread_id, run_id=run.name)),
            self._snapshot(),
            self._event(StepStartedEvent(step_name=run.step)),
        ]
        if run.reasoning_id is not None:
            events += self._reasoning_opened(run.reasoning_id)
        if run.message_id is not None:
            events.append(
                self._event(TextMessageStartEvent(message_id=run.message_id, role="assistant"))
            )
        return events

    # -- building ------------------------------------------------------------------------

    def _event(self, event: BaseEvent) -> Event:
        event.timestamp = self._ts
        return _dump(event)

    def _snapshot(self) -> Event:
        event = self._event(MessagesSnapshotEvent(messages=[]))
        # The messages as dictionaries in the reducer's key order, not through the models
        # (which would reorder keys): applying a snapshot then changes no message's bytes.
        event["messages"] = copy.deepcopy(self.messages)
        return event

    def _open_run(self, gateway_run_id: str, name: str) -> list[Event]:
        if self._next_name is not None:
            name, self._next_name = self._next_name, None
        step = self._agents.get(gateway_run_id, "agent")
        self.run = _Run(name=name, gateway_run_id=gateway_run_id, step=step)
        return [
            self._event(RunStartedEvent(thread_id=self.thread_id, run_id=name)),
            self._snapshot(),
            self._event(StepStartedEvent(step_name=step)),
        ]

    def _close_run(self, run: _Run) -> list[Event]:
        events = self._close_reasoning(run)
        if run.message_id is not None:
            events.append(self._event(TextMessageEndEvent(message_id=run.message_id)))
            run.message_id = None
        events.append(self._event(StepFinishedEvent(step_name=run.step)))
        self.run = None
        return events

    def _finished(self, run: _Run, outcome: Any = None) -> Event:
        return self._event(
            RunFinishedEvent(
                thread_id=self.thread_id, run_id=run.name, outcome=outcome, usage=_usage(run)
            )
        )

    def _cancelled(self, run: _Run) -> Event:
        if self.dialect is Dialect.LEGACY:
            # 0.x fails on a `cancelled` outcome; an error with its code is an ending it takes.
            cancelled = RunErrorEvent(
                message="the run was cancelled", code="cancelled", usage=_usage(run)
            )
            return self._event(cancelled)
        return self._finished(run, RunFinishedCancelledOutcome())

    def _reasoning_opened(self, reasoning_id: str) -> list[Event]:
        # The span and the one message in it share the id (AG-UI allows it).
        return [
            self._event(ReasoningStartEvent(message_id=reasoning_id)),
            self._event(ReasoningMessageStartEvent(message_id=reasoning_id, role="reasoning")),
        ]

    def _close_reasoning(self, run: _Run) -> list[Event]:
        reasoning_id, run.reasoning_id = run.reasoning_id, None
        if reasoning_id is None:
            return []
        return [
            self._event(ReasoningMessageEndEvent(message_id=reasoning_id)),
            self._event(ReasoningEndEvent(message_id=reasoning_id)),
        ]

    def _current(self, run_id: str) -> _Run | None:
        run = self.run
        return run if run is not None and run.gateway_run_id == run_id else None

    # -- stored events -------------------------------------------------------------------

    def _run_started(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        if self.run is not None:
            # Only a log cut by retention mid-run gets here: that run's end is not stored.
            incomplete = RunErrorEvent(message="the run's end is not in the log", code="incomplete")
            events = [*self._close_run(self.run), self._event(incomplete)]
        self.pause = self.voided = None
        self._agents[run_id] = str(data.get("agent") or "agent")
        again = AnsweredAgain.of(data)
        if again.supersedes is not None:
            self._forget_turn(self._turn.get(again.supersedes, again.supersedes))
        if again.retries is not None:
            # The failed run's input is answered again, not repeated: the conversation goes
            # back to where the retry goes on from, as the agent's history does.
            failed = again.retries
            turn = self._turn[run_id] = self._turn.get(failed, failed)
            if again.from_boundary:
                self._forget(self._made.get(failed, [])[self._kept.get(failed, 0) :])
            else:
                self._forget_turn(turn, keep=user_message_id(turn))
        else:
            self._turn[run_id] = run_id
            message_id = user_message_id(run_id)
            self.user_message_ids.add(message_id)
            self._add(run_id, {"id": message_id, "role": "user", "content": data.get("input", "")})
        self._kept[run_id] = len(self._made.get(run_id, []))
        return events + self._open_run(run_id, run_id)

    def _message_started(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        events = []
        if run.message_id is not None:
            events.append(self._event(TextMessageEndEvent(message_id=run.message_id)))
        message_id = data["message_id"]
        run.message_id = run.turn_parent = message_id
        self._add(run_id, {"id": message_id, "role": "assistant", "content": ""})
        events.append(self._event(TextMessageStartEvent(message_id=message_id, role="assistant")))
        return events

    def _message_delta(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        delta = data.get("delta") or ""
        if run is None or run.message_id is None or run.message_id != data.get("message_id"):
            return []
        if not delta:
            return []
        self._grow(run.message_id, delta)
        return [self._event(TextMessageContentEvent(message_id=run.message_id, delta=delta))]

    def _grow(self, message_id: str, delta: str) -> None:
        """The snapshot's copy of a streaming message (text or reasoning) grows with it."""
        message = self._message(message_id)
        if message is not None:
            message["content"] = (message.get("content") or "") + delta

    def _message_completed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        """The message ends as `text` has it. Text the deltas did not carry (a model's
        refusal arrives only here) is streamed before the end, or, where it does not extend
        what was streamed, restated by a snapshot after it."""
        run = self._current(run_id)
        message_id = data.get("message_id")
        if run is None or message_id is None or run.message_id != message_id:
            return []
        run.message_id = None
        message = self._message(message_id)
        text = data.get("text")
        streamed = "" if message is None else str(message.get("content") or "")
        end = self._event(TextMessageEndEvent(message_id=message_id))
        if message is None or not isinstance(text, str) or text == streamed:
            return [end]
        if text.startswith(streamed):
            rest = text[len(streamed) :]
            self._grow(message_id, rest)
            return [self._event(TextMessageContentEvent(message_id=message_id, delta=rest)), end]
        message["content"] = text
        return [end, self._snapshot()]

    def _message_aborted(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        """Closed, then dropped from the conversation (the native protocol's "drop its
        partial text") unless calls hang on it: a restated snapshot without it. A stopped
        message (`cancelled`) stays as it was streamed, as the gateway keeps it in the
        conversation's history."""
        run = self._current(run_id)
        message_id = data.get("message_id")
        events = []
        if run is not None and message_id is not None and run.message_id == message_id:
            run.message_id = None
            events.append(self._event(TextMessageEndEvent(message_id=message_id)))
        message = self._message(message_id)
        if data.get("reason") == "cancelled":
            return events
        if run is None or message is None or message.get("toolCalls"):
            return events
        self.messages.remove(message)
        if run.turn_parent == message_id:
            run.turn_parent = None
        return [*events, self._snapshot()]

    def _tool_called(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        events = []
        if run.message_id is not None:
            # A call ends the text before it (the client cannot stream both at once).
            events.append(self._event(TextMessageEndEvent(message_id=run.message_id)))
            run.message_id = None
        call_id, name = data["call_id"], data["tool_name"]
        parent = run.turn_parent = run.turn_parent or call_id
        arguments = _json(data.get("arguments", {}))
        owner = self._message(parent)
        if owner is None or owner.get("role") != "assistant":
            owner = {"id": parent, "role": "assistant", "toolCalls": []}
            self._add(run_id, owner)
        owner.setdefault("toolCalls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
        return [
            *events,
            self._event(
                ToolCallStartEvent(
                    tool_call_id=call_id, tool_call_name=name, parent_message_id=parent
                )
            ),
            self._event(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments)),
            self._event(ToolCallEndEvent(tool_call_id=call_id)),
        ]

    def _tool_output(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        # The outputs close a turn: the next turn's calls belong to its own message.
        run.turn_parent = None
        call_id = data["call_id"]
        content = str(data.get("output", ""))
        message_id = tool_message_id(call_id)
        self._insert_tool_message(
            {"id": message_id, "toolCallId": call_id, "role": "tool", "content": content}
        )
        made = self._made.setdefault(run_id, [])
        made.append(message_id)
        # A turn's outputs are a boundary: a retry goes on from the newest.
        self._kept[run_id] = len(made)
        # The snapshot after the result: `@ag-ui/client` builds a tool message from the
        # result with its keys in another order than a snapshot's tool message gets from its
        # schema, so a client that later picks the run up from a prelude would hold the same
        # message with other bytes. Restated at once, every client holds the snapshot's.
        return [
            self._event(
                ToolCallResultEvent(
                    message_id=message_id, tool_call_id=call_id, content=content, role="tool"
                )
            ),
            self._snapshot(),
        ]

    def _needs_reconciliation(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        if self._current(run_id) is None:
            return []
        return [self._event(CustomEvent(name=RECONCILIATION, value=data))]

    def _reasoning_started(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        events = self._close_reasoning(run)
        reasoning_id = str(data["reasoning_id"])
        run.reasoning_id = reasoning_id
        self._add(run_id, {"id": reasoning_id, "role": "reasoning", "content": ""})
        return [*events, *self._reasoning_opened(reasoning_id)]

    def _reasoning_delta(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        delta = data.get("delta") or ""
        if run is None or run.reasoning_id is None or run.reasoning_id != data.get("reasoning_id"):
            return []
        if not delta:
            return []
        self._grow(run.reasoning_id, delta)
        return [self._event(ReasoningMessageContentEvent(message_id=run.reasoning_id, delta=delta))]

    def _reasoning_completed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None or run.reasoning_id != data.get("reasoning_id"):
            return []
        return self._close_reasoning(run)

    def _model_usage(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        model = data.get("model")
        key = str(model or "")
        counted = run.usage.get(key) or TokenUsage(
            model=model,
            input_tokens=0,
            output_tokens=0,
            total_tokens=0,
            cached_input_tokens=0,
            reasoning_tokens=0,
        )
        run.usage[key] = counted.model_copy(
            update={
                "input_tokens": (counted.input_tokens or 0) + int(data.get("input_tokens") or 0),
                "output_tokens": (counted.output_tokens or 0) + int(data.get("output_tokens") or 0),
                "total_tokens": (counted.total_tokens or 0) + int(data.get("total_tokens") or 0),
                "cached_input_tokens": (counted.cached_input_tokens or 0)
                + int(data.get("cached_tokens") or 0),
                "reasoning_tokens": (counted.reasoning_tokens or 0)
                + int(data.get("reasoning_tokens") or 0),
            }
        )
        return []

    def _agent_changed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        agent = str(data.get("agent") or "agent")
        self._agents[run_id] = agent
        run = self._current(run_id)
        if run is None or run.step == agent:
            return []
        events = [self._event(StepFinishedEvent(step_name=run.step))]
        run.step = agent
        return [*events, self._event(StepStartedEvent(step_name=agent))]

    def _approval_requested(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is not None:
            run.requested.append(_interrupt(data))
        return []

    def _run_paused(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None or data.get("reason") != "approval" or not run.requested:
            # A suspension or a shutdown: the client's run goes on when the gateway's does.
            return []
        interrupts = run.requested
        self.pause = Pause(run_id, self.seq, {i["id"]: i for i in interrupts})
        self._kept[run_id] = len(self._made.get(run_id, []))  # a pause is a boundary too
        outcome = RunFinishedInterruptOutcome(
            interrupts=[Interrupt.model_validate(i) for i in interrupts]
        )
        return [*self._close_run(run), self._finished(run, outcome)]

    def _approval_decided(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        pause = self.pause
        approval_id = data.get("approval_id")
        if pause is not None and pause.run_id == run_id and approval_id in pause.interrupts:
            pause.decisions[str(approval_id)] = str(data.get("decision"))
        return []

    def _run_resumed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        pause = self.pause
        if self.run is not None or pause is None or pause.run_id != run_id or pause.continued:
            return []
        pause.continued = True
        return self._open_run(run_id, f"{run_id}.{data.get('checkpoint_version')}")

    def _run_completed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        return [*self._close_run(run), self._finished(run)]

    def _run_failed(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is None:
            return []
        error = data.get("error") or {}
        failed = RunErrorEvent(
            message=str(error.get("message") or "the run failed"),
            code=str(error.get("code") or "run_error"),
            usage=_usage(run),
        )
        return [*self._close_run(run), self._event(failed)]

    def _run_cancelled(self, run_id: str, data: dict[str, Any]) -> list[Event]:
        run = self._current(run_id)
        if run is not None:
            return [*self._close_run(run), self._cancelled(run)]
        pause = self.pause
        if pause is None or pause.run_id != run_id or pause.continued:
            return []
        # Cancelled while it waited for decisions: its AG-UI run already ended with the
        # interrupts. A short run of its own tells the client they are void: 0.x clears a
        # client's interrupts only on RUN_FINISHED (a RUN_ERROR would leave them, and the
        # client refuses every new message until they are answered), so it gets one without
        # an outcome.
        self.voided, self.pause = pause, None
        events = self._open_run(run_id, f"{run_id}.cancelled")
        run = self.run
        assert run is not None
        ending = self._finished(run) if self.dialect is Dialect.LEGACY else self._cancelled(run)
        return [*events, *self._close_run(run), ending]

    # -- the client's messages -------------------------------------------------------------

    def _add(self, run_id: str, message: Event) -> None:
        self.messages.append(message)
        self._made.setdefault(run_id, []).append(message["id"])

    def _forget(self, message_ids: list[str]) -> None:
        gone = set(message_ids)
        self.messages = [m for m in self.messages if m["id"] not in gone]

    def _forget_turn(self, turn: str, keep: str | None = None) -> None:
        """The messages of every run that answered `turn`'s input (but `keep`)."""
        self._forget(
            [
                message_id
                for run_id, answered in self._turn.items()
                if answered == turn
                for message_id in self._made.get(run_id, [])
                if message_id != keep
            ]
        )

    def _message(self, message_id: Any) -> Event | None:
        return next((m for m in self.messages if m["id"] == message_id), None)

    def _insert_tool_message(self, message: Event) -> None:
        """Right after the assistant message that made the call, past its other outputs,
        as `@ag-ui/client` places it; at the end when no message made it."""
        call_id = message["toolCallId"]
        owner = next(
            (
                index
                for index, m in enumerate(self.messages)
                if m.get("role") == "assistant"
                and any(call["id"] == call_id for call in m.get("toolCalls") or [])
            ),
            None,
        )
        if owner is None:
            self.messages.append(message)
            return
        at = owner + 1
        while at < len(self.messages) and self.messages[at].get("role") == "tool":
            at += 1
        self.messages.insert(at, message)


def _usage(run: _Run) -> list[TokenUsage] | None:
    """The tokens of the run's model calls, one entry per model (None when none reported)."""
    return [run.usage[key] for key in sorted(run.usage)] or None


def _interrupt(data: dict[str, Any]) -> Event:
    """One approval as an AG-UI interrupt (arguments as the reader may see them)."""
    tool, arguments = data.get("tool_name", "tool"), data.get("arguments", {})
    interrupt: Event = {
        "id": data["approval_id"],
        "reason": "tool_call",
        "message": f"Approve the call {tool}({_json(arguments)})?",
        "toolCallId": data["call_id"],
        "responseSchema": (
            EDITABLE_RESPONSE_SCHEMA if data.get("arguments_editable") else RESPONSE_SCHEMA
        ),
    }
    if data.get("expires_at"):
        interrupt["expiresAt"] = data["expires_at"]
    interrupt["metadata"] = {
        METADATA_KEY: {
            "toolName": tool,
            "arguments": arguments,
            "agent": data.get("agent"),
            "reviewerRoles": data.get("reviewer_roles", []),
            # Who decides the call (docs/protocol.md §3 "Who decides"): "user", "reviewer",
            # "either"; absent in events stored before it existed.
            "decidedBy": data.get("decided_by"),
            "checkpointVersion": data.get("checkpoint_version"),
        }
    }
    return interrupt


_Handler = Callable[[ThreadProjection, str, dict[str, Any]], list[Event]]
_HANDLERS: Mapping[str, _Handler] = MappingProxyType(
    {
        "run.started": ThreadProjection._run_started,
        "message.started": ThreadProjection._message_started,
        "message.delta": ThreadProjection._message_delta,
        "message.completed": ThreadProjection._message_completed,
        "message.aborted": ThreadProjection._message_aborted,
        "tool.called": ThreadProjection._tool_called,
        "tool.output": ThreadProjection._tool_output,
        "tool.needs_reconciliation": ThreadProjection._needs_reconciliation,
        "reasoning.started": ThreadProjection._reasoning_started,
        "reasoning.delta": ThreadProjection._reasoning_delta,
        "reasoning.completed": ThreadProjection._reasoning_completed,
        "model.usage": ThreadProjection._model_usage,
        "agent.changed": ThreadProjection._agent_changed,
        "approval.requested": ThreadProjection._approval_requested,
        "approval.decided": ThreadProjection._approval_decided,
        "run.paused": ThreadProjection._run_paused,
        "run.resumed": ThreadProjection._run_resumed,
        "run.completed": ThreadProjection._run_completed,
        "run.failed": ThreadProjection._run_failed,
        "run.cancelled": ThreadProjection._run_cancelled,
    }
)
