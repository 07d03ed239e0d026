"""The wire protocol (docs/protocol.md §2-§6): client frames in, typed values out; server frames
out.

Pure on purpose: no sockets, no Starlette, no storage. The connection layer hands raw text to
`parse_client_frame` and sends what the builders return through `encode`, so every rule of the
contract is testable without a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

import annotated_types
import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from gateway.protocol.error_codes import ErrorCode, GatewayError

PROTOCOL_VERSION = 1
MAX_ID_CHARS = 64
MAX_REASON_CHARS = 4000
MAX_METADATA_BYTES = 8 * 1024
DEFAULT_MAX_INPUT_CHARS = 32_000
# A JWT with a handful of claims is a few hundred bytes; the cap only stops absurd frames
# from reaching the verifier.
MAX_TOKEN_CHARS = 8192
# Client-supplied text echoed into an error message is clipped so a hostile frame cannot
# make the server send (or log) a huge message back.
_ECHO_CHARS = 40


class EventType(StrEnum):
    RUN_STARTED = "run.started"
    MESSAGE_STARTED = "message.started"
    MESSAGE_DELTA = "message.delta"
    MESSAGE_COMPLETED = "message.completed"
    MESSAGE_ABORTED = "message.aborted"
    TOOL_CALLED = "tool.called"
    TOOL_OUTPUT = "tool.output"
    AGENT_CHANGED = "agent.changed"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    RUN_PAUSED = "run.paused"
    RUN_RESUMED = "run.resumed"
    RUN_RECOVERED = "run.recovered"
    INPUT_STAGED = "input.staged"
    INPUT_QUEUED = "input.queued"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"


# Events this gateway adds to the events of docs/protocol.md §6.
TOOL_NEEDS_RECONCILIATION = "tool.needs_reconciliation"
# A model's reasoning summary, streamed like a message, and the tokens each model call used.
REASONING_STARTED = "reasoning.started"
REASONING_DELTA = "reasoning.delta"
REASONING_COMPLETED = "reasoning.completed"
MODEL_USAGE = "model.usage"
ADDED_EVENTS = (
    TOOL_NEEDS_RECONCILIATION,
    REASONING_STARTED,
    REASONING_DELTA,
    REASONING_COMPLETED,
    MODEL_USAGE,
)
# What a client may ask in its hello to be left out of every subscription (docs/protocol.md §3
# `omit`): added events a view that does not show them need not receive.
OMITTABLE: dict[str, frozenset[str]] = {
    "reasoning": frozenset({REASONING_STARTED, REASONING_DELTA, REASONING_COMPLETED}),
    "usage": frozenset({MODEL_USAGE}),
}


class ProtocolError(GatewayError):
    """A client frame the server refuses while reading it: answered with an `error` frame whose
    `ref` is the frame's valid id, if it had one (docs/protocol.md §7)."""

    def __init__(self, code: ErrorCode, message: str, ref: str | None = None) -> None:
        super().__init__(code, message)
        self.ref = ref

    def to_frame(self) -> dict[str, Any]:
        return error_frame(self.ref, self.code, self.message)


# --- client frames -------------------------------------------------------------------------

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]


# An `input` over GATEWAY_MAX_INPUT_CHARS: answered with `too_large` when nothing else is wrong.
_INPUT_TOO_LONG = "input_too_long"
# A hello's token string that is empty or too long: `unauthorized`, as over HTTP.
_NOT_A_TOKEN = frozenset({"string_too_short", "string_too_long"})


def _check_input(value: str, info: ValidationInfo) -> str:
    # The limit is a deployment setting, so it arrives through the validation context rather
    # than being baked into the type.
    limit = DEFAULT_MAX_INPUT_CHARS
    if isinstance(info.context, Mapping):
        limit = info.context.get("max_input_chars", limit)
    if not value.strip():
        raise PydanticCustomError("input_blank", "must not be empty or whitespace only")
    if len(value) > limit:
        raise PydanticCustomError(
            _INPUT_TOO_LONG, "must be at most {max_length} characters", {"max_length": limit}
        )
    return value


