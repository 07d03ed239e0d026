"""The WebSocket close codes the gateway's clients see (docs/protocol.md §7), with their meaning.

The one place a close code is spelled: the connection closes with these members, and the
AsyncAPI document and the close-code table of docs/protocol.md are generated from them.
"""

from __future__ import annotations

from enum import IntEnum


class CloseCode(IntEnum):
    # Each member is (wire value, meaning); the meaning is Markdown, shown to client authors.
    meaning: str

    def __new__(cls, value: int, meaning: str) -> CloseCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    NORMAL = 1000, "normal close"
    GOING_AWAY = 1001, "the server could not write to the socket any more"
    INVALID_PAYLOAD = (
        1007,
        "a text frame was not valid UTF-8 (the WebSocket layer closes; no error frame first)",
    )
    UPGRADE_REFUSED = (
        1008,
        "the Origin is not allowed (or the upgrade request's headers are over their limits); "
        "because this happens before the upgrade is accepted, the client sees **HTTP 403**",
    )
    TOO_LARGE = (
        1009,
        "a client frame was larger than `GATEWAY_MAX_FRAME_BYTES`; no error frame first",
    )
    INTERNAL = (
        1011,
        "a subscription could not read the thread's log (for example a storage failure); "
        "reconnect and resubscribe with your cursor",
    )
    RESTART = (
        1012,
        "the gateway is restarting or shutting down; reconnect and resubscribe with your cursor",
    )
    TRY_AGAIN = (
        1013,
        "**Addition.** The first hello's token could not be checked because the JWKS could not "
        "be fetched (an `unavailable` error comes first); try again later",
    )
    UNAUTHORIZED = (
        4001,
        "hello missing, late or wrong, unsupported protocol, or invalid token; **addition:** "
        "also when the token expires during the connection, or a later `hello` is refused (§3). "
        "An `error` frame comes first",
    )
    FLOODING = (
        4008,
        "**Addition.** The client kept sending frames after they were refused with "
        "`rate_limited` (§7, Abuse limits); no further error frame comes first",
    )
    TOO_SLOW = (
        4009,
        "the client read too slowly: a frame found the connection's outgoing queue "
        "(`GATEWAY_SEND_QUEUE_SIZE` frames or, **addition**, `GATEWAY_SEND_QUEUE_BYTES` bytes) "
        "full for `GATEWAY_SEND_TIMEOUT_S` seconds, or an `inbox.update` found it full (§2); "
        "reconnect and resubscribe with `after_seq`",
    )
    TOO_MANY_CONNECTIONS = (
        4029,
        "**Addition.** The user already has `GATEWAY_MAX_CONNECTIONS_PER_USER` connections open "
        "to this process; sent right after the hello, with an `error` frame (`rate_limited`, "
        "`ref` = the hello's `id`) first and no `welcome`",
    )
