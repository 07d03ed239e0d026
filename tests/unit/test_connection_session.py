"""The connection's protocol state machine (gateway/protocol/session.py), with values only:
every state against every client frame kind, both hellos' version and token checks,
re-authentication with another identity, the rate gate, the token's expiry and what arrives after
the close."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from gateway.auth.access import Principal, Role
from gateway.protocol import frames as p
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.frames import ErrorCode, ProtocolError
from gateway.protocol.session import (
    Authenticate,
    Authenticated,
    AuthenticationFailed,
    Close,
    CloseRequested,
    ConnectionRefused,
    ConnectionSession,
    Disconnected,
    Event,
    FrameArrived,
    FrameInvalid,
    FrameTooLarge,
    HelloTimedOut,
    Open,
    Perform,
    RateExceeded,
    Renewed,
    Reply,
    ServerIdentity,
    SessionState,
    SessionStateError,
    TokenCheckAbandoned,
    TokenExpired,
)

SERVER = ServerIdentity(name="gateway", version="9.9", heartbeat_s=15.0)
ALICE = Principal(user="alice", tenant="acme", roles=frozenset({Role.USER}), source="10.0.0.1")

# One of each client frame kind (docs/protocol.md §4).
FRAMES: dict[str, p.ClientFrame] = {
    "hello": p.Hello(id="h", protocol=p.PROTOCOL_VERSION, token="jwt"),
    "thread.create": p.ThreadCreate(id="c"),
    "thread.subscribe": p.ThreadSubscribe(id="s", thread_id="t_1", after_seq=4),
    "thread.unsubscribe": p.ThreadUnsubscribe(id="u", thread_id="t_1"),
    "run.start": p.RunStart(id="r", input="hi"),
    "run.input": p.RunInput(id="i", thread_id="t_1", input="more"),
    "approval.decide": p.ApprovalDecide(id="d", approval_id="a_1", decision="approve"),
    "run.cancel": p.RunCancel(id="x", run_id="r_1"),
    "run.resume": p.RunResume(id="y", run_id="r_1"),
    "run.regenerate": p.RunRegenerate(id="g", thread_id="t_1"),
    "run.retry": p.RunRetry(id="t", run_id="r_1"),
    "thread.update": p.ThreadUpdate(id="tu", thread_id="t_1", title="Refunds"),
    "thread.delete": p.ThreadDelete(id="td", thread_id="t_1"),
    "threads.subscribe": p.ThreadsSubscribe(id="ts"),
    "inbox.subscribe": p.InboxSubscribe(id="b"),
    "ping": p.Ping(id="p"),
    "pong": p.Pong(),
}
REQUESTS = [kind for kind in FRAMES if kind not in ("hello", "ping", "pong")]


def test_every_frame_kind_has_a_case() -> None:
    (union, _discriminator) = get_args(p.ClientFrame)
    assert set(FRAMES) == {model.model_fields["type"].default for model in get_args(union)}


def hello(token: str = "jwt", *, version: int = p.PROTOCOL_VERSION, ref: str = "h") -> Event:
    return FrameArrived(p.Hello(id=ref, protocol=version, token=token))


def error_of(action: Any) -> dict[str, Any]:
    frame = action.last_word if isinstance(action, Close) else action.frame
    assert frame is not None and frame["type"] == "error", action
    return frame


def in_state(state: SessionState) -> ConnectionSession:
    """A session driven to `state` through its events."""
    session = ConnectionSession(SERVER)
    if state is SessionState.AWAITING_HELLO:
        return session
    session.handle(hello())
    if state is SessionState.AUTHENTICATING:
        return session
    session.handle(Authenticated(ALICE))
    if state is SessionState.OPEN:
        return session
    if state is SessionState.REAUTHENTICATING:
        session.handle(hello("fresh", ref="h2"))
        return session
    session.handle(CloseRequested(CloseCode.GOING_AWAY))
    if state is SessionState.CLOSED:
        session.handle(Disconnected())
    assert session.state is state
    return session


# --- every state against every frame kind -------------------------------------------------


@pytest.mark.parametrize("kind", FRAMES)
def test_awaiting_hello_takes_only_a_hello(kind: str) -> None:
    session = in_state(SessionState.AWAITING_HELLO)
    actions = session.handle(FrameArrived(FRAMES[kind]))
    if kind == "hello":
        assert actions == [Authenticate("jwt", first=True)]
        assert session.state is SessionState.AUTHENTICATING
        return
    (close,) = actions
    assert isinstance(close, Close) and close.code == CloseCode.UNAUTHORIZED
    assert error_of(close) == p.error_frame(
        FRAMES[kind].id, ErrorCode.UNAUTHORIZED, "the first frame must be hello"
    )
    assert session.state is SessionState.CLOSING
    assert session.close_code == CloseCode.UNAUTHORIZED


@pytest.mark.parametrize("state", [SessionState.AUTHENTICATING, SessionState.REAUTHENTICATING])
@pytest.mark.parametrize("kind", FRAMES)
def test_no_frame_is_read_while_a_token_is_checked(state: SessionState, kind: str) -> None:
    session = in_state(state)
    with pytest.raises(SessionStateError) as raised:
        session.handle(FrameArrived(FRAMES[kind]))
    message = str(raised.value)
    assert "hello's token check" in message and f"got a {kind} frame" in message
    assert session.state is state


@pytest.mark.parametrize("kind", FRAMES)
def test_an_open_session_answers_or_hands_on_every_frame(kind: str) -> None:
    session = in_state(SessionState.OPEN)
    frame = FRAMES[kind]
    actions = session.handle(FrameArrived(frame))
    match kind:
        case "hello":
            assert actions == [Authenticate("jwt", first=False)]
            assert session.state is SessionState.REAUTHENTICATING
            return
        case "ping":
            assert actions == [Reply({"type": "pong", "ref": "p"})]
        case "pong":
            assert actions == []
        case _:
            assert actions == [Perform(frame, ALICE)]
    assert session.state is SessionState.OPEN


@pytest.mark.parametrize("kind", FRAMES)
def test_frames_in_flight_when_closing_began_are_dropped(kind: str) -> None:
    session = in_state(SessionState.CLOSING)
    assert session.handle(FrameArrived(FRAMES[kind])) == []
    assert session.state is SessionState.CLOSING
    assert session.close_code == CloseCode.GOING_AWAY


@pytest.mark.parametrize("kind", FRAMES)
def test_no_frame_after_the_close(kind: str) -> None:
    session = in_state(SessionState.CLOSED)
    with pytest.raises(SessionStateError) as raised:
        session.handle(FrameArrived(FRAMES[kind]))
    assert str(raised.value) == (
        f"closed: expected nothing: the connection is closed, got a {kind} frame"
    )


def test_a_ping_without_id_gets_a_pong_without_ref() -> None:
    session = in_state(SessionState.OPEN)
    assert session.handle(FrameArrived(p.Ping())) == [Reply({"type": "pong"})]


# --- the first hello ----------------------------------------------------------------------


def test_a_valid_hello_opens_with_a_welcome() -> None:
    session = in_state(SessionState.AUTHENTICATING)
    (opened,) = session.handle(Authenticated(ALICE))
    assert opened == Open(
        p.welcome(
            user="alice",
            tenant="acme",
            roles=["user"],
            heartbeat_s=15.0,
            server_name="gateway",
            server_version="9.9",
        ),
        ALICE,
    )
    assert session.state is SessionState.OPEN and session.principal == ALICE
    assert not session.ending and session.close_code is None


@pytest.mark.parametrize("state", [SessionState.AWAITING_HELLO, SessionState.OPEN])
def test_a_hello_of_another_protocol_version_is_refused_before_its_token(
    state: SessionState,
) -> None:
    session = in_state(state)
    (close,) = session.handle(hello(version=p.PROTOCOL_VERSION + 1, ref="v"))
    assert isinstance(close, Close) and close.code == CloseCode.UNAUTHORIZED
    assert error_of(close) == p.error_frame(
        "v",
        ErrorCode.UNSUPPORTED_PROTOCOL,
        f"protocol {p.PROTOCOL_VERSION + 1} is not supported; this server speaks "
        f"{p.PROTOCOL_VERSION}",
    )
    assert session.state is SessionState.CLOSING


def test_an_invalid_first_frame_closes_with_its_error() -> None:
    session = in_state(SessionState.AWAITING_HELLO)
    error = ProtocolError(ErrorCode.BAD_REQUEST, "frame is not valid JSON")
    assert session.handle(FrameInvalid(error)) == [Close(CloseCode.UNAUTHORIZED, error.to_frame())]


def test_no_hello_in_time_closes() -> None:
    session = in_state(SessionState.AWAITING_HELLO)
    (close,) = session.handle(HelloTimedOut())
    assert isinstance(close, Close) and close.code == CloseCode.UNAUTHORIZED
    assert error_of(close)["message"] == "no hello within the timeout"


@pytest.mark.parametrize(
    ("failure", "code", "close_code"),
    [
        (
            AuthenticationFailed(ErrorCode.UNAUTHORIZED, "bad", False),
            "unauthorized",
            CloseCode.UNAUTHORIZED,
        ),
        (
            AuthenticationFailed(ErrorCode.UNAVAILABLE, "keys", True),
            "unavailable",
            CloseCode.TRY_AGAIN,
        ),
        (ConnectionRefused("too many connections"), "rate_limited", CloseCode.TOO_MANY_CONNECTIONS),
    ],
)
def test_a_refused_first_hello_closes(failure: Event, code: str, close_code: int) -> None:
    session = in_state(SessionState.AUTHENTICATING)
    (close,) = session.handle(failure)
    assert isinstance(close, Close) and close.code == close_code
    assert error_of(close)["code"] == code and error_of(close)["ref"] == "h"
    assert session.state is SessionState.CLOSING


# --- a later hello ------------------------------------------------------------------------


def test_a_later_hello_renews_the_token_and_keeps_the_address() -> None:
    session = in_state(SessionState.REAUTHENTICATING)
    renewed_token = Principal(
        user="alice", tenant="acme", roles=frozenset({Role.USER}), expires_at=2e9
    )
    (renewed,) = session.handle(Authenticated(renewed_token))
    assert isinstance(renewed, Renewed) and not renewed.roles_changed
    assert renewed.principal.source == "10.0.0.1" and renewed.principal.expires_at == 2e9
    assert renewed.welcome["type"] == "welcome" and renewed.welcome["ref"] == "h2"
    assert session.state is SessionState.OPEN and session.principal == renewed.principal


def test_a_later_hello_with_new_roles_says_so() -> None:
    session = in_state(SessionState.REAUTHENTICATING)
    reviewer = Principal(user="alice", tenant="acme", roles=frozenset({Role.REVIEWER}))
    (renewed,) = session.handle(Authenticated(reviewer))
    assert isinstance(renewed, Renewed) and renewed.roles_changed
    assert renewed.welcome["roles"] == ["reviewer"]


@pytest.mark.parametrize(("user", "tenant"), [("bob", "acme"), ("alice", "globex")])
def test_a_later_hello_for_another_identity_is_refused(user: str, tenant: str) -> None:
    session = in_state(SessionState.REAUTHENTICATING)
    other = Principal(user=user, tenant=tenant, roles=frozenset({Role.USER}))
    (close,) = session.handle(Authenticated(other))
    assert isinstance(close, Close) and close.code == CloseCode.UNAUTHORIZED
    assert error_of(close) == p.error_frame(
        "h2", ErrorCode.UNAUTHORIZED, "a new hello must carry a token for the same user and tenant"
    )
    assert session.principal == ALICE and session.state is SessionState.CLOSING


def test_a_later_hello_with_a_bad_token_closes() -> None:
    session = in_state(SessionState.REAUTHENTICATING)
    (close,) = session.handle(AuthenticationFailed(ErrorCode.UNAUTHORIZED, "expired", False))
    assert close == Close(
        CloseCode.UNAUTHORIZED, p.error_frame("h2", ErrorCode.UNAUTHORIZED, "expired")
    )


@pytest.mark.parametrize(
    "event",
    [AuthenticationFailed(ErrorCode.UNAVAILABLE, "keys unavailable", True), TokenCheckAbandoned()],
)
def test_a_later_hello_not_checked_keeps_the_current_token(event: Event) -> None:
    session = in_state(SessionState.REAUTHENTICATING)
    actions = session.handle(event)
    if isinstance(event, AuthenticationFailed):
        assert actions == [Reply(p.error_frame("h2", ErrorCode.UNAVAILABLE, "keys unavailable"))]
    else:
        assert actions == []
    assert session.state is SessionState.OPEN and session.principal == ALICE


# --- expiry, the rate gate, sizes and outside closes --------------------------------------


@pytest.mark.parametrize("state", [SessionState.OPEN, SessionState.REAUTHENTICATING])
def test_an_expired_token_closes(state: SessionState) -> None:
    session = in_state(state)
    (close,) = session.handle(TokenExpired())
    assert isinstance(close, Close) and close.code == CloseCode.UNAUTHORIZED
    assert error_of(close)["message"].startswith("token has expired")
    # The token check that was under way no longer matters.
    assert session.handle(Authenticated(ALICE)) == []
    assert session.state is SessionState.CLOSING


def test_a_frame_over_the_rate_is_refused_then_flooding_closes() -> None:
    session = in_state(SessionState.OPEN)
    (refused,) = session.handle(RateExceeded("r", retry_after_s=0.5, flooding=False))
    assert isinstance(refused, Reply)
    assert refused.frame["code"] == "rate_limited" and refused.frame["ref"] == "r"
    assert refused.frame["retry_after_s"] == 0.5
    assert session.state is SessionState.OPEN
    assert session.handle(RateExceeded(None, 0.5, flooding=True)) == [Close(CloseCode.FLOODING)]
    assert session.state is SessionState.CLOSING


@pytest.mark.parametrize(
    "state", [SessionState.AWAITING_HELLO, SessionState.OPEN, SessionState.REAUTHENTICATING]
)
def test_a_frame_too_large_closes(state: SessionState) -> None:
    session = in_state(state)
    assert session.handle(FrameTooLarge()) == [Close(CloseCode.TOO_LARGE)]


def test_an_invalid_frame_on_an_open_session_is_answered() -> None:
    session = in_state(SessionState.OPEN)
    error = ProtocolError(ErrorCode.BAD_REQUEST, "unknown frame type", "q")
    assert session.handle(FrameInvalid(error)) == [Reply(error.to_frame())]
    assert session.state is SessionState.OPEN


def test_the_first_decision_to_close_wins() -> None:
    session = in_state(SessionState.OPEN)
    assert session.handle(CloseRequested(CloseCode.TOO_SLOW)) == [Close(CloseCode.TOO_SLOW)]
    assert session.handle(CloseRequested(CloseCode.RESTART)) == []
    assert session.handle(TokenExpired()) == []
    assert session.handle(RateExceeded(None, 1.0, flooding=True)) == []
    assert session.close_code == CloseCode.TOO_SLOW and session.ending
    session.handle(Disconnected())
    assert session.state is SessionState.CLOSED
    assert session.handle(CloseRequested(CloseCode.GOING_AWAY)) == []


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (SessionState.AWAITING_HELLO, Authenticated(ALICE)),
        (SessionState.AWAITING_HELLO, TokenExpired()),
        (SessionState.AWAITING_HELLO, RateExceeded(None, 1.0, flooding=False)),
        (SessionState.AUTHENTICATING, HelloTimedOut()),
        (SessionState.OPEN, Authenticated(ALICE)),
        (SessionState.OPEN, ConnectionRefused("no")),
        (SessionState.OPEN, HelloTimedOut()),
        (SessionState.REAUTHENTICATING, ConnectionRefused("no")),
        (SessionState.CLOSED, Authenticated(ALICE)),
        (SessionState.CLOSED, TokenExpired()),
    ],
)
def test_an_event_out_of_place_names_what_was_expected(state: SessionState, event: Event) -> None:
    session = in_state(state)
    with pytest.raises(SessionStateError) as raised:
        session.handle(event)
    message = str(raised.value)
    assert message.startswith(f"{state.value}: expected ")
    assert message.endswith(f", got {type(event).__name__}")
    assert session.state is state
