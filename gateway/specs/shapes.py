"""The JSON the gateway sends (and the HTTP bodies it reads), as models for the API documents.

Client frames are described by the models that validate them (`gateway.protocol.frames`). What the
gateway *sends* is built by plain functions (the protocol builders, `approval_view`,
`RunManager.run_view`, the HTTP handlers), so these models exist only to describe it. They are
never used to build or validate traffic in the gateway; the tests validate real server output
against the schemas generated from them, and that is what keeps them honest.

Every schema lands under one name in `#/components/schemas/`, the same place in OpenAPI 3.1
and AsyncAPI 3.0, so both documents share them verbatim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema, models_json_schema

from gateway.auth.audit_trail import AuditAction, Outcome
from gateway.protocol.error_codes import ERRORS, ErrorCode, ErrorRule
from gateway.protocol.frames import (
    ADDED_EVENTS,
    MAX_ID_CHARS,
    MAX_REASON_CHARS,
    MODEL_USAGE,
    REASONING_COMPLETED,
    REASONING_DELTA,
    REASONING_STARTED,
    TOOL_NEEDS_RECONCILIATION,
)
from gateway.protocol.frames import EventType as E
from gateway.protocol.identity import Role
from gateway.run_lifecycle.thread_titles import MAX_TITLE_CHARS, TITLE_PATTERN
from gateway.transport.http_api import DEV_TOKEN_TTL_S, MAX_DEV_TOKEN_TTL_S, MIN_DEV_TOKEN_TTL_S
from persistence.approvals import ApprovalStatus
from persistence.run_status import RunStatus

REF = "#/components/schemas/"
# utc_ts(): UTC, milliseconds, `Z`.
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


Timestamp = Annotated[str, Field(pattern=TIMESTAMP_PATTERN, examples=["2026-11-29T12:00:00.123Z"])]
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
# A key that is sometimes absent but never null: the schema keeps only the string branch.
Absent = SkipJsonSchema[None]
# Schemas written by hand below (not models): pydantic cannot emit a `$ref` to a definition it
# does not know, so fields point at them with a marker that `tidy` turns into the `$ref`.
_LATER = "x-schema"
ErrorCodeValue = Annotated[str, WithJsonSchema({_LATER: "ErrorCode"})]
EventFrameValue = Annotated[dict[str, Any], WithJsonSchema({_LATER: "EventFrame"})]


class _Shape(BaseModel):
    # The gateway may add fields (docs/protocol.md §5: it "may add fields, never remove or rename
    # them"), so every described object allows keys it does not list.
    model_config = ConfigDict(extra="allow")


# --- shared objects -----------------------------------------------------------------------


class Approval(_Shape):
    """A tool call waiting for (or given) a human decision: `inbox`, `inbox.update`, the
    `approval.decide` ack and the HTTP API. `reviewer`, `reason` and `decided_at` appear once
    the approval is no longer pending (`reviewer` is null when the system decided: expiry,
    supersession). Inbox views add who may decide it."""

    approval_id: str
    thread_id: str
    run_id: str
    tool_name: str
    arguments: dict[str, Any]
    agent: str
    call_id: str
    checkpoint_version: int
    status: ApprovalStatus
    requested_at: Timestamp
    expires_at: Timestamp | None = Field(
        description="when the system rejects it if undecided (GATEWAY_APPROVAL_TTL_S); null: never"
    )
    reviewer: str | Absent | None = None
    reason: str | Absent | None = None
    decided_at: Timestamp | Absent | None = None
    edited_arguments: dict[str, Any] | Absent = Field(
        None, description="approved with these arguments instead of `arguments` (masked alike)"
    )
    arguments_editable: bool | Absent = Field(
        None, description="a reviewer may approve the call with edited `arguments`"
    )
    reviewer_roles: list[str] | Absent = Field(
        None, description="one of these roles is needed to decide; empty: any reviewer"
    )
    requested_by: str | Absent | None = Field(
        None, description="who started the run (may not approve it under the four-eyes rule)"
    )
    decided_by: Literal["user", "reviewer", "either"] | Absent = Field(
        None,
        description="who decides the call: the run's own user (the thread's owner), reviewers, "
        "or either (the tool's `decided_by`, else GATEWAY_SELF_APPROVAL)",
    )
    owner: str | Absent = Field(None, description="the thread's owner: the run's own user")
    run_input: str | Absent = Field(
        None, description="the input of the run that asked: what the call is for"
    )
    can_decide: bool | Absent = Field(
        None, description="inbox views and a run's pending approvals: this reader may decide"
    )
    can_approve: bool | Absent = Field(
        None, description="inbox views and a run's pending approvals: this reader may approve"
    )
    masked: list[str] | Absent = Field(
        None, description='sensitive arguments whose values this caller sees as "***"'
    )


class RunError(_Shape):
    """Why a run failed: `max_turns`, `model_behavior`, `guardrail_tripped` or `run_error`, and
    a short message."""

    code: str
    message: str
    guardrail: str | Absent = Field(
        None, description="`guardrail_tripped`: the name of the guardrail that tripped"
    )
    guardrail_kind: Literal["input", "output"] | Absent = Field(
        None, description="`guardrail_tripped`: whether it guarded the run's input or output"
    )


# --- server frames (WebSocket) ------------------------------------------------------------


class ServerInfo(_Shape):
    name: str
    version: str


class WelcomeFrame(_Shape):
    """The answer to a valid `hello`. A later `hello` on the same connection renews its token
    (same user and tenant) and is answered with a new `welcome` carrying its `id` as `ref`."""

    type: Literal["welcome"]
    ref: str | Absent = None
    protocol: int
    user: str
    tenant: str
    roles: list[str] = Field(description="sorted")
    heartbeat_s: float
    server: ServerInfo
    omit: list[Literal["reasoning", "usage"]] | Absent = Field(
        None, description="what the first hello asked to leave out, sorted; absent: nothing"
    )


class ThreadSummary(_Shape):
    """A thread as lists show it (`GET /v1/threads`, `threads`, `threads.update`)."""

    thread_id: str
    owner: str
    created_at: Timestamp
    metadata: dict[str, Any]
    epoch: str
    head_seq: int = Field(ge=0)
    title: str | None = Field(
        max_length=MAX_TITLE_CHARS,
        description="the first input (on one line, at most 80 characters) unless renamed; "
        "null before the thread's first run",
    )
    archived: bool
    archived_at: Timestamp | None
    last_activity_at: Timestamp = Field(
        description="the newest of the thread's creation and its newest run's last change"
    )
    run_id: str | None = Field(description="the thread's newest run; null before any")
    status: RunStatus | None = Field(description="the newest run's status; null before any")
    pending_approvals: int = Field(ge=0, description="approvals waiting on the thread")


class AckFrame(_Shape):
    """The success answer to a client frame that had an `id`, with the request's results."""

    type: Literal["ack"]
    ref: str | None = Field(description="the `id` of the frame this answers")
    thread_id: str | Absent = Field(
        None, description="thread.create, thread.subscribe, thread.unsubscribe, run.start"
    )
    epoch: str | Absent = Field(None, description="thread.create")
    run_id: str | Absent = Field(
        None,
        description="run.start, run.input, run.cancel, run.resume, run.regenerate, run.retry "
        "(the new run)",
    )
    supersedes: str | Absent = Field(None, description="run.regenerate: the run replaced")
    retries: str | Absent = Field(None, description="run.retry: the failed run retried")
    checkpoint_version: int | Absent | None = Field(
        None,
        description="run.retry: the failed run's checkpoint the new run goes on from; null: "
        "from its input",
    )
    disposition: Literal["started", "staged", "queued"] | Absent = Field(
        None, description="run.input"
    )
    approval: Approval | Absent = Field(None, description="approval.decide")
    thread: ThreadSummary | Absent = Field(None, description="thread.update: the thread after")
    deleted: Literal[True] | Absent = Field(None, description="thread.delete")


