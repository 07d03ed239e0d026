"""What every frontend adapter does to a conversation, written once: find or create the thread a
client names, start a run on it, decide the approvals it answers, and stop its run.

Frontend libraries choose a conversation's id before the server has seen it (useChat's chat id,
AG-UI's `threadId`), so an id unknown in the caller's tenant names a new thread owned by the
caller; another user's thread is refused as on the native protocol (`not_found` in another tenant,
`forbidden` inside it). Decisions go through the run lifecycle's own checks against the server's
pending approvals: nothing a client holds is trusted, and a batch of decisions is vetted whole
before the first is recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.auth.access import check_can_act_on_thread, check_can_subscribe
from gateway.protocol.error_codes import ErrorCode, GatewayError, not_found
from gateway.protocol.frames import MAX_ID_CHARS, MAX_REASON_CHARS
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.context import thread_ref
from gateway.run_lifecycle.manager import RunRecord, ThreadRecord
from gateway.run_lifecycle.started import Started

# Ids that frontend libraries make (nanoid, uuid, assistant-ui's local `__LOCALID_…`) and the
# gateway's own (`t_…`); nothing that would need escaping in a URL path or a log line, and no
# leading `.`, `:` or `-` (a dot segment, a scheme-like or option-like id).
CLIENT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")


@dataclass(frozen=True)
class Decision:
    approval_id: str
    approve: bool
    reason: str | None = None
    # Approve with these arguments instead of the call's (docs/protocol.md §4).
    arguments: dict[str, Any] | None = None
    # The client abandoned the call rather than deciding it (a rejection all the same): an
    # expiry has settled it as well.
    abandoned: bool = False


def conversation_id(raw: object, name: str = "id") -> str:
    """A client-chosen conversation id, or `bad_request` naming the field."""
    if not isinstance(raw, str) or not raw:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must be a non-empty string")
    if len(raw) > MAX_ID_CHARS or not CLIENT_ID.fullmatch(raw):
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"{name} must be 1-{MAX_ID_CHARS} letters, digits, '_', '.', ':' or '-'",
        )
    return raw


def input_text(services: Services, text: str) -> str:
    """The newest user message's text, within the native protocol's input rules."""
    if not text.strip():
        raise GatewayError(ErrorCode.BAD_REQUEST, "the newest message has no text")
    limit = services.settings.max_input_chars
    if len(text) > limit:
        raise GatewayError(ErrorCode.TOO_LARGE, f"input is longer than {limit} characters")
    return text


async def watched_thread(
    services: Services, principal: Principal, thread_id: str
) -> tuple[ThreadRecord, RunRecord | None]:
    """A thread the caller may watch, and its active run (None when idle)."""
    thread = await services.runs.authorize_subscribe(principal, thread_id)
    return thread, await services.runs.active_run(thread.thread_id)


async def existing_thread(
    services: Services, principal: Principal, thread_id: str
) -> ThreadRecord | None:
    """The thread, if it exists and the caller may watch it; None when no thread of that id
    exists anywhere (a conversation the client has not started yet)."""
    thread = await services.runs.threads.get(thread_id)
    if thread is None:
        return None
    if thread.tenant != principal.tenant:
        raise not_found("thread not found")
    check_can_subscribe(principal, thread_ref(thread))
    return thread


async def start_turn(
    services: Services, principal: Principal, thread_id: str, text: str, agent: str | None = None
) -> Started:
    """A run on the conversation (created when new) with the client's newest input."""

    def admit() -> None:
        services.limits.admit_run_start(principal.tenant, principal.user)

    return await services.runs.start_run(
        principal,
        thread_id=thread_id,
        text=input_text(services, text),
        agent=agent,
        on_disconnect="continue",
        admit=admit,
        create_missing=True,
    )


async def regenerate(
    services: Services,
    principal: Principal,
    thread_id: str,
    text: str | None = None,
    supersedes: str | None = None,
) -> Started:
    """A new answer to the conversation's last input (or to `text`, an edit of it), in a run
    that supersedes the last one (docs/protocol.md §4 `run.regenerate`)."""
    if await existing_thread(services, principal, thread_id) is None:
        raise not_found("thread not found")

    def admit() -> None:
        services.limits.admit_run_start(principal.tenant, principal.user)

    return await services.runs.regenerate(
        principal,
        thread_id,
        text=None if text is None else input_text(services, text),
        supersedes=supersedes,
        admit=admit,
    )


async def decide_all(
    services: Services,
    principal: Principal,
    decisions: list[Decision],
    *,
    thread_id: str | None = None,
) -> None:
    """Record every decision, or none when any would be refused: each is vetted against the
    server's own pending approvals (unknown, decided, superseded, expired or forged ids,
    reviewer roles, four-eyes) before the first is recorded. `thread_id`: the conversation the
    decisions were sent to, which every approval must belong to."""
    if not decisions:
        raise GatewayError(ErrorCode.BAD_REQUEST, "no approval is answered")
    seen: set[str] = set()
    for decision in decisions:
        if decision.approval_id in seen:
            raise GatewayError(
                ErrorCode.BAD_REQUEST, f"approval {decision.approval_id} is answered twice"
            )
        seen.add(decision.approval_id)
        if len(decision.approval_id) > MAX_ID_CHARS:
            raise not_found("approval not found")
        if decision.reason is not None and len(decision.reason) > MAX_REASON_CHARS:
            raise GatewayError(
                ErrorCode.BAD_REQUEST, f"reason is longer than {MAX_REASON_CHARS} characters"
            )
        await services.runs.decisions.vet(
            principal,
            decision.approval_id,
            _verb(decision),
            decision.arguments,
            thread_id=thread_id,
        )
    for decision in decisions:
        await services.runs.decisions.decide(
            principal, decision.approval_id, _verb(decision), decision.reason, decision.arguments
        )


async def check_repeated(
    services: Services, principal: Principal, decisions: list[Decision]
) -> None:
    """Answers sent again for approvals already settled: each must be the decision stored
    (`Decisions.vet_repeat`), else it is refused; nothing is recorded either way."""
    for decision in decisions:
        await services.runs.decisions.vet_repeat(
            principal,
            decision.approval_id,
            _verb(decision),
            decision.reason,
            decision.arguments,
            abandoned=decision.abandoned,
        )


def _verb(decision: Decision) -> str:
    return "approve" if decision.approve else "reject"


async def stop(
    services: Services, principal: Principal, thread_id: str, run_id: str | None = None
) -> str | None:
    """Cancel the conversation's active run (only `run_id` when given), with the gateway's
    cancel semantics, wherever it streams. The run cancelled, or None when nothing was active
    (stopping twice is harmless)."""
    thread = await services.runs.authorize_subscribe(principal, thread_id)
    check_can_act_on_thread(principal, thread_ref(thread))
    run = await services.runs.active_run(thread.thread_id)
    if run is None or (run_id is not None and run.run_id != run_id):
        return None
    try:
        await services.runs.cancel(principal, run.run_id)
    except GatewayError as exc:
        if exc.code is not ErrorCode.CONFLICT:
            raise
        # The run ended meanwhile (stopping what has ended is harmless); any other conflict
        # leaves it active and is the caller's to hear.
        still = await services.runs.active_run(thread.thread_id)
        if still is not None and still.run_id == run.run_id:
            raise
        return None
    return run.run_id
