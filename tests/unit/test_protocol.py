"""The wire contract of docs/protocol.md §2, §4, §5: client frame parsing and server frame
building."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.protocol import frames as p
from gateway.protocol.frames import ErrorCode, EventType, ProtocolError, parse_client_frame, peek


def parse(frame: dict[str, Any], **kwargs: Any) -> Any:
    return parse_client_frame(orjson.dumps(frame), **kwargs)


def parse_error(raw: str | bytes | dict[str, Any], **kwargs: Any) -> ProtocolError:
    if isinstance(raw, dict):
        raw = orjson.dumps(raw)
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(raw, **kwargs)
    assert info.value.code is ErrorCode.BAD_REQUEST
    return info.value


# --- every frame type parses ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "model", "fields"),
    [
        (
            {"type": "hello", "protocol": 1, "token": "jwt"},
            p.Hello,
            {"protocol": 1, "token": "jwt"},
        ),
        ({"type": "thread.create"}, p.ThreadCreate, {"metadata": None}),
        (
            {"type": "thread.create", "metadata": {"title": "x", "n": [1, 2]}},
            p.ThreadCreate,
            {"metadata": {"title": "x", "n": [1, 2]}},
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t_1"},
            p.ThreadSubscribe,
            {"thread_id": "t_1", "after_seq": 0, "epoch": None},
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t_1", "after_seq": 17, "epoch": "e1"},
            p.ThreadSubscribe,
            {"thread_id": "t_1", "after_seq": 17, "epoch": "e1"},
        ),
        ({"type": "thread.unsubscribe", "thread_id": "t_1"}, p.ThreadUnsubscribe, {}),
        (
            {"type": "run.start", "input": "hi"},
            p.RunStart,
            {"thread_id": None, "input": "hi", "agent": None, "on_disconnect": "continue"},
        ),
        (
            {
                "type": "run.start",
                "thread_id": "t_1",
                "input": "refund 42",
                "agent": "assistant",
                "on_disconnect": "suspend",
            },
            p.RunStart,
            {"thread_id": "t_1", "agent": "assistant", "on_disconnect": "suspend"},
        ),
        (
            {"type": "run.input", "thread_id": "t_1", "input": "more"},
            p.RunInput,
            {"thread_id": "t_1", "input": "more"},
        ),
        (
            {"type": "approval.decide", "approval_id": "a_1", "decision": "approve"},
            p.ApprovalDecide,
            {"decision": "approve", "reason": None},
        ),
        (
            {"type": "approval.decide", "approval_id": "a_1", "decision": "reject", "reason": "no"},
            p.ApprovalDecide,
            {"decision": "reject", "reason": "no"},
        ),
        ({"type": "run.cancel", "run_id": "r_1"}, p.RunCancel, {"run_id": "r_1"}),
        ({"type": "run.resume", "run_id": "r_1"}, p.RunResume, {"run_id": "r_1"}),
        ({"type": "inbox.subscribe"}, p.InboxSubscribe, {}),
        ({"type": "ping"}, p.Ping, {}),
        ({"type": "pong"}, p.Pong, {}),
    ],
)
def test_every_frame_type_parses(
    frame: dict[str, Any], model: type[Any], fields: dict[str, Any]
) -> None:
    parsed = parse(frame)
    assert type(parsed) is model
    assert parsed.type == frame["type"]
    assert parsed.id is None
    for name, value in fields.items():
        assert getattr(parsed, name) == value


def test_frame_types_cover_protocol_table() -> None:
    assert p.CLIENT_FRAME_TYPES == {
        "hello",
        "thread.create",
        "thread.subscribe",
        "thread.unsubscribe",
        "run.start",
        "run.input",
        "approval.decide",
        "run.cancel",
        "run.resume",
        "run.regenerate",
        "run.retry",
        "inbox.subscribe",
        "thread.update",
        "thread.delete",
        "threads.subscribe",
        "ping",
        "pong",
    }


def test_str_and_bytes_both_accepted() -> None:
    assert parse_client_frame('{"type":"ping","id":"é1"}').id == "é1"
    assert parse_client_frame('{"type":"ping","id":"é1"}'.encode()).id == "é1"


def test_id_is_kept() -> None:
    assert parse({"type": "ping", "id": "x" * 64}).id == "x" * 64


def test_unknown_fields_are_ignored() -> None:
    frame = parse({"type": "run.cancel", "run_id": "r_1", "priority": 9, "nested": {"a": 1}})
    assert frame == p.RunCancel(run_id="r_1")


def test_frames_are_frozen() -> None:
    frame = parse({"type": "run.cancel", "run_id": "r_1"})
    with pytest.raises(ValidationError):
        frame.run_id = "r_2"


def test_hello_repr_hides_token() -> None:
    frame = parse({"type": "hello", "protocol": 1, "token": "secret-token-value"})
    assert "secret-token-value" not in repr(frame)


def test_hello_does_not_range_check_protocol() -> None:
    # An unknown version is answered with `unsupported_protocol` by the connection, not here.
    assert parse({"type": "hello", "protocol": 99, "token": "t"}).protocol == 99


# --- malformed frames ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ('{"type": "ping"} trailing', "not valid JSON"),
        ('{"type": NaN}', "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        ("[]", "must be a JSON object"),
        ('"ping"', "must be a JSON object"),
        ("42", "must be a JSON object"),
        ("null", "must be a JSON object"),
    ],
)
def test_malformed_frames_are_bad_request_without_ref(raw: str | bytes, fragment: str) -> None:
    err = parse_error(raw)
    assert fragment in err.message
    assert err.ref is None


def test_invalid_json_message_does_not_echo_the_frame() -> None:
    err = parse_error('{"token": "sekrit-abc", oops}')
    assert "sekrit" not in err.message


def test_missing_type() -> None:
    err = parse_error({"id": "c1", "thread_id": "t"})
    assert err.message == "field 'type': is required"
    assert err.ref == "c1"


@pytest.mark.parametrize("bad_type", [5, None, True, ["ping"], {"x": 1}])
def test_type_must_be_string(bad_type: Any) -> None:
    frame = {"type": bad_type, "id": "c1"}
    err = parse_error(frame)
    assert "'type'" in err.message
    assert err.ref == "c1"


def test_unknown_type_names_it_and_keeps_ref() -> None:
    err = parse_error({"type": "thread.destroy", "id": "c7"})
    assert err.message == "unknown frame type 'thread.destroy'"
    assert err.ref == "c7"


def test_unknown_type_is_clipped_in_message() -> None:
    err = parse_error({"type": "z" * 10_000})
    assert len(err.message) < 100


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            {"type": "thread.subscribe", "thread_id": "t", "after_seq": "5"},
            "field 'after_seq': must be an integer >= 0",
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t", "after_seq": True},
            "field 'after_seq': must be an integer >= 0",
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t", "after_seq": -1},
            "field 'after_seq': must be an integer >= 0",
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t", "after_seq": 1.5},
            "field 'after_seq': must be an integer >= 0",
        ),
        (
            {"type": "thread.subscribe", "thread_id": "t", "after_seq": 2.0},
            "field 'after_seq': must be an integer >= 0",
        ),
        ({"type": "hello", "protocol": "1", "token": "t"}, "field 'protocol': must be an integer"),
        ({"type": "hello", "protocol": True, "token": "t"}, "field 'protocol': must be an integer"),
        ({"type": "hello", "protocol": 1}, "field 'token': is required"),
        ({"type": "thread.subscribe"}, "field 'thread_id': is required"),
        ({"type": "thread.subscribe", "thread_id": 7}, "field 'thread_id': must be a string"),
        ({"type": "thread.subscribe", "thread_id": ""}, "field 'thread_id': must not be empty"),
        (
            {"type": "thread.subscribe", "thread_id": "t" * 65},
            "field 'thread_id': must be at most 64 characters",
        ),
        ({"type": "run.cancel", "run_id": None}, "field 'run_id': must be a string"),
        ({"type": "run.resume", "run_id": ""}, "field 'run_id': must not be empty"),
        (
            {"type": "approval.decide", "approval_id": "a" * 65, "decision": "approve"},
            "field 'approval_id': must be at most 64 characters",
        ),
        (
            {"type": "approval.decide", "approval_id": "a", "decision": "maybe"},
            "field 'decision': must be one of 'approve' or 'reject'",
        ),
        (
            {"type": "approval.decide", "approval_id": "a", "decision": "reject", "reason": 3},
            "field 'reason': must be a string",
        ),
        (
            {
                "type": "approval.decide",
                "approval_id": "a",
                "decision": "reject",
                "reason": "r" * 4001,
            },
            "field 'reason': must be at most 4000 characters",
        ),
        ({"type": "run.start"}, "field 'input': is required"),
        ({"type": "run.start", "input": ""}, "field 'input': must not be empty or whitespace only"),
        (
            {"type": "run.start", "input": " \n\t "},
            "field 'input': must not be empty or whitespace only",
        ),
        ({"type": "run.start", "input": 42}, "field 'input': must be a string"),
        (
            {"type": "run.start", "input": "x", "on_disconnect": "abort"},
            "field 'on_disconnect': must be one of 'continue' or 'suspend'",
        ),
        ({"type": "run.start", "input": "x", "agent": ""}, "field 'agent': must not be empty"),
        (
            {"type": "run.input", "thread_id": "t", "input": "  "},
            "field 'input': must not be empty or whitespace only",
        ),
        ({"type": "thread.create", "metadata": [1, 2]}, "field 'metadata': must be a JSON object"),
        ({"type": "thread.create", "metadata": "x"}, "field 'metadata': must be a JSON object"),
        ({"type": "ping", "id": 5}, "field 'id': must be a string"),
        ({"type": "ping", "id": "i" * 65}, "field 'id': must be at most 64 characters"),
        ({"type": "ping", "id": ""}, "field 'id': must not be empty"),
    ],
)
def test_wrong_fields_are_bad_request_naming_the_field(frame: dict[str, Any], message: str) -> None:
    assert parse_error(frame).message == message


@pytest.mark.parametrize(
    ("token", "message"), [("", "token is missing"), ("x" * 8193, "token is too long")]
)
def test_a_hello_token_that_cannot_be_one_is_unauthorized(token: str, message: str) -> None:
    """As HTTP answers the same token (401 `unauthorized`), with the verifier's words."""
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(
            orjson.dumps({"type": "hello", "id": "h", "protocol": 1, "token": token})
        )
    err = info.value
    assert (err.code, err.message, err.ref) == (ErrorCode.UNAUTHORIZED, message, "h")