class ErrorFrame(_Shape):
    """A refused client frame, or a failure the client must hear about."""

    type: Literal["error"]
    ref: str | None = Field(description="the frame's `id` when it had a valid one, else null")
    code: ErrorCodeValue
    message: str = Field(description="for humans; never holds secrets; quoted input is clipped")
    retry_after_s: float | Absent = Field(
        None, description="on `rate_limited`: seconds until a retry would be admitted"
    )
    thread_id: str | Absent = Field(
        None,
        description="a subscription the server ended (the connection's new roles no longer "
        "allow it)",
    )


class SubscribedFrame(_Shape):
    """Starts a subscription; the replay (`event` frames with `seq` > the cursor) follows."""

    type: Literal["subscribed"]
    thread_id: str
    epoch: str
    head_seq: int = Field(ge=0)
    reset: bool = Field(
        description="the client's cursor could not be honoured: clear the view, the replay "
        "starts at the oldest stored event"
    )


class InboxFrame(_Shape):
    """Every pending approval of the tenant, oldest first, after `inbox.subscribe`."""

    type: Literal["inbox"]
    approvals: list[Approval]


class InboxUpdateFrame(_Shape):
    """Approvals that appeared (`added`) or were decided or superseded (`removed`)."""

    type: Literal["inbox.update"]
    added: list[Approval]
    removed: list[str]


