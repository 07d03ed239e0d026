"""AG-UI's `RunAgentInput` as the gateway takes it (docs/protocol.md §12).

The body is validated with the `ag-ui-protocol` models (unknown members are ignored); of the
messages only the newest user message is used, since the conversation's history is the
gateway's own; `resume` entries become decisions on the approvals they answer. Anything that
cannot be used is `bad_request` naming the field, before anything happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ag_ui.core import RunAgentInput, UserMessage
from pydantic import ValidationError

from gateway.frontends.ag_ui.events import Dialect
from gateway.frontends.conversation import Decision, conversation_id
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.frames import MAX_REASON_CHARS

# The cursor of a connect in `forwardedProps` (the client strips unknown top-level members).
CURSOR_PROP = "lastEventId"
MAX_CURSOR = 2**62
# The reason a rejection carries when the client abandoned the interrupt (`cancelled`).
CANCELLED_REASON = "The user cancelled this call."


@dataclass(frozen=True)
class NewMessage:
    message_id: str
    text: str


@dataclass(frozen=True)
class RunRequest:
    thread_id: str
    run_id: str
    dialect: Dialect
    newest_user: NewMessage | None
    resume: list[Decision] | None
    forwarded_props: Any


def parse_run_input(body: dict[str, Any]) -> RunRequest:
    try:
        parsed = RunAgentInput.model_validate(body)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in error["loc"]) for error in exc.errors()})
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"invalid RunAgentInput: {', '.join(fields[:3])}"
        ) from None
    thread_id = conversation_id(parsed.thread_id, "threadId")
    run_id = conversation_id(parsed.run_id, "runId")
    resume = None if parsed.resume is None else [_decision(entry) for entry in parsed.resume]
    return RunRequest(
        thread_id=thread_id,
        run_id=run_id,
        dialect=Dialect.of(parsed.protocol_version),
        newest_user=_newest_user(parsed),
        resume=resume,
        forwarded_props=parsed.forwarded_props,
    )


def _newest_user(parsed: RunAgentInput) -> NewMessage | None:
    for message in reversed(parsed.messages):
        if isinstance(message, UserMessage):
            return NewMessage(message.id, _text(message.content))
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if getattr(part, "type", None) != "text":
            raise GatewayError(
                ErrorCode.BAD_REQUEST, "only text content is supported in user messages"
            )
        texts.append(part.text)
    return "\n".join(texts)


def _decision(entry: Any) -> Decision:
    if entry.status == "cancelled":
        return Decision(entry.interrupt_id, approve=False, reason=CANCELLED_REASON, abandoned=True)
    payload = entry.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"resume entry {entry.interrupt_id}: payload.approved must be true or false",
        )
    edited = payload.get("editedArgs")
    if edited is not None and (not isinstance(edited, dict) or not payload["approved"]):
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"resume entry {entry.interrupt_id}: editedArgs must be an object, with approved true",
        )
    reason = payload.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"resume entry {entry.interrupt_id}: payload.reason must be a string of at most "
            f"{MAX_REASON_CHARS} characters",
        )
    return Decision(
        entry.interrupt_id, approve=payload["approved"], reason=reason, arguments=edited
    )


def cursor_of(header: str | None, forwarded_props: Any) -> int:
    """A connect's cursor: the `Last-Event-ID` header, else `forwardedProps.lastEventId`,
    else 0 (the thread from its start)."""
    raw: Any = header if header else None
    if raw is None and isinstance(forwarded_props, dict):
        raw = forwarded_props.get(CURSOR_PROP)
    if raw is None or raw == "":
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.isascii() and raw.isdigit():
        value = int(raw)
    else:
        raise GatewayError(ErrorCode.BAD_REQUEST, "Last-Event-ID must be a seq (an integer)")
    if not 0 <= value <= MAX_CURSOR:
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"Last-Event-ID must be between 0 and {MAX_CURSOR}"
        )
    return value
