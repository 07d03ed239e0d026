"""The OpenAPI 3.1 document of the HTTP API (`gateway.transport.http_api`, docs/protocol.md §8).

Written as data next to the shapes it uses, and checked against the code by tests: every route
the app serves must be here and the other way round, schemathesis drives a real server with it,
and the responses must match what it says.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gateway.protocol.error_codes import ERRORS, ErrorCode
from gateway.protocol.frames import MAX_ID_CHARS, OMITTABLE, PROTOCOL_VERSION
from gateway.specs.shapes import HTTP_BODIES, component_schemas, ref, webhook_data_models
from gateway.transport.http_api import (
    DEV_TOKEN_TTL_S,
    MAX_AUDIT_PAGE,
    MAX_AUDIT_TEXT,
    MAX_DEV_TOKEN_TTL_S,
    MAX_EVENTS_PAGE,
    MIN_DEV_TOKEN_TTL_S,
)
from gateway.transport.json_body import MAX_BODY_BYTES

OPENAPI_PATH = "/v1/openapi.json"
ASYNCAPI_PATH = "/v1/asyncapi.json"
# http_api's upper bound for `after_seq` and `after_id`.
MAX_AFTER = 2**62

JSON = "application/json"
# `omit`: one or more of the kinds a hello may omit, comma-separated.
_OMIT_KIND = "|".join(sorted(OMITTABLE))
OMIT_PATTERN = f"^({_OMIT_KIND})(,({_OMIT_KIND}))*$"

# What each code the HTTP API answers with means there (`unsupported_protocol` belongs to the
# WebSocket's hello). Their statuses are gateway.protocol.error_codes.ERRORS'.
HTTP_ERRORS: Mapping[ErrorCode, str] = MappingProxyType(
    {
        ErrorCode.BAD_REQUEST: "a malformed body or an invalid parameter",
        ErrorCode.UNAUTHORIZED: "the bearer token is missing or invalid",
        ErrorCode.FORBIDDEN: "the caller's roles do not allow this (same tenant)",
        ErrorCode.NOT_FOUND: "no such object in the caller's tenant",
        ErrorCode.CONFLICT: "the request does not fit the state",
        ErrorCode.GRAPH_MISMATCH: "the run's checkpoint was written by an agent graph version "
        "the registry does not accept",
        ErrorCode.RATE_LIMITED: "over a limit; `retry_after_s` says when a retry is admitted",
        ErrorCode.TOO_LARGE: f"the request body is over {MAX_BODY_BYTES} bytes",
        ErrorCode.UNSUPPORTED_MEDIA_TYPE: "the body is not sent as `application/json`",
        ErrorCode.UNAVAILABLE: "storage (or the identity provider's keys) could not be reached; "
        "nothing was changed, retry later",
        ErrorCode.INTERNAL: "an unexpected server error (logged with its traceback)",
    }
)


def error_responses() -> dict[int, tuple[str, str]]:
    """Status -> (component name, description): one reusable response per status, named after
    the first of its codes in ERRORS."""
    codes_of: dict[int, list[ErrorCode]] = {}
    for code, rule in ERRORS.items():
        if code in HTTP_ERRORS:
            codes_of.setdefault(int(rule.http_status), []).append(code)
    return {
        status: (
            "".join(part.capitalize() for part in codes[0].split("_")),
            "; ".join(f"`{code}`: {HTTP_ERRORS[code]}" for code in codes),
        )
        for status, codes in sorted(codes_of.items())
    }


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agents-ws-gateway HTTP API",
            "version": str(PROTOCOL_VERSION),
            "summary": "Health, development tokens, the reviewer API, event logs and audit.",
            "description": (
                "The HTTP side of the gateway; the WebSocket protocol at `/v1/ws` is described "
                f"by the AsyncAPI document at `{ASYNCAPI_PATH}`. Prose reference: "
                "docs/protocol.md. Every error body is "
                '`{"error": {"code": "...", "message": "..."}}` with the status that matches '
                "`code`. Paths that no route claims are served from the browser demo's static "
                "files (plain-text 404 when there is no such file)."
            ),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "health", "description": "Liveness and readiness probes"},
            {"name": "tokens", "description": "Development tokens (no GATEWAY_SECRET only)"},
            {"name": "approvals", "description": "The reviewer API"},
            {"name": "threads", "description": "Threads and their event logs"},
            {"name": "runs", "description": "Run status"},
            {"name": "audit", "description": "The tenant's audit trail (admins)"},
            {"name": "specs", "description": "These API documents"},
            {
                "name": "ai-sdk",
                "description": "The Vercel AI SDK's chat transport, useChat (docs/protocol.md §11)",
            },
            {
                "name": "ag-ui",
                "description": "AG-UI and CopilotKit's runtime routes (docs/protocol.md §12)",
            },
            {
                "name": "webhooks",
                "description": "What the gateway POSTs to GATEWAY_WEBHOOK_URL (docs/protocol.md "
                "§10)",
            },
        ],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "webhooks": _webhooks(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": (
                        "A gateway token: an HS256 JWT signed with GATEWAY_SECRET (or an RS256/"
                        "ES256 JWT from the configured JWKS) with claims `sub`, `tenant`, `exp` "
                        "and `roles` (user, reviewer, viewer, admin)."
                    ),
                }
            },
            "responses": {
                name: {"description": text, "content": {JSON: {"schema": ref("ErrorBody")}}}
                for name, text in error_responses().values()
            },
            "schemas": component_schemas(HTTP_BODIES),
        },
    }


def _paths() -> dict[str, dict[str, Any]]:
    return {
        "/healthz": {
            "get": _operation(
                "healthz",
                "The process is up",
                tag="health",
                public=True,
                ok=("always, while the process runs", "Health"),
                errors=(),
            )
        },
        "/readyz": {
            "get": _operation(
                "readyz",
                "Storage is reachable and can be written",
                tag="health",
                public=True,
                ok=("the database answers", "Readiness"),
                errors=(),
                extra={
                    "503": {
                        "description": "the database does not answer or cannot be written",
                        "content": {JSON: {"schema": ref("Readiness")}},
                    }
                },
            )
        },
        "/v1/dev/token": {
            "post": _operation(
                "issueDevToken",
                "Issue a development token",
                description=(
                    "Enabled only while GATEWAY_SECRET is unset (development mode, loopback "
                    "only); otherwise 404. `tenant` defaults to `demo`, `roles` to "
                    '`["user"]`. The token is valid for `ttl_s` seconds '
                    f"({MIN_DEV_TOKEN_TTL_S} to {MAX_DEV_TOKEN_TTL_S}, default "
                    f"{DEV_TOKEN_TTL_S}: one hour)."
                ),
                tag="tokens",
                public=True,
                body="DevTokenRequest",
                ok=("a signed token", "DevToken"),
                errors=(400, 404, 413, 415, 500),
                notes={404: "GATEWAY_SECRET is set: development tokens are off"},
            ),
            "get": _operation(
                "devTokensAvailable",
                "Whether development tokens are handed out",
                description=(
                    "`available`: whether `POST /v1/dev/token` issues tokens (development "
                    "mode). Always 200, so a sign-in page can ask without an error."
                ),
                tag="tokens",
                public=True,
                ok=("whether development tokens are on", "DevTokenAvailability"),
                errors=(500,),
            ),
        },
        "/v1/approvals": {
            "get": _operation(
                "listPendingApprovals",
                "The tenant's pending approvals",
                description="Reviewers and admins. Oldest first, at most 500.",
                tag="approvals",
                parameters=[
                    _query(
                        "status",
                        {"type": "string", "enum": ["pending"], "default": "pending"},
                        "only `pending` is supported",
                    )
                ],
                ok=("the pending approvals", "ApprovalList"),
                errors=(400, 401, 403, 500, 503),
                notes={403: "the caller is neither a reviewer nor an admin"},
            )
        },
        "/v1/approvals/stream": {
            "get": _operation(
                "streamInbox",
                "The tenant's approval inbox as Server-Sent Events",
                description=(
                    "`inbox.subscribe` over HTTP, for reviewers and admins: `event: inbox` "
                    "with the `inbox` frame (the pending approvals), then `event: "
                    "inbox.update` with each `inbox.update` frame; a `: heartbeat` comment "
                    "every GATEWAY_HEARTBEAT_S. A reconnect gets a fresh `inbox`."
                ),
                tag="approvals",
                ok=("the feed (`text/event-stream`), open until the client leaves", "ApprovalList"),
                errors=(401, 403, 429, 500, 503),
                notes={
                    403: "the caller is neither a reviewer nor an admin",
                    429: "over GATEWAY_MAX_CONNECTIONS_PER_USER (WebSockets and feeds)",
                },
                stream=True,
            )
        },
        "/v1/approvals/{approval_id}/decision": {
            "post": _operation(
                "decideApproval",
                "Approve or reject a pending tool call",
                description=(
                    "Same rules and effects as the WebSocket's `approval.decide`. The answer "
                    "comes once the decision is stored; the run continues in the background."
                ),
                tag="approvals",
                parameters=[_path_id("approval_id")],
                body="DecisionRequest",
                ok=("the decided approval", "ApprovalEnvelope"),
                errors=(400, 401, 403, 404, 409, 413, 415, 500, 503),
                notes={
                    409: "already decided, superseded or expired (`conflict`), or the run's "
                    "checkpoint was written by an unaccepted graph version (`graph_mismatch`)"
                },
            )
        },
        "/v1/threads": {
            "get": _operation(
                "listThreads",
                "Threads the caller can see, newest first",
                description=(
                    "Users see the threads they own; reviewers, viewers and admins see every "
                    "thread of the tenant."
                ),
                tag="threads",
                parameters=[_limit(100, 500), _archived()],
                ok=("the threads", "ThreadList"),
                errors=(400, 401, 403, 500, 503),
                notes={403: "the token has none of the four roles"},
            )
        },
        "/v1/threads/stream": {
            "get": _operation(
                "streamThreads",
                "The caller's thread list as Server-Sent Events",
                description=(
                    "`threads.subscribe` over HTTP: `event: threads` with the `threads` frame "
                    "(the list as `GET /v1/threads` gives it, up to 500), then `event: "
                    "threads.update` with each `threads.update` frame (changed threads, and "
                    "the ids of those that left the list); `event: threads` again replaces "
                    "the list. A `: heartbeat` comment every GATEWAY_HEARTBEAT_S. A reconnect "
                    "gets a fresh list."
                ),
                tag="threads",
                parameters=[_archived()],
                ok=("the feed (`text/event-stream`), open until the client leaves", "ThreadList"),
                errors=(400, 401, 403, 429, 500, 503),
                notes={
                    403: "the token has none of the four roles",
                    429: "over GATEWAY_MAX_CONNECTIONS_PER_USER (WebSockets and feeds)",
                },
                stream=True,
            )
        },
        "/v1/threads/{thread_id}": {
            "get": _operation(
                "getThread",
                "One thread as lists show it",
                description="Same access as subscribing.",
                tag="threads",
                parameters=[_path_id("thread_id")],
                ok=("the thread", "ThreadEnvelope"),
                errors=(401, 403, 404, 500, 503),
            ),
            "patch": _operation(
                "changeThread",
                "Rename a thread, archive it or bring it back",
                description=(
                    "The thread's owner or an admin, as the WebSocket's `thread.update`. "
                    "Audited (`thread.renamed`, `thread.archived`, `thread.unarchived`); "
                    "every live thread list hears of it."
                ),
                tag="threads",
                parameters=[_path_id("thread_id")],
                body="ThreadChangeRequest",
                ok=("the thread after", "ThreadEnvelope"),
                errors=(400, 401, 403, 404, 413, 415, 500, 503),
            ),
            "delete": _operation(
                "deleteThread",
                "Delete a thread",
                description=(
                    "The thread's owner or an admin, as the WebSocket's `thread.delete`, once "
                    "the thread has no active run. Its event log, checkpoints, waiting input "
                    "and agent history are removed; its runs, the approvals with their "
                    "decisions, the operation ledger and the audit trail are kept, as "
                    "retention keeps them. Audited (`thread.deleted`); the thread is "
                    "`not_found` from then on."
                ),
                tag="threads",
                parameters=[_path_id("thread_id")],
                ok=("the thread is deleted", "ThreadDeleted"),
                errors=(401, 403, 404, 409, 500, 503),
                notes={409: "the thread has an active run: cancel it first"},
            ),
        },
        "/v1/threads/{thread_id}/events": {
            "get": _operation(
                "readThreadEvents",
                "A page of a thread's event log",
                description=(
                    "Same access as subscribing. Events with `seq > after_seq`, oldest first, "
                    "as the same `event` frames the WebSocket sends. Page with `after_seq` set "
                    "to the last `seq` received until `events` is empty."
                ),
                tag="threads",
                parameters=[
                    _path_id("thread_id"),
                    _query(
                        "after_seq",
                        {"type": "integer", "minimum": 0, "maximum": MAX_AFTER, "default": 0},
                        "return events after this seq",
                    ),
                    _limit(500, MAX_EVENTS_PAGE),
                ],
                ok=("the page", "EventPage"),
                errors=(400, 401, 403, 404, 500, 503),
            )
        },
        "/v1/threads/{thread_id}/stream": {
            "get": _operation(
                "streamThreadEvents",
                "A thread's events as Server-Sent Events",
                description=(
                    "`thread.subscribe` over HTTP: same access, same replay and live "
                    "guarantees. The first message is `event: subscribed` with the "
                    "`subscribed` frame (`reset: true` when the cursor does not fit the "
                    "thread: drop the view). Then every event with `seq` past the cursor, "
                    "once and in order, as a message with `id` = `seq` and the `event` frame "
                    "as its data; a `: heartbeat` comment every GATEWAY_HEARTBEAT_S. The "
                    "cursor is the `Last-Event-ID` header (sent by a reconnecting "
                    "EventSource), else `after_seq`."
                ),
                tag="threads",
                parameters=[
                    _path_id("thread_id"),
                    _query(
                        "after_seq",
                        {"type": "integer", "minimum": 0, "maximum": MAX_AFTER, "default": 0},
                        "stream events after this seq (ignored when Last-Event-ID is sent)",
                    ),
                    _query(
                        "epoch",
                        {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                        "the epoch the cursor belongs to; another epoch means `reset`",
                    ),
                    _query(
                        "omit",
                        {"type": "string", "pattern": OMIT_PATTERN},
                        "added events to leave out, comma-separated: `reasoning`, `usage`; the "
                        "event after omitted ones carries `prev_seq`",
                    ),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "the last `seq` received; resume after it",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_AFTER},
                    },
                ],
                ok=("the feed (`text/event-stream`), open until the client leaves", "EventPage"),
                errors=(400, 401, 403, 404, 429, 500, 503),
                notes={429: "over GATEWAY_MAX_CONNECTIONS_PER_USER (WebSockets and feeds)"},
                stream=True,
            )
        },
        "/v1/runs": {
            "post": _operation(
                "startRun",
                "Start a run (and its thread when none is named)",
                description=(
                    "The WebSocket's `run.start` over HTTP: same validation, access rules, "
                    "run-start limit and errors. The answer comes once the run is stored; "
                    "follow it on `GET /v1/threads/{thread_id}/stream` from `first_seq - 1`."
                ),
                tag="runs",
                body="RunStartRequest",
                ok=("the run has started", "RunStarted"),
                errors=(400, 401, 403, 404, 409, 413, 415, 429, 500, 503),
                notes={429: "over GATEWAY_RUNS_PER_MINUTE (`retry_after_s` in the body)"},
            )
        },
        "/v1/threads/{thread_id}/input": {
            "post": _operation(
                "sendInput",
                "Send input to a thread",
                description=(
                    "The WebSocket's `run.input` over HTTP: starts a run on an idle thread, "
                    "else stages or queues the input on the active run."
                ),
                tag="runs",
                parameters=[_path_id("thread_id")],
                body="InputRequest",
                ok=("what became of the input", "InputAccepted"),
                errors=(400, 401, 403, 404, 409, 413, 415, 429, 500, 503),
                notes={429: "over the run-start or pending-input limit"},
            )
        },
        "/v1/threads/{thread_id}/regenerate": {
            "post": _operation(
                "regenerate",
                "A new answer to the thread's last input, or to an edit of it",
                description=(
                    "The WebSocket's `run.regenerate` over HTTP: a new run that supersedes the "
                    "thread's last one (finished), its history going back to where that run "
                    "began."
                ),
                tag="runs",
                parameters=[_path_id("thread_id")],
                body="RegenerateRequest",
                ok=("the new run", "Regenerated"),
                errors=(400, 401, 403, 404, 409, 413, 415, 429, 500, 503),
                notes={409: "the thread's run is active, it has none, or `run_id` is not its last"},
            )
        },
        "/v1/runs/{run_id}/retry": {
            "post": _operation(
                "retryRun",
                "A failed run, retried from its last checkpoint in a new run",
                description=(
                    "The WebSocket's `run.retry` over HTTP: a new run on the same thread that "
                    "answers the failed run's input from its last checkpoint, so only the turn "
                    "it failed in is repeated; side effects the failed run made are not made "
                    "again. The request needs no body."
                ),
                tag="runs",
                parameters=[_path_id("run_id")],
                ok=("the new run", "Retried"),
                errors=(400, 401, 403, 404, 409, 429, 500, 503),
                notes={
                    409: "the run did not fail, it is not the thread's last, or the thread's "
                    "run is active"
                },
            )
        },
        "/v1/runs/{run_id}": {
            "get": _operation(
                "getRun",
                "A run's status and pending approvals",
                description="Same access as subscribing to the run's thread.",
                tag="runs",
                parameters=[_path_id("run_id")],
                ok=("the run", "RunEnvelope"),
                errors=(401, 403, 404, 500, 503),
            )
        },
        "/v1/audit": {
            "get": _operation(
                "listAudit",
                "A page of the tenant's audit trail",
                description=(
                    "Admins only. Entries in `audit_id` order; pass `next_after_id` as "
                    "`after_id` for the next page."
                ),
                tag="audit",
                parameters=[
                    _query("action", _audit_text(), "only entries of this action"),
                    _query("actor", _audit_text(), "only entries by this user"),
                    _query("target", _audit_text(), "only entries about this object id"),
                    _query(
                        "since",
                        {"type": "string", "format": "date-time"},
                        "ISO 8601 (UTC without an offset); entries at or after this time",
                    ),
                    _query(
                        "until",
                        {"type": "string", "format": "date-time"},
                        "ISO 8601 (UTC without an offset); entries before this time; must be "
                        "later than `since`",
                    ),
                    _query(
                        "after_id",
                        {"type": "integer", "minimum": 0, "maximum": MAX_AFTER, "default": 0},
                        "entries with a larger `audit_id`",
                    ),
                    _limit(100, MAX_AUDIT_PAGE),
                ],
                ok=("the page", "AuditPage"),
                errors=(400, 401, 403, 500, 503),
                notes={403: "the caller is not an admin"},
            )
        },
        **_ai_sdk_paths(),
        **_ag_ui_paths(),
        OPENAPI_PATH: {
            "get": _operation(
                "getOpenApiDocument",
                "This document",
                tag="specs",
                public=True,
                ok=("OpenAPI 3.1", "ApiDocument"),
                errors=(),
            )
        },
        ASYNCAPI_PATH: {
            "get": _operation(
                "getAsyncApiDocument",
                "The AsyncAPI 3.0 document of the WebSocket protocol",
                tag="specs",
                public=True,
                ok=("AsyncAPI 3.0", "ApiDocument"),
                errors=(),
            )
        },
    }


def _ai_sdk_paths() -> dict[str, dict[str, Any]]:
    """useChat's HTTP transport (gateway/frontends/ai_sdk/http.py)."""
    chat_id = {**_path_id("chat_id"), "description": "useChat's chat id, the thread's id"}
    stream = {
        "description": "the UI message stream: one chunk per `data:` line, ending with "
        "`data: [DONE]` (header `x-vercel-ai-ui-message-stream: v1`)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    request = {
        "type": "object",
        "description": "useChat's request body; only the newest message is used: a user "
        "message's text, or an assistant message's `approval-responded` tool parts",
        "required": ["id", "messages"],
        "properties": {
            "id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
            "messages": {"type": "array", "items": {"type": "object"}, "minItems": 1},
            "trigger": {"enum": ["submit-message", "regenerate-message"]},
            "messageId": {"type": "string"},
        },
    }
    send = _operation(
        "aiSdkChat",
        "A useChat request: a new message, or answers to its approvals",
        description="Streams the chat's assistant message; a pause on calls the caller decides "
        "ends it with `finish` (`tool-calls`), one a reviewer decides keeps it open.",
        tag="ai-sdk",
        ok=("", "ErrorBody"),
        errors=(400, 401, 403, 404, 409, 413, 415, 429, 500, 503),
        notes={429: "over the run-start limit or GATEWAY_MAX_CONNECTIONS_PER_USER"},
    )
    send["requestBody"] = {"required": True, "content": {JSON: {"schema": request}}}
    send["responses"]["200"] = stream
    resume = _operation(
        "aiSdkResumeStream",
        "resumeStream(): the active response from its start, then live",
        tag="ai-sdk",
        parameters=[chat_id],
        ok=("", "ErrorBody"),
        errors=(400, 401, 403, 404, 429, 500, 503),
    )
    resume["responses"]["200"] = stream
    resume["responses"]["204"] = {"description": "nothing is active"}
    stop = _operation(
        "aiSdkStop",
        "Cancel the chat's active run",
        tag="ai-sdk",
        parameters=[chat_id],
        ok=("", "ErrorBody"),
        errors=(400, 401, 403, 404, 409, 500, 503),
    )
    stop["responses"]["200"] = {
        "description": "whether a run was active (and is now cancelled), and which",
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["stopped", "run_id"],
                    "properties": {
                        "stopped": {"type": "boolean"},
                        "run_id": {"type": ["string", "null"]},
                    },
                }
            }
        },
    }
    messages = _operation(
        "aiSdkMessages",
        "The chat's past as UIMessages",
        tag="ai-sdk",
        parameters=[chat_id],
        ok=("", "ErrorBody"),
        errors=(401, 403, 404, 500, 503),
    )
    messages["responses"]["200"] = {
        "description": "per run, the user's input and the assistant message",
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
                }
            }
        },
    }
    return {
        "/v1/ai-sdk/chat": {"post": send},
        "/v1/ai-sdk/chat/{chat_id}/stream": {"get": resume},
        "/v1/ai-sdk/chat/{chat_id}/stop": {"post": stop},
        "/v1/ai-sdk/chat/{chat_id}/messages": {"get": messages},
    }


