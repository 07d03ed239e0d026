"""Settings of the abuse limits: how much one connection or user may ask."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ERRORS, ErrorCode
from gateway.settings.group import SettingsGroup


class AbuseLimitSettings(SettingsGroup):
    """How many frames, runs, connections, subscriptions and waiting inputs one connection or
    user may have.

    The abuse limits (described in [protocol §7](protocol.md#abuse-limits)) are counted per user
    (tenant and user name) or per connection in the memory of each process, except the pending
    inputs, which are counted in the database, and the runs per minute and connections per user,
    which a Redis bus (`GATEWAY_BUS_URL`) counts across every process. Otherwise several
    processes on one database each apply their own per-user limits."""

    section_key: ClassVar[str] = "abuse"
    section_title: ClassVar[str] = "abuse limits"

    frames_per_s: float = Field(
        20.0,
        ge=0,
        description=(
            "Client frames per second per connection after `hello` (≥ 0, `0` = no limit), refilling"
            " a bucket of `GATEWAY_FRAME_BURST`. Frames over it get `rate_limited` with "
            "`retry_after_s` and are not handled; a client that keeps sending after refusals is "
            f"closed with {int(CloseCode.FLOODING)}. Pongs answering the server's pings are free."
        ),
    )
    frame_burst: int = Field(
        100,
        ge=1,
        description=(
            "Frames (≥ 1) a connection may send at once before `GATEWAY_FRAMES_PER_S` applies; also"
            f" how many refusals are tolerated before the {int(CloseCode.FLOODING)} close. Keep it "
            "above "
            "`GATEWAY_MAX_SUBSCRIPTIONS` so a reconnecting client can resubscribe to everything at "
            "once."
        ),
    )
    runs_per_minute: int = Field(
        30,
        ge=0,
        description=(
            "Runs a user may start in any 60 s (≥ 0, `0` = no limit): `run.start` and `run.input` "
            "that starts a run, over the WebSocket or HTTP (`POST /v1/runs`, `POST "
            "/v1/threads/{thread_id}/input`). Over it: `rate_limited` with `retry_after_s`. Counted"
            " across every process on a Redis bus (`GATEWAY_BUS_URL`), else per process; each "
            "process hears of the others' starts over the bus within milliseconds, so two starts on"
            " two processes inside that moment are both admitted."
        ),
    )
    max_connections_per_user: int = Field(
        20,
        ge=0,
        description=(
            "Open WebSocket connections and SSE feeds per user, counted together (≥ 0, `0` = no "
            "limit); a streaming AI SDK or AG-UI response counts as a feed, also each one on the "
            "AI SDK's WebSocket. One more WebSocket gets `rate_limited` after its `hello` and is "
            f"closed with {int(CloseCode.TOO_MANY_CONNECTIONS)}; one more feed gets "
            f"{int(ERRORS[ErrorCode.RATE_LIMITED].http_status)} `rate_limited` (on the AI SDK's "
            "WebSocket, an `error` for its request). Counted across "
            "every process on a Redis "
            "bus, else per process."
        ),
    )
    max_subscriptions: int = Field(
        100,
        ge=0,
        description=(
            "Thread subscriptions per connection (≥ 0, `0` = no limit), counting those `run.start` "
            "/ `run.input` make; the approval inbox does not count. Over it: `rate_limited`."
        ),
    )
    max_pending_inputs: int = Field(
        10,
        ge=0,
        description=(
            "Inputs that may wait on one thread, `queued` plus `staged` on its active run (≥ 0, `0`"
            " = no limit). Over it: `rate_limited`."
        ),
    )