class ThreadsFrame(_Shape):
    """The caller's thread list after `threads.subscribe` (and again whenever changes may have
    been missed): replace the list."""

    type: Literal["threads"]
    threads: list[ThreadSummary]


class ThreadsUpdateFrame(_Shape):
    """Threads of the list that changed (`threads`: their new summaries) or left it
    (`removed`: deleted, or archived out of it or brought back)."""

    type: Literal["threads.update"]
    threads: list[ThreadSummary]
    removed: list[str]


class PingFrame(_Shape):
    """The server's heartbeat, every `heartbeat_s`; answer with `pong`."""

    type: Literal["ping"]


class PongFrame(_Shape):
    """The answer to a client `ping`; `ref` when the ping had an `id`."""

    type: Literal["pong"]
    ref: str | Absent = None


SERVER_FRAMES: tuple[type[_Shape], ...] = (
    WelcomeFrame,
    AckFrame,
    ErrorFrame,
    SubscribedFrame,
    InboxFrame,
    InboxUpdateFrame,
    ThreadsFrame,
    ThreadsUpdateFrame,
    PingFrame,
    PongFrame,
)


# --- event data (one model per event type) ------------------------------------------------


class RunStartedData(_Shape):
    input: str
    agent: str
    supersedes: str | Absent = Field(
        None, description="run.regenerate: the run whose answer this one replaces"
    )
    retries: str | Absent = Field(
        None, description="run.retry: the failed run this one goes on from"
    )
    checkpoint_version: int | Absent | None = Field(
        None,
        description="with `retries`: the failed run's checkpoint this run goes on from; null: "
        "from its input",
    )


class MessageStartedData(_Shape):
    message_id: str
    agent: str


class MessageDeltaData(_Shape):
    message_id: str
    delta: str = Field(description="text to append")


class MessageCompletedData(_Shape):
    message_id: str
    text: str = Field(description="the whole message")


class MessageAbortedData(_Shape):
    """A started message that will never complete: drop its partial text, unless it was
    stopped (`reason` cancelled), whose `text` the gateway keeps."""

    message_id: str
    reason: Literal["cancelled", "failed", "paused", "incomplete", "gateway_restart"]
    text: str | Absent = Field(
        None,
        description="reason cancelled: the text streamed before the stop, which stays in the "
        "conversation (the agent's history included)",
    )


class ToolCalledData(_Shape):
    call_id: str
    tool_name: str
    arguments: dict[str, Any] = Field(
        description='always an object; other values are wrapped as {"_raw": "<text>"}'
    )
    agent: str
    masked: list[str] | Absent = Field(
        None, description='sensitive arguments whose values are replaced by "***"'
    )


class ToolOutputData(_Shape):
    call_id: str
    tool_name: str
    output: str


class ToolNeedsReconciliationData(_Shape):
    """A side-effecting call may or may not have taken effect: a human must check."""

    call_id: str
    tool_name: str
    idempotency_key: str


class ReasoningStartedData(_Shape):
    """The model began a reasoning summary (models that produce one)."""

    reasoning_id: str
    agent: str