def _ag_ui_paths() -> dict[str, dict[str, Any]]:
    """AG-UI's run, connect and stop (gateway/frontends/ag_ui/http.py), and the same under
    CopilotKit's runtime paths with its `/info`."""
    graph = {
        "name": "graph",
        "in": "path",
        "required": True,
        "description": "the agent graph's name (unknown: 404)",
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
    }
    client_id = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
    run_input = {
        "type": "object",
        "description": "AG-UI's RunAgentInput (protocol 1.0; unknown members are ignored). Of "
        "`messages` only the newest user message is used; `resume` answers the interrupts of "
        "the conversation's newest pause instead.",
        "required": ["threadId", "runId", "messages"],
        "properties": {
            "threadId": client_id,
            "runId": client_id,
            "protocolVersion": {"type": "string"},
            "messages": {"type": "array", "items": {"type": "object"}},
            "resume": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["interruptId", "status"],
                    "properties": {
                        "interruptId": {"type": "string"},
                        "status": {"enum": ["resolved", "cancelled"]},
                        "payload": {},
                    },
                },
            },
            "tools": {"type": "array"},
            "context": {"type": "array"},
            "state": {},
            "forwardedProps": {},
        },
    }
    stream = {
        "description": "AG-UI events as LF-framed Server-Sent Events, each with `id:` the seq "
        "of the stored event it comes from",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    errors = (400, 401, 403, 404, 409, 413, 415, 429, 500, 503)

    def post(operation_id: str, summary: str, description: str, **kwargs: Any) -> dict[str, Any]:
        operation = _operation(
            operation_id,
            summary,
            description=description,
            tag="ag-ui",
            ok=("", "ErrorBody"),
            errors=errors,
            notes={429: "over the run-start limit or GATEWAY_MAX_CONNECTIONS_PER_USER"},
            **kwargs,
        )
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": run_input}}}
        operation["responses"]["200"] = stream
        return operation

    def run(operation_id: str) -> dict[str, Any]:
        return post(
            operation_id,
            "Run an AG-UI agent: a new message, or the answers to its interrupts",
            "Streams the AG-UI run asked for; a pause ends it with an `interrupt` outcome, "
            "one interrupt per pending approval.",
            parameters=[graph],
        )

    def connect(operation_id: str) -> dict[str, Any]:
        cursor = {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": "the seq of the last event applied (or `forwardedProps.lastEventId`)",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_AFTER},
        }
        return post(
            operation_id,
            "Follow an AG-UI conversation from a cursor",
            "From a run boundary, the log's tail; from inside a run, a prelude re-opening it; "
            "then live until the thread is quiet. Nothing to send: 200 with an empty body.",
            parameters=[graph, cursor],
        )

    def stop(operation_id: str) -> dict[str, Any]:
        operation = _operation(
            operation_id,
            "Cancel the conversation's active run",
            tag="ag-ui",
            parameters=[graph, {**_path_id("thread_id"), "description": "the threadId"}],
            ok=("", "ErrorBody"),
            errors=(400, 401, 403, 404, 409, 413, 415, 500, 503),
        )
        operation["requestBody"] = {
            "required": False,
            "content": {JSON: {"schema": {"type": "object", "properties": {"runId": {}}}}},
        }
        operation["responses"]["200"] = {
            "description": "whether a run was active (and is now cancelled)",
            "content": {
                JSON: {
                    "schema": {
                        "type": "object",
                        "required": ["stopped"],
                        "properties": {"stopped": {"type": "boolean"}},
                    }
                }
            },
        }
        return operation

    info = _operation(
        "copilotKitRuntimeInfo",
        "CopilotKit's runtime description of the gateway's agents",
        tag="ag-ui",
        ok=("", "ErrorBody"),
        errors=(401, 500, 503),
    )
    info["responses"]["200"] = {
        "description": "CopilotKit's RuntimeInfo (SSE mode)",
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["version", "agents", "audioFileTranscriptionEnabled", "mode"],
                    "properties": {
                        "version": {"type": "string"},
                        "agents": {"type": "object"},
                        "audioFileTranscriptionEnabled": {"type": "boolean"},
                        "mode": {"const": "sse"},
                    },
                }
            }
        },
    }
    single = _operation(
        "copilotKitSingleRoute",
        "CopilotKit's single-route transport",
        description="`method` `info`, `agent/run`, `agent/connect` or `agent/stop`, with "
        "`params.agentId` (and `params.threadId` for a stop) and the RunAgentInput as `body`; "
        "answered as the matching route is.",
        tag="ag-ui",
        ok=("", "ErrorBody"),
        errors=errors,
    )
    single["requestBody"] = {
        "required": True,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["method"],
                    "properties": {
                        "method": {"enum": ["info", "agent/run", "agent/connect", "agent/stop"]},
                        "params": {
                            "type": "object",
                            "properties": {
                                "agentId": {"type": "string"},
                                "threadId": {"type": "string"},
                            },
                        },
                        "body": {"type": "object"},
                    },
                }
            }
        },
    }
    single["responses"]["200"] = {
        "description": "the stream of a run or connect, or the JSON of info and stop",
        "content": {
            "text/event-stream": {"schema": {"type": "string"}},
            JSON: {"schema": {"type": "object"}},
        },
    }
    return {
        "/v1/copilotkit": {"post": single},
        "/v1/ag-ui/{graph}": {"post": run("agUiRun")},
        "/v1/ag-ui/{graph}/connect": {"post": connect("agUiConnect")},
        "/v1/ag-ui/{graph}/stop/{thread_id}": {"post": stop("agUiStop")},
        "/v1/copilotkit/info": {"get": info},
        "/v1/copilotkit/agent/{graph}/run": {"post": run("copilotKitRun")},
        "/v1/copilotkit/agent/{graph}/connect": {"post": connect("copilotKitConnect")},
        "/v1/copilotkit/agent/{graph}/stop/{thread_id}": {"post": stop("copilotKitStop")},
    }