def _check_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return value
    try:
        size = len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        # orjson decodes 1024 levels of nesting but encodes only 254: without this, deeply
        # nested metadata escaped the parser as a TypeError (an `internal` error, or an
        # unhandled exception when it came as the first frame).
        raise PydanticCustomError("metadata_too_deep", "must not be nested this deeply") from None
    if size > MAX_METADATA_BYTES:
        raise PydanticCustomError(
            "metadata_too_large",
            "must be at most {limit} bytes when encoded as JSON",
            {"limit": MAX_METADATA_BYTES},
        )
    return value


UserInput = Annotated[str, AfterValidator(_check_input)]


class _Frame(BaseModel):
    # strict: "5" is not an int and true is not an int (bad_request, docs/protocol.md §7);
    # extra="ignore": newer clients may send fields this server does not know yet.
    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    id: Id | None = None


class Hello(_Frame):
    type: Literal["hello"] = "hello"
    # Not range-checked here: an unknown version is `unsupported_protocol`, not `bad_request`.
    protocol: int
    # repr=False keeps the bearer token out of logs and tracebacks that print the frame.
    token: Annotated[str, Field(min_length=1, max_length=MAX_TOKEN_CHARS, repr=False)]
    # Kinds of added events to leave out of this connection's subscriptions (first hello).
    omit: list[Literal["reasoning", "usage"]] | None = None

    def omitted_events(self) -> frozenset[str]:
        """The event types `omit` names."""
        return frozenset().union(*(OMITTABLE[kind] for kind in self.omit or ()))


class ThreadCreate(_Frame):
    type: Literal["thread.create"] = "thread.create"
    metadata: Annotated[dict[str, Any] | None, AfterValidator(_check_metadata)] = None


class ThreadSubscribe(_Frame):
    type: Literal["thread.subscribe"] = "thread.subscribe"
    thread_id: Id
    after_seq: Annotated[int, Field(ge=0)] = 0
    epoch: Id | None = None


class ThreadUnsubscribe(_Frame):
    type: Literal["thread.unsubscribe"] = "thread.unsubscribe"
    thread_id: Id


class RunStart(_Frame):
    type: Literal["run.start"] = "run.start"
    thread_id: Id | None = None
    input: UserInput
    agent: Id | None = None
    on_disconnect: Literal["continue", "suspend"] = "continue"


class RunInput(_Frame):
    type: Literal["run.input"] = "run.input"
    thread_id: Id
    input: UserInput


class ApprovalDecide(_Frame):
    type: Literal["approval.decide"] = "approval.decide"
    approval_id: Id
    decision: Literal["approve", "reject"]
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] | None = None
    # An approval with edited arguments, for tools whose graph allows it (§4).
    arguments: dict[str, Any] | None = None


class RunCancel(_Frame):
    type: Literal["run.cancel"] = "run.cancel"
    run_id: Id


class RunResume(_Frame):
    type: Literal["run.resume"] = "run.resume"
    run_id: Id


class RunRegenerate(_Frame):
    """A new answer to the thread's last input, or to `input`, an edit of it (§4)."""

    type: Literal["run.regenerate"] = "run.regenerate"
    thread_id: Id
    input: UserInput | None = None
    # The run the client means to replace: refused unless it is the thread's last.
    run_id: Id | None = None


class RunRetry(_Frame):
    """A failed run, retried from its last checkpoint in a new run (§4)."""

    type: Literal["run.retry"] = "run.retry"
    run_id: Id


class InboxSubscribe(_Frame):
    type: Literal["inbox.subscribe"] = "inbox.subscribe"


class ThreadUpdate(_Frame):
    """Rename a thread and/or archive it (or bring it back): its owner or an admin (§4)."""

    type: Literal["thread.update"] = "thread.update"
    thread_id: Id
    # Checked by the thread list (gateway/run_lifecycle/thread_titles.py), as over HTTP.
    title: str | None = None
    archived: bool | None = None


class ThreadDelete(_Frame):
    type: Literal["thread.delete"] = "thread.delete"
    thread_id: Id


class ThreadsSubscribe(_Frame):
    """The caller's thread list, then its changes (§4); `archived` lists archived threads."""

    type: Literal["threads.subscribe"] = "threads.subscribe"
    archived: bool = False


class Ping(_Frame):
    type: Literal["ping"] = "ping"