def test_several_errors_are_all_named() -> None:
    err = parse_error({"type": "thread.subscribe", "thread_id": "", "after_seq": -3})
    assert "'thread_id'" in err.message
    assert "'after_seq'" in err.message


def too_large_error(frame: dict[str, Any], **kwargs: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_frame(orjson.dumps(frame), **kwargs)
    assert info.value.code is ErrorCode.TOO_LARGE
    return info.value


def test_input_length_limit_is_a_parameter() -> None:
    frame = {"type": "run.input", "id": "i1", "thread_id": "t", "input": "x" * 11}
    err = too_large_error(frame, max_input_chars=10)
    assert err.message == "field 'input': must be at most 10 characters"
    assert err.ref == "i1"
    assert parse(frame, max_input_chars=11).input == "x" * 11


def test_default_input_limit() -> None:
    assert len(parse({"type": "run.start", "input": "x" * 32_000}).input) == 32_000
    too_large_error({"type": "run.start", "input": "x" * 32_001})


def test_a_long_input_with_another_fault_is_a_bad_request() -> None:
    # too_large means "only the size is wrong": fixing the shape first is the client's job.
    frame = {"type": "run.start", "input": "x" * 11, "agent": 5}
    err = parse_error(frame, max_input_chars=10)
    assert "'input'" in err.message and "'agent'" in err.message


def test_peek_reads_type_and_id_without_validating() -> None:
    assert peek('{"type": "pong", "id": "p1", "junk": [1]}') == ("pong", "p1")
    assert peek('{"type": 5, "id": ""}') == (None, None)
    assert peek("[1, 2]") == (None, None)
    assert peek("{nope") == (None, None)


def test_huge_input_is_not_echoed() -> None:
    err = too_large_error({"type": "run.start", "input": "Q" * 50_000})
    assert "QQQQ" not in err.message
    assert len(err.message) < 200


def test_metadata_size_is_bounded() -> None:
    err = parse_error({"type": "thread.create", "metadata": {"a": "x" * 9000}})
    assert err.message.startswith("field 'metadata': must be at most 8192 bytes")


# --- ref propagation -----------------------------------------------------------------------


def test_ref_is_the_valid_id_of_an_invalid_frame() -> None:
    err = parse_error(
        {"type": "thread.subscribe", "id": "req-9", "thread_id": "t", "after_seq": "x"}
    )
    assert err.ref == "req-9"


@pytest.mark.parametrize("bad_id", ["i" * 65, "", 12, None, True])
def test_no_ref_when_the_id_itself_is_invalid(bad_id: Any) -> None:
    err = parse_error({"type": "run.cancel", "id": bad_id})
    assert err.ref is None


def test_error_to_frame_carries_ref() -> None:
    err = parse_error({"type": "nope", "id": "c1"})
    assert err.to_frame() == {
        "type": "error",
        "ref": "c1",
        "code": "bad_request",
        "message": "unknown frame type 'nope'",
    }


# --- server frames -------------------------------------------------------------------------


def test_error_codes_match_protocol() -> None:
    assert {c.value for c in ErrorCode} == {
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "conflict",
        "rate_limited",
        "too_large",
        "unsupported_protocol",
        "unavailable",
        "internal",
        # The gateway's additions.
        "graph_mismatch",
        "unsupported_media_type",
    }


def test_event_types_match_protocol() -> None:
    assert {e.value for e in EventType} == {
        "run.started",
        "message.started",
        "message.delta",
        "message.completed",
        "message.aborted",
        "tool.called",
        "tool.output",
        "agent.changed",
        "approval.requested",
        "approval.decided",
        "run.paused",
        "run.resumed",
        "run.recovered",
        "input.staged",
        "input.queued",
        "run.completed",
        "run.failed",
        "run.cancelled",
    }


def test_ack() -> None:
    assert p.ack("c1") == {"type": "ack", "ref": "c1"}
    assert p.ack("c2", thread_id="t", run_id="r") == {
        "type": "ack",
        "ref": "c2",
        "thread_id": "t",
        "run_id": "r",
    }
    with pytest.raises(ValueError):
        p.ack("c3", type="error")


def test_error_frame() -> None:
    frame = p.error_frame(None, ErrorCode.CONFLICT, "run already active")
    assert frame == {
        "type": "error",
        "ref": None,
        "code": "conflict",
        "message": "run already active",
    }
    assert p.encode(frame) == (
        '{"type":"error","ref":null,"code":"conflict","message":"run already active"}'
    )


def test_welcome() -> None:
    frame = p.welcome(
        user="u1",
        tenant="acme",
        roles=frozenset({"reviewer", "user"}),
        heartbeat_s=20,
        server_name="agents-ws-gateway",
        server_version="0.1.0",
    )
    assert frame == {
        "type": "welcome",
        "protocol": 1,
        "user": "u1",
        "tenant": "acme",
        "roles": ["reviewer", "user"],
        "heartbeat_s": 20,
        "server": {"name": "agents-ws-gateway", "version": "0.1.0"},
    }


def test_subscribed() -> None:
    assert p.subscribed("t_1", "e1", 12, False) == {
        "type": "subscribed",
        "thread_id": "t_1",
        "epoch": "e1",
        "head_seq": 12,
        "reset": False,
    }


def test_event_frame_matches_protocol_example() -> None:
    ts = datetime(2026, 11, 29, 12, 0, 0, 123_456, tzinfo=UTC)
    frame = p.event_frame(
        "t_1", 17, "r_1", EventType.MESSAGE_DELTA, ts, {"message_id": "m_1", "delta": "Hel"}
    )
    assert orjson.loads(p.encode(frame)) == {
        "type": "event",
        "thread_id": "t_1",
        "seq": 17,
        "run_id": "r_1",
        "event": "message.delta",
        "ts": "2026-11-29T12:00:00.123Z",
        "data": {"message_id": "m_1", "delta": "Hel"},
    }


def test_event_frame_accepts_preformatted_ts_and_plain_event_name() -> None:
    frame = p.event_frame("t", 1, "r", "custom.event", "2026-01-01T00:00:00.000Z", {})
    assert frame["ts"] == "2026-01-01T00:00:00.000Z"
    assert frame["event"] == "custom.event"


def test_inbox_frames() -> None:
    approval = {
        "approval_id": "a_1",
        "thread_id": "t_1",
        "run_id": "r_1",
        "tool_name": "issue_refund",
        "arguments": {"order_id": 42, "amount": 10},
        "agent": "assistant",
        "requested_at": "2026-11-29T12:00:00.000Z",
    }
    assert p.inbox([approval]) == {"type": "inbox", "approvals": [approval]}
    assert p.inbox([]) == {"type": "inbox", "approvals": []}
    assert p.inbox_update([approval], ["a_0"]) == {
        "type": "inbox.update",
        "added": [approval],
        "removed": ["a_0"],
    }


def test_ping_pong() -> None:
    assert p.encode(p.ping()) == '{"type":"ping"}'
    assert p.encode(p.pong()) == '{"type":"pong"}'


def test_encode_returns_str_and_handles_enums() -> None:
    text = p.encode({"type": "event", "event": EventType.RUN_COMPLETED, "data": {"x": "é"}})
    assert isinstance(text, str)
    assert orjson.loads(text) == {"type": "event", "event": "run.completed", "data": {"x": "é"}}


@pytest.mark.parametrize(
    ("dt", "expected"),
    [
        (datetime(2026, 11, 29, 12, 0, 0, 123_000, tzinfo=UTC), "2026-11-29T12:00:00.123Z"),
        (datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC), "2026-11-29T12:00:00.000Z"),
        # Truncated rather than rounded, so 999.9 ms never carries into the next second.
        (datetime(2026, 11, 29, 12, 0, 59, 999_999, tzinfo=UTC), "2026-11-29T12:00:59.999Z"),
        (
            datetime(2026, 11, 29, 14, 0, 0, 5_000, tzinfo=timezone(timedelta(hours=2))),
            "2026-11-29T12:00:00.005Z",
        ),
        # Naive values (as SQLite returns them) are UTC.
        (datetime(2026, 1, 2, 3, 4, 5, 6_000), "2026-01-02T03:04:05.006Z"),
    ],
)
def test_utc_ts(dt: datetime, expected: str) -> None:
    assert p.utc_ts(dt) == expected