def _webhooks() -> dict[str, dict[str, Any]]:
    """One operation per webhook type: the request the gateway sends, signed."""

    def header(name: str, description: str) -> dict[str, Any]:
        return {
            "name": name,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": description,
        }

    headers = [
        header("Webhook-Id", "the message id (also `id`): receivers dedupe on it"),
        header("Webhook-Timestamp", "Unix seconds when this attempt was signed"),
        header(
            "Webhook-Signature",
            "`v1=` and the hex HMAC-SHA256, keyed with GATEWAY_WEBHOOK_SECRET, of "
            "`{Webhook-Timestamp}.{body}`; several may be sent, space-separated",
        ),
    ]
    return {
        type_: {
            "post": {
                "operationId": "webhook_" + type_.replace(".", "_"),
                "summary": f"`{type_}`",
                "tags": ["webhooks"],
                "security": [],
                "parameters": headers,
                "requestBody": {
                    "required": True,
                    "content": {
                        JSON: {
                            "schema": {
                                "allOf": [
                                    ref("WebhookMessage"),
                                    {
                                        "properties": {
                                            "type": {"const": type_},
                                            "data": ref(model.__name__),
                                        }
                                    },
                                ]
                            }
                        }
                    },
                },
                "responses": {
                    "2XX": {"description": "delivered"},
                    "default": {"description": "any other answer, or none in time: retried"},
                },
            }
        }
        for type_, model in webhook_data_models().items()
    }