class ReasoningDeltaData(_Shape):
    reasoning_id: str
    delta: str = Field(description="summary text to append")


class ReasoningCompletedData(_Shape):
    reasoning_id: str
    text: str = Field(description="the whole summary (what was streamed, when cut short)")
    aborted: bool | Absent = Field(None, description="true: the summary was cut short")


class TokenUsage(_Shape):
    requests: int | Absent = Field(None, description="model calls counted (run totals only)")
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cached_tokens: int = Field(description="input tokens read from the provider's cache")
    reasoning_tokens: int = Field(description="output tokens spent reasoning")


class ModelUsageData(TokenUsage):
    """The tokens of one model call, logged when its response completes."""

    agent: str
    model: str | Absent = Field(None, description="the model's name, when the provider says")


class AgentChangedData(_Shape):
    agent: str = Field(description="the agent in charge after a handoff")


class ApprovalRequestedData(_Shape):
    approval_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    agent: str
    checkpoint_version: int
    requested_at: Timestamp
    expires_at: Timestamp | Absent | None = None
    reviewer_roles: list[str] | Absent = Field(
        None, description="one of these roles is needed to decide; empty: any reviewer"
    )
    decided_by: Literal["user", "reviewer", "either"] | Absent = Field(
        None,
        description="who decides the call: the run's own user, reviewers, or either; what one "
        "reader may do is in the views (`can_decide`)",
    )
    arguments_editable: bool | Absent = Field(
        None, description="a reviewer may approve the call with edited `arguments` (§4)"
    )
    masked: list[str] | Absent = Field(
        None,
        description='sensitive arguments whose values are replaced by "***" (reviewers and '
        "admins receive the real values)",
    )


class ApprovalDecidedData(_Shape):
    approval_id: str
    decision: Literal["approve", "reject"]
    reason: str | None
    reviewer: str | None = Field(
        description="user id of the reviewer; null: the system (an expiry or a rule)"
    )
    decided_at: Timestamp
    expired: bool | Absent = Field(None, description="true: rejected because it expired")
    rule: str | Absent = Field(
        None, description="the name of the graph's approval rule that decided it by itself"
    )
    call_id: str | Absent = Field(
        None, description="a rule's decision: the call it decided (it was never requested)"
    )
    tool_name: str | Absent = Field(None, description="a rule's decision: the call's tool")
    edited_arguments: dict[str, Any] | Absent = Field(
        None,
        description="approved with these arguments instead of the call's (sensitive ones "
        "masked as in `approval.requested`)",
    )


class RunPausedData(_Shape):
    reason: Literal["approval", "disconnect", "shutdown"]
    checkpoint_version: int


class RunResumedData(_Shape):
    checkpoint_version: int


class RunRecoveredData(_Shape):
    checkpoint_version: int | None = Field(
        description="the checkpoint the run continues from; null: restarted from its input"
    )


class InputData(_Shape):
    input: str


class RunCompletedData(_Shape):
    final_output: str = Field(description='JSON-encoded when not a string; "" when none')
    usage: TokenUsage | Absent = Field(None, description="the run's tokens, all its model calls")


class RunFailedData(_Shape):
    error: RunError
    usage: TokenUsage | Absent = Field(None, description="the run's tokens, all its model calls")


class RunCancelledData(_Shape):
    usage: TokenUsage | Absent = Field(None, description="the run's tokens, all its model calls")


# --- webhooks (docs/protocol.md §10) ---------------------------------------------------


class WebhookDecisionData(ApprovalDecidedData):
    tool_name: str
    agent: str
    status: Literal["approved", "rejected", "expired"] = Field(
        description="the approval's status after the decision"
    )


class WebhookMessage(_Shape):
    id: str = Field(description="the `Webhook-Id`: the same for every attempt and endpoint")
    type: str = Field(description="the webhook type (not always the event's: approval.expired)")
    created_at: Timestamp = Field(description="the event's `ts`")
    tenant: str | None
    thread_id: str
    run_id: str | None
    seq: int = Field(description="the event's place in the thread's log")
    data: dict[str, Any]


