"""The WebSocket connection's protocol state machine (docs/protocol.md §2-§3, §7), sans I/O.

Events go in as values (a parsed frame, a token check's outcome, the token's expiry, a frame
over the rate) and actions come out as values (a frame to send, a token to check, a request
to perform, the close and its last word). The socket, the timers and the storage stay with
the adapter (gateway/transport/ws_connection.py), so every rule here is testable without a server.

    AWAITING_HELLO    --hello-->             AUTHENTICATING (the token is checked)
    AUTHENTICATING    --authenticated-->     OPEN (welcome)
    OPEN              --hello-->             REAUTHENTICATING (the new token is checked)
    REAUTHENTICATING  --same identity-->     OPEN (welcome, with the new roles and expiry)
    any but CLOSED    --refusal, expiry,
                        flooding, close-->   CLOSING (the close code is decided, once)
    any               --disconnected-->      CLOSED

A client's mistake is answered on the wire (an error frame, or a close with its code); an
event the adapter should never feed in the current state raises `SessionStateError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gateway.protocol import frames as protocol
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import CodedError, ErrorCode, close_code_for
from gateway.protocol.frames import ProtocolError
from gateway.protocol.identity import Principal


class Closed(CodedError):
    """The connection is over; stop reading."""


class SessionState(Enum):
    AWAITING_HELLO = "awaiting hello"
    AUTHENTICATING = "authenticating"
    OPEN = "open"
    REAUTHENTICATING = "reauthenticating"
    CLOSING = "closing"
    CLOSED = "closed"


# --- events in -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameArrived:
    frame: protocol.ClientFrame


@dataclass(frozen=True)
class FrameInvalid:
    """A text frame that did not parse (`bad_request`, `too_large`, ...)."""

    error: ProtocolError


@dataclass(frozen=True)
class HelloTimedOut:
    pass


@dataclass(frozen=True)
class Authenticated:
    """The hello's token is valid; `principal` carries the client's address already."""

    principal: Principal


@dataclass(frozen=True)
class AuthenticationFailed:
    code: ErrorCode
    message: str
    # The token could not be checked right now (the identity provider is unreachable).
    unavailable: bool


@dataclass(frozen=True)
class TokenCheckAbandoned:
    """A later hello's token check broke unexpectedly: the adapter answers `internal` and the
    current token still holds."""


@dataclass(frozen=True)
class ConnectionRefused:
    """The user already has as many connections as allowed."""

    message: str


@dataclass(frozen=True)
class TokenExpired:
    pass


@dataclass(frozen=True)
class RateExceeded:
    """A frame over the connection's rate, not handled (`ref`: its id, if it had one)."""

    ref: str | None
    retry_after_s: float
    # The client went on sending long after being refused.
    flooding: bool


@dataclass(frozen=True)
class FrameTooLarge:
    pass


@dataclass(frozen=True)
class CloseRequested:
    """Closing decided outside the frames: a slow reader, a shutdown, a failed subscription."""

    code: CloseCode


@dataclass(frozen=True)
class Disconnected:
    pass


Event = (
    FrameArrived
    | FrameInvalid
    | HelloTimedOut
    | Authenticated
    | AuthenticationFailed
    | TokenCheckAbandoned
    | ConnectionRefused
    | TokenExpired
    | RateExceeded
    | FrameTooLarge
    | CloseRequested
    | Disconnected
)


# --- actions out ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    frame: dict[str, Any]


@dataclass(frozen=True)
class Authenticate:
    """Check `token`, then feed `Authenticated`, `AuthenticationFailed` or (first hello only)
    `ConnectionRefused`."""

    token: str
    first: bool


@dataclass(frozen=True)
class Open:
    """The first hello succeeded: send `welcome`, start writing and arm the token's expiry."""

    welcome: dict[str, Any]
    principal: Principal


@dataclass(frozen=True)
class Renewed:
    """A later hello renewed the token: queue `welcome`, re-arm the expiry, and if the roles
    changed end what the new ones no longer allow."""

    welcome: dict[str, Any]
    principal: Principal
    roles_changed: bool


@dataclass(frozen=True)
class Perform:
    """A client request to carry out (thread.create, thread.subscribe, run.start, ...)."""

    frame: protocol.ClientFrame
    principal: Principal


@dataclass(frozen=True)
class Close:
    """End the connection with `code`, after `last_word` if any (queued frames are dropped:
    they were meant for a connection that no longer holds)."""

    code: CloseCode
    last_word: dict[str, Any] | None = None


Action = Reply | Authenticate | Open | Renewed | Perform | Close