class Pong(_Frame):
    type: Literal["pong"] = "pong"


ClientFrame = Annotated[
    Hello
    | ThreadCreate
    | ThreadSubscribe
    | ThreadUnsubscribe
    | RunStart
    | RunInput
    | ApprovalDecide
    | RunCancel
    | RunResume
    | RunRegenerate
    | RunRetry
    | InboxSubscribe
    | ThreadUpdate
    | ThreadDelete
    | ThreadsSubscribe
    | Ping
    | Pong,
    Field(discriminator="type"),
]

_FRAME_MODELS: dict[str, type[_Frame]] = {
    model.model_fields["type"].default: model
    for model in (
        Hello,
        ThreadCreate,
        ThreadSubscribe,
        ThreadUnsubscribe,
        RunStart,
        RunInput,
        ApprovalDecide,
        RunCancel,
        RunResume,
        RunRegenerate,
        RunRetry,
        InboxSubscribe,
        ThreadUpdate,
        ThreadDelete,
        ThreadsSubscribe,
        Ping,
        Pong,
    )
}
CLIENT_FRAME_TYPES = frozenset(_FRAME_MODELS)

_client_frame_adapter: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


def parse_client_frame(
    raw: str | bytes, *, max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
) -> ClientFrame:
    """Decode and validate one client frame, or raise `ProtocolError(bad_request)`.

    The one exception: a well-formed frame whose only fault is an `input` longer than
    `max_input_chars` raises `ProtocolError(too_large)`.

    The error's `ref` is the frame's `id` whenever that id is itself valid, so a client can
    correlate the error with its request even when another field is wrong.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        obj = orjson.loads(text)
    except UnicodeDecodeError:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "frame is not valid UTF-8") from None
    except orjson.JSONDecodeError as exc:
        # orjson's own message may quote the frame; only the position is safe to repeat.
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"frame is not valid JSON (line {exc.lineno}, column {exc.colno})",
        ) from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "frame must be a JSON object")

    ref = _ref_of(obj)
    frame_type = obj.get("type")
    if frame_type is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "field 'type': is required", ref)
    if not isinstance(frame_type, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "field 'type': must be a string", ref)
    model = _FRAME_MODELS.get(frame_type)
    if model is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown frame type {_clip(frame_type)!r}", ref)

    try:
        return _client_frame_adapter.validate_python(
            obj, context={"max_input_chars": max_input_chars}
        )
    except ValidationError as exc:
        errors = exc.errors()
        if model is Hello and all(
            tuple(err["loc"])[-1:] == ("token",) and err["type"] in _NOT_A_TOKEN for err in errors
        ):
            # A token that cannot be one (empty, or over MAX_TOKEN_CHARS) is refused as HTTP
            # refuses it (gateway/auth/access.py): `unauthorized`, not a malformed frame.
            too_long = isinstance(obj.get("token"), str) and len(obj["token"]) > MAX_TOKEN_CHARS
            message = "token is too long" if too_long else "token is missing"
            raise ProtocolError(ErrorCode.UNAUTHORIZED, message, ref) from None
        too_long = all(err["type"] == _INPUT_TOO_LONG for err in errors)
        code = ErrorCode.TOO_LARGE if too_long else ErrorCode.BAD_REQUEST
        raise ProtocolError(code, _describe(model, exc), ref) from None


def peek(raw: str) -> tuple[str | None, str | None]:
    """A frame's `type` and valid `id` without validating it (None for what is missing).

    For frames refused before parsing (rate limits): the error still carries the `ref`.
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    frame_type = obj.get("type")
    return (frame_type if isinstance(frame_type, str) else None), _ref_of(obj)


def _ref_of(obj: Mapping[str, Any]) -> str | None:
    frame_id = obj.get("id")
    if isinstance(frame_id, str) and 0 < len(frame_id) <= MAX_ID_CHARS:
        return frame_id
    return None