def webhook_data_models() -> dict[str, type[_Shape]]:
    """Webhook type -> the model of its `data`."""
    return {
        "approval.requested": ApprovalRequestedData,
        "approval.decided": WebhookDecisionData,
        "approval.expired": WebhookDecisionData,
        "run.completed": RunCompletedData,
        "run.failed": RunFailedData,
        "run.cancelled": RunCancelledData,
    }


def event_data_models() -> dict[str, type[_Shape]]:
    """Event name -> the model of its `data`, for every event the gateway logs."""
    return {
        E.RUN_STARTED: RunStartedData,
        E.MESSAGE_STARTED: MessageStartedData,
        E.MESSAGE_DELTA: MessageDeltaData,
        E.MESSAGE_COMPLETED: MessageCompletedData,
        E.MESSAGE_ABORTED: MessageAbortedData,
        E.TOOL_CALLED: ToolCalledData,
        E.TOOL_OUTPUT: ToolOutputData,
        TOOL_NEEDS_RECONCILIATION: ToolNeedsReconciliationData,
        REASONING_STARTED: ReasoningStartedData,
        REASONING_DELTA: ReasoningDeltaData,
        REASONING_COMPLETED: ReasoningCompletedData,
        MODEL_USAGE: ModelUsageData,
        E.AGENT_CHANGED: AgentChangedData,
        E.APPROVAL_REQUESTED: ApprovalRequestedData,
        E.APPROVAL_DECIDED: ApprovalDecidedData,
        E.RUN_PAUSED: RunPausedData,
        E.RUN_RESUMED: RunResumedData,
        E.RUN_RECOVERED: RunRecoveredData,
        E.INPUT_STAGED: InputData,
        E.INPUT_QUEUED: InputData,
        E.RUN_COMPLETED: RunCompletedData,
        E.RUN_FAILED: RunFailedData,
        E.RUN_CANCELLED: RunCancelledData,
    }


def event_names() -> list[str]:
    """Every event name in the order the protocol lists them (gateway additions last)."""
    return [*(str(e) for e in E), *ADDED_EVENTS]


# --- HTTP bodies --------------------------------------------------------------------------


class ErrorDetail(_Shape):
    code: ErrorCodeValue
    message: str
    retry_after_s: float | Absent = Field(
        None, description="on `rate_limited`: seconds until a retry would be admitted"
    )


class ErrorBody(_Shape):
    """Every HTTP error of the API, with the status that matches `code`."""

    error: ErrorDetail


class Health(_Shape):
    status: Literal["ok"]


class Readiness(_Shape):
    status: Literal["ready", "unavailable"]
    storage: str = Field(description='"ok", or the class name of the storage failure')
    reason: str | None = Field(
        None,
        description="while unavailable: the database's own words for the trouble (read-only, "
        "full, damaged, unreachable); never a statement or its values",
    )


class DevTokenRequest(BaseModel):
    # Strict request shape: the handler refuses wrong types with 400.
    user: Annotated[str, Field(min_length=1, max_length=128, pattern=r"\S")]
    tenant: Annotated[str, Field(min_length=1, max_length=128, pattern=r"\S")] = "demo"
    roles: list[Role] = Field(default_factory=lambda: [Role.USER])
    ttl_s: Annotated[int, Field(ge=MIN_DEV_TOKEN_TTL_S, le=MAX_DEV_TOKEN_TTL_S)] = Field(
        DEV_TOKEN_TTL_S, description="the token's lifetime in seconds (`exp` - `iat`)"
    )


class DevTokenAvailability(_Shape):
    available: bool = Field(description="whether `POST /v1/dev/token` issues tokens")


class DevToken(_Shape):
    token: str = Field(description="an HS256 JWT valid for `ttl_s` seconds (default one hour)")


class DecisionRequest(BaseModel):
    decision: Literal["approve", "reject"]
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] | None = Field(
        None, description="for a rejection, exactly what the model is told"
    )
    arguments: dict[str, Any] | None = Field(
        None,
        description="approve with these arguments instead (tools the graph lets reviewers "
        "edit; checked against the tool's JSON schema)",
    )