class SessionStateError(CodedError):
    """An event the session cannot take in its state: a bug in the adapter, not the client."""

    def __init__(self, state: SessionState, expected: str, arrived: str) -> None:
        super().__init__(f"{state.value}: expected {expected}, got {arrived}")
        self.state = state


@dataclass(frozen=True)
class ServerIdentity:
    """What a `welcome` tells the client about this server."""

    name: str
    version: str
    heartbeat_s: float


_EXPECTED = {
    SessionState.AWAITING_HELLO: "a hello frame",
    SessionState.AUTHENTICATING: "the outcome of the hello's token check",
    SessionState.OPEN: "a client frame",
    SessionState.REAUTHENTICATING: "the outcome of the new hello's token check",
    SessionState.CLOSING: "nothing but the end of the connection",
    SessionState.CLOSED: "nothing: the connection is closed",
}


def _describe(event: Event) -> str:
    if isinstance(event, FrameArrived):
        return f"a {event.frame.type} frame"
    return type(event).__name__


class ConnectionSession:
    def __init__(self, server: ServerIdentity) -> None:
        self._server = server
        self._state = SessionState.AWAITING_HELLO
        self._principal: Principal | None = None
        self._close_code: CloseCode | None = None
        # The id of the hello whose token is being checked, for the answer's `ref`.
        self._hello_ref: str | None = None
        # What the first hello asked to leave out of the connection's subscriptions.
        self._omit: list[str] = []
        self.omitted_events: frozenset[str] = frozenset()

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def principal(self) -> Principal | None:
        """The authenticated caller, once the first hello succeeded."""
        return self._principal

    @property
    def close_code(self) -> CloseCode | None:
        """The code the connection closes with, once closing began (the first decision wins)."""
        return self._close_code

    @property
    def ending(self) -> bool:
        return self._state in (SessionState.CLOSING, SessionState.CLOSED)

    def handle(self, event: Event) -> list[Action]:
        state = self._state
        if isinstance(event, Disconnected):
            self._state = SessionState.CLOSED
            return []
        if isinstance(event, CloseRequested):
            return self._close(event.code, None) if not self.ending else []
        if state is SessionState.CLOSING:
            # In flight when the close began (a frame read, a token check): nobody will see
            # an answer.
            return []
        match state, event:
            case SessionState.AWAITING_HELLO, FrameArrived(frame=protocol.Hello() as hello):
                self._omit = sorted(set(hello.omit or ()))
                self.omitted_events = hello.omitted_events()
                return self._hello(hello, first=True)
            case SessionState.AWAITING_HELLO, FrameArrived(frame=frame):
                refusal = protocol.error_frame(
                    frame.id, ErrorCode.UNAUTHORIZED, "the first frame must be hello"
                )
                return self._close(close_code_for(ErrorCode.UNAUTHORIZED), refusal)
            case SessionState.AWAITING_HELLO, FrameInvalid(error=error):
                return self._close(close_code_for(error.code), error.to_frame())
            case SessionState.AWAITING_HELLO, HelloTimedOut():
                refusal = protocol.error_frame(
                    None, ErrorCode.UNAUTHORIZED, "no hello within the timeout"
                )
                return self._close(close_code_for(ErrorCode.UNAUTHORIZED), refusal)
            case SessionState.AUTHENTICATING, Authenticated(principal=principal):
                self._state = SessionState.OPEN
                self._principal = principal
                return [Open(self._welcome(principal), principal)]
            case SessionState.AUTHENTICATING, AuthenticationFailed() as failed:
                refusal = protocol.error_frame(self._hello_ref, failed.code, failed.message)
                # `unauthorized`, or `unavailable` when the identity provider's keys were not
                # fetched: the table tells them apart.
                return self._close(close_code_for(failed.code), refusal)
            case SessionState.AUTHENTICATING, ConnectionRefused(message=message):
                refusal = protocol.error_frame(self._hello_ref, ErrorCode.RATE_LIMITED, message)
                return self._close(close_code_for(ErrorCode.RATE_LIMITED), refusal)
            case SessionState.OPEN, FrameArrived(frame=frame):
                return self._request(frame)
            case SessionState.OPEN, FrameInvalid(error=error):
                if error.code == ErrorCode.UNAUTHORIZED:
                    # A later hello whose token cannot be one: refused as any refused token.
                    return self._close(close_code_for(ErrorCode.UNAUTHORIZED), error.to_frame())
                return [Reply(error.to_frame())]
            case SessionState.OPEN, RateExceeded() as over:
                if over.flooding:
                    return self._close(CloseCode.FLOODING, None)
                refusal = protocol.error_frame(
                    over.ref,
                    ErrorCode.RATE_LIMITED,
                    "too many frames on this connection; slow down",
                )
                return [Reply(refusal | {"retry_after_s": over.retry_after_s})]
            case SessionState.REAUTHENTICATING, Authenticated(principal=principal):
                return self._renew(principal)
            case SessionState.REAUTHENTICATING, AuthenticationFailed() as failed:
                if failed.unavailable:
                    # The current token still holds: the client may retry.
                    self._state = SessionState.OPEN
                    return [
                        Reply(protocol.error_frame(self._hello_ref, failed.code, failed.message))
                    ]
                refusal = protocol.error_frame(
                    self._hello_ref, ErrorCode.UNAUTHORIZED, failed.message
                )
                return self._close(close_code_for(ErrorCode.UNAUTHORIZED), refusal)
            case SessionState.REAUTHENTICATING, TokenCheckAbandoned():
                self._state = SessionState.OPEN
                return []
            case SessionState.OPEN | SessionState.REAUTHENTICATING, TokenExpired():
                refusal = protocol.error_frame(
                    None,
                    ErrorCode.UNAUTHORIZED,
                    "token has expired; send a new hello with a fresh token before it expires",
                )
                return self._close(close_code_for(ErrorCode.UNAUTHORIZED), refusal)
            case (
                SessionState.AWAITING_HELLO | SessionState.OPEN | SessionState.REAUTHENTICATING,
                FrameTooLarge(),
            ):
                return self._close(CloseCode.TOO_LARGE, None)
        raise SessionStateError(state, _EXPECTED[state], _describe(event))

    def _hello(self, hello: protocol.Hello, *, first: bool) -> list[Action]:
        """Both hellos: the protocol version, then the token."""
        if hello.protocol != protocol.PROTOCOL_VERSION:
            message = (
                f"protocol {hello.protocol} is not supported; this server speaks "
                f"{protocol.PROTOCOL_VERSION}"
            )
            refusal = protocol.error_frame(hello.id, ErrorCode.UNSUPPORTED_PROTOCOL, message)
            return self._close(close_code_for(ErrorCode.UNSUPPORTED_PROTOCOL), refusal)
        self._hello_ref = hello.id
        self._state = SessionState.AUTHENTICATING if first else SessionState.REAUTHENTICATING
        return [Authenticate(hello.token, first=first)]

    def _request(self, frame: protocol.ClientFrame) -> list[Action]:
        principal = self._principal
        assert principal is not None
        match frame:
            case protocol.Hello():
                return self._hello(frame, first=False)
            case protocol.Ping(id=ref):
                return [Reply(protocol.pong() | ({"ref": ref} if ref else {}))]
            case protocol.Pong():
                return []
        return [Perform(frame, principal)]

    def _renew(self, principal: Principal) -> list[Action]:
        """A later hello: same user and tenant, new roles and expiry."""
        current = self._principal
        assert current is not None
        if (principal.user, principal.tenant) != (current.user, current.tenant):
            # Subscriptions, the connection slot and runs started here belong to the first
            # identity: switching identity needs a new connection.
            refusal = protocol.error_frame(
                self._hello_ref,
                ErrorCode.UNAUTHORIZED,
                "a new hello must carry a token for the same user and tenant",
            )
            return self._close(close_code_for(ErrorCode.UNAUTHORIZED), refusal)
        principal = dataclasses.replace(principal, source=current.source)
        self._principal = principal
        self._state = SessionState.OPEN
        ref = self._hello_ref
        welcome = self._welcome(principal) | ({"ref": ref} if ref else {})
        roles_changed = (principal.roles, principal.extra_roles) != (
            current.roles,
            current.extra_roles,
        )
        return [Renewed(welcome, principal, roles_changed)]

    def _welcome(self, principal: Principal) -> dict[str, Any]:
        return protocol.welcome(
            user=principal.user,
            tenant=principal.tenant,
            # The core roles and the reviewer roles the agent graphs name (`finance`), as the
            # token carries them: a client shows what its user may decide.
            roles=sorted({*map(str, principal.roles), *principal.extra_roles}),
            heartbeat_s=self._server.heartbeat_s,
            server_name=self._server.name,
            server_version=self._server.version,
            omit=self._omit,
        )

    def _close(self, code: CloseCode, last_word: dict[str, Any] | None) -> list[Action]:
        self._state = SessionState.CLOSING
        self._close_code = code
        return [Close(code, last_word)]