def _clip(text: str, limit: int = _ECHO_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(model: type[_Frame], exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = [_describe_one(model, err) for err in errors[:3]]
    if len(errors) > 3:
        parts.append(f"and {len(errors) - 3} more")
    return "; ".join(parts)


def _describe_one(model: type[_Frame], err: ErrorDetails) -> str:
    loc = list(err["loc"])
    # The discriminated union prefixes every location with the frame's tag.
    if loc and loc[0] == model.model_fields["type"].default:
        loc = loc[1:]
    field = ".".join(str(part) for part in loc) or "frame"
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "missing":
        rule = "is required"
    elif kind in ("int_type", "greater_than_equal"):
        floor = _int_floor(model, str(loc[0])) if loc else None
        rule = "must be an integer" + (f" >= {floor}" if floor is not None else "")
    elif kind == "string_type":
        rule = "must be a string"
    elif kind == "string_too_short":
        rule = "must not be empty"
    elif kind in ("string_too_long", _INPUT_TOO_LONG):
        rule = f"must be at most {ctx.get('max_length')} characters"
    elif kind == "dict_type":
        rule = "must be a JSON object"
    elif kind == "literal_error":
        rule = f"must be one of {ctx.get('expected')}"
    else:
        rule = err["msg"]
    return f"field {field!r}: {rule}"


def _int_floor(model: type[_Frame], field: str) -> int | None:
    info = model.model_fields.get(field)
    if info is None:
        return None
    for constraint in info.metadata:
        if isinstance(constraint, annotated_types.Ge) and isinstance(constraint.ge, int):
            return constraint.ge
    return None


# --- server frames -------------------------------------------------------------------------


def utc_ts(dt: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and `Z`, e.g. `2026-11-29T12:00:00.123Z`.

    A naive datetime is taken as UTC: SQLite hands stored timestamps back without a zone.
    """
    dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    # Truncated, not rounded: rounding 999.6 ms up would need a carry into the seconds.
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{dt.microsecond // 1000:03d}Z"


def ack(ref: str | None, **fields: Any) -> dict[str, Any]:
    if "type" in fields:
        raise ValueError("an ack's result fields cannot override 'type'")
    return {"type": "ack", "ref": ref, **fields}


def error_frame(ref: str | None, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"type": "error", "ref": ref, "code": str(code), "message": message}


def welcome(
    *,
    user: str,
    tenant: str,
    roles: Iterable[str],
    heartbeat_s: float,
    server_name: str,
    server_version: str,
    protocol: int = PROTOCOL_VERSION,
    omit: Iterable[str] = (),
) -> dict[str, Any]:
    frame = {
        "type": "welcome",
        "protocol": protocol,
        "user": user,
        "tenant": tenant,
        # Sorted so the frame is the same however the role set happened to iterate.
        "roles": sorted(str(role) for role in roles),
        "heartbeat_s": heartbeat_s,
        "server": {"name": server_name, "version": server_version},
    }
    if omit:
        frame["omit"] = sorted(omit)
    return frame


def subscribed(thread_id: str, epoch: str, head_seq: int, reset: bool) -> dict[str, Any]:
    return {
        "type": "subscribed",
        "thread_id": thread_id,
        "epoch": epoch,
        "head_seq": head_seq,
        "reset": reset,
    }


def event_frame(
    thread_id: str,
    seq: int,
    run_id: str | None,
    event: EventType | str,
    ts: datetime | str,
    data: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "type": "event",
        "thread_id": thread_id,
        "seq": seq,
        "run_id": run_id,
        "event": str(event),
        "ts": utc_ts(ts) if isinstance(ts, datetime) else ts,
        "data": dict(data),
    }


def inbox(approvals: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"type": "inbox", "approvals": [dict(a) for a in approvals]}


def inbox_update(added: Sequence[Mapping[str, Any]], removed: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "inbox.update",
        "added": [dict(a) for a in added],
        "removed": list(removed),
    }


def threads(views: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"type": "threads", "threads": [dict(v) for v in views]}


def threads_update(views: Sequence[Mapping[str, Any]], removed: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "threads.update",
        "threads": [dict(v) for v in views],
        "removed": list(removed),
    }


def ping() -> dict[str, Any]:
    return {"type": "ping"}


def pong() -> dict[str, Any]:
    return {"type": "pong"}


def encode(frame: dict[str, Any]) -> str:
    """One text frame. orjson also serializes enums and datetimes found in `data`."""
    return orjson.dumps(frame).decode("utf-8")