class RunStartRequest(BaseModel):
    thread_id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)] | None = Field(
        None, description="an existing thread; omitted: a new thread owned by the caller"
    )
    input: str = Field(
        min_length=1,
        pattern=r"\S",
        description="the user's message: not blank, at most GATEWAY_MAX_INPUT_CHARS",
    )
    agent: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)] | None = Field(
        None, description="an agent graph by name; omitted: the default graph"
    )
    on_disconnect: Literal["continue"] = Field(
        "continue", description="only `continue`: an HTTP caller holds no connection to lose"
    )


class RunStarted(_Shape):
    thread_id: str
    run_id: str
    epoch: str = Field(description="the thread's epoch, for the SSE feed's `epoch` parameter")
    first_seq: int = Field(ge=1, description="seq of the run's `run.started` event")


class InputRequest(BaseModel):
    input: str = Field(
        min_length=1,
        pattern=r"\S",
        description="the user's message: not blank, at most GATEWAY_MAX_INPUT_CHARS",
    )


class InputAccepted(_Shape):
    disposition: Literal["started", "staged", "queued"]
    run_id: str
    first_seq: int | None = Field(
        None, ge=1, description="when `started`: seq of the new run's `run.started` event"
    )


class RegenerateRequest(BaseModel):
    input: str | None = Field(
        None,
        min_length=1,
        pattern=r"\S",
        description="an edit of the thread's last input; absent: the same input again",
    )
    run_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="the run the caller means to replace (409 unless it is the last)",
    )


class Regenerated(_Shape):
    thread_id: str
    run_id: str = Field(description="the new run")
    supersedes: str = Field(description="the run whose answer it replaces")
    first_seq: int = Field(ge=1, description="seq of the new run's `run.started` event")


class Retried(_Shape):
    thread_id: str
    run_id: str = Field(description="the new run")
    retries: str = Field(description="the failed run it goes on from")
    checkpoint_version: int | None = Field(
        description="the failed run's checkpoint it goes on from; null: from the run's input "
        "(it failed before its first turn ended, or retention removed its checkpoints)"
    )
    first_seq: int = Field(ge=1, description="seq of the new run's `run.started` event")


class ApprovalList(_Shape):
    approvals: list[Approval]


class ApprovalEnvelope(_Shape):
    approval: Approval


class ThreadList(_Shape):
    threads: list[ThreadSummary]


class ThreadEnvelope(_Shape):
    thread: ThreadSummary