_ARCHIVED_SCHEMA = {"type": "string", "enum": ["false", "true"], "default": "false"}


def _archived() -> dict[str, Any]:
    return _query("archived", _ARCHIVED_SCHEMA, "`true`: the archived threads instead")


def _operation(
    operation_id: str,
    summary: str,
    *,
    tag: str,
    ok: tuple[str, str],
    errors: tuple[int, ...],
    description: str | None = None,
    public: bool = False,
    parameters: list[dict[str, Any]] | None = None,
    body: str | None = None,
    notes: dict[int, str] | None = None,
    extra: dict[str, Any] | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": [tag]}
    if description:
        operation["description"] = description
    if public:
        operation["security"] = []
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": ref(body)}},
        }
    responses: dict[str, Any] = {
        "200": {"description": ok[0], "content": {JSON: {"schema": ref(ok[1])}}}
    }
    if stream:
        responses["200"]["content"] = {
            "text/event-stream": {
                "schema": {"type": "string"},
                "x-sse-data": "each message's data is a frame: `subscribed`, then `event`",
            }
        }
    responses_of = error_responses()
    for status in errors:
        name, _ = responses_of[status]
        response: dict[str, Any] = {"$ref": f"#/components/responses/{name}"}
        if notes and status in notes:
            response["description"] = notes[status]
        responses[str(status)] = response
    responses.update(extra or {})
    operation["responses"] = dict(sorted(responses.items()))
    return operation


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _audit_text() -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": MAX_AUDIT_TEXT}


def _limit(default: int, high: int) -> dict[str, Any]:
    return _query(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": high, "default": default},
        f"at most this many entries (1-{high})",
    )


def _path_id(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": "an opaque id; anything unknown (or longer than "
        f"{MAX_ID_CHARS} characters) is 404",
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
    }