class ThreadChangeRequest(BaseModel):
    """At least one of the two; a field left out is kept."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"minProperties": 1})
    title: Annotated[str, Field(max_length=MAX_TITLE_CHARS, pattern=TITLE_PATTERN)] | Absent = (
        Field(
            None,
            description="the new title: at most 200 characters, with something besides white "
            "space; put on one line (runs of white space become one space)",
        )
    )
    archived: bool | Absent = Field(None, description="true archives, false brings back")


class ThreadDeleted(_Shape):
    thread_id: str
    deleted: Literal[True]


class EventPage(_Shape):
    events: list[EventFrameValue] = Field(description="the same `event` frames the WebSocket sends")
    head_seq: int = Field(ge=0)
    epoch: str
    truncated_seq: int = Field(ge=0, description="the last seq retention removed (0: none)")


class RunView(_Shape):
    run_id: str
    thread_id: str
    status: RunStatus
    agent: str
    graph_version: str
    checkpoint_version: int
    pending_approvals: list[Approval]
    error: RunError | None
    usage: TokenUsage | None = Field(
        description="the tokens of the model calls logged so far (`model.usage` summed, with "
        "`requests`); null before any"
    )


class RunEnvelope(_Shape):
    run: RunView


class AuditEntry(_Shape):
    audit_id: int
    at: Timestamp
    tenant: str | None
    actor: str | None
    action: AuditAction
    outcome: Outcome
    target: str | None
    source: str | None
    details: dict[str, Any]


class AuditPage(_Shape):
    audit: list[AuditEntry]
    next_after_id: int | None = Field(
        description="pass as `after_id` for the next page; null when this page is the last"
    )


class ApiDocument(_Shape):
    """An OpenAPI 3.1 or AsyncAPI 3.0 document."""


HTTP_BODIES: tuple[type[BaseModel], ...] = (
    ErrorBody,
    Health,
    Readiness,
    DevTokenRequest,
    DevTokenAvailability,
    DevToken,
    DecisionRequest,
    RunStartRequest,
    RunStarted,
    InputRequest,
    InputAccepted,
    RegenerateRequest,
    Regenerated,
    Retried,
    ApprovalList,
    ApprovalEnvelope,
    ThreadList,
    ThreadEnvelope,
    ThreadChangeRequest,
    ThreadDeleted,
    EventPage,
    RunEnvelope,
    AuditPage,
    ApiDocument,
    WebhookMessage,
    WebhookDecisionData,
)


# --- code lists ---------------------------------------------------------------------------


def error_codes() -> list[str]:
    """Every code an `error` frame or an HTTP error body can carry."""
    return [str(code) for code in ErrorCode]


def error_code_schema() -> dict[str, Any]:
    lines = [f"- `{code}` ({_error_facts(rule)}): {rule.meaning}" for code, rule in ERRORS.items()]
    return {
        "type": "string",
        "enum": error_codes(),
        "description": "Error codes: the HTTP status, whether a retry may pass, and the WebSocket "
        "close code when the error ends a connection:\n" + "\n".join(lines),
    }


def _error_facts(rule: ErrorRule) -> str:
    facts = [f"HTTP {int(rule.http_status)}"]
    if rule.retryable:
        facts.append("retryable")
    if rule.close_code is not None:
        facts.append(f"closes with {int(rule.close_code)}")
    return ", ".join(facts)


def event_frame_schema() -> dict[str, Any]:
    """One `event` frame; `oneOf` pins each event name to the shape of its `data`."""
    models = event_data_models()
    return {
        "type": "object",
        "description": "One entry of a thread's log. For one subscription events arrive in "
        "`seq` order with no gaps and no repeats; an event is sent only once stored. Events the "
        "connection's hello asked to `omit` are left out: the frame after them carries "
        "`prev_seq`.",
        "required": ["type", "thread_id", "seq", "run_id", "event", "ts", "data"],
        "properties": {
            "type": {"const": "event"},
            "thread_id": {"type": "string"},
            "seq": {"type": "integer", "minimum": 1},
            "run_id": {"type": ["string", "null"]},
            "event": ref("EventType"),
            "ts": {"type": "string", "pattern": TIMESTAMP_PATTERN},
            "data": {"type": "object"},
            "prev_seq": {
                "type": "integer",
                "minimum": 0,
                "description": "only after omitted events: the seq of the frame this "
                "subscription sent before this one (or its cursor)",
            },
        },
        "additionalProperties": True,
        "oneOf": [
            {
                "properties": {
                    "event": {"const": name},
                    "data": ref(models[name].__name__),
                }
            }
            for name in event_names()
            if name in models
        ],
    }


def component_schemas(models: Iterable[type[BaseModel]]) -> dict[str, dict[str, Any]]:
    """`#/components/schemas` for these models, every model they use, the event data models
    and the hand-written schemas (`ErrorCode`, `EventType`, `EventFrame`), tidied."""
    every = [*models, *dict.fromkeys(event_data_models().values())]
    _, top = models_json_schema(
        [(model, "validation") for model in dict.fromkeys(every)], ref_template=REF + "{model}"
    )
    schemas = {name: tidy(schema) for name, schema in top.get("$defs", {}).items()}
    schemas["ErrorCode"] = error_code_schema()
    schemas["EventType"] = {"type": "string", "enum": event_names()}
    schemas["EventFrame"] = event_frame_schema()
    return dict(sorted(schemas.items()))


def tidy(schema: Any) -> Any:
    """Drop what pydantic adds that only clutters a published document.

    Property titles repeat the property name, and a `null` default on an optional key only
    says that the key may be absent, which `required` already says.
    """
    if isinstance(schema, list):
        return [tidy(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    if _LATER in schema:
        return ref(schema[_LATER])
    cleaned = {key: tidy(value) for key, value in schema.items()}
    if "default" in cleaned and cleaned["default"] is None:
        del cleaned["default"]
    properties = cleaned.get("properties")
    if isinstance(properties, dict):
        for value in properties.values():
            if isinstance(value, dict):
                value.pop("title", None)
    return cleaned
