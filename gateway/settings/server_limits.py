"""Settings of the limits every connection meets before it is served: timeouts, head sizes,
and how many connections a process holds."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gateway.settings.group import SettingsGroup


class ConnectionLimitSettings(SettingsGroup):
    """How long a connection may take to send a request, how large a request head may be, and how
    many connections a process holds.

    The connection limits apply before a connection is of any use, to HTTP requests and WebSocket
    upgrades alike; their defaults suit a production deployment behind a load balancer or
    directly on the internet. A load balancer that keeps idle connections to the gateway open
    should close them sooner than `GATEWAY_IDLE_TIMEOUT_S`. See
    [operations](operations.md#slow-clients-and-limits)."""

    section_key: ClassVar[str] = "server-limits"
    section_title: ClassVar[str] = "connection limits"

    idle_timeout_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) a connection may stay silent before sending a request: from the"
            " moment it is opened, and between two requests on a keep-alive connection. Then it is "
            "closed."
        ),
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) from a connection's opening (or the end of its previous "
            "response) to a complete request head, however slowly its bytes arrive. Then it is "
            "answered 408 and closed. A WebSocket upgrade is such a request; once upgraded, the "
            "client has `GATEWAY_HELLO_TIMEOUT_S` for its `hello`."
        ),
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) from a complete request head to the end of its body, whether "
            "the endpoint reads the body or answered before it. Then the connection is closed."
        ),
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        le=1024 * 1024,
        description=(
            "Largest request head, in bytes of header lines plus the target (1 KiB to 1 MiB). A "
            "larger one is answered 431 (`bad_request`) and the connection closed after what the "
            "client still sends is read; a WebSocket upgrade is refused (403)."
        ),
    )
    max_headers: int = Field(
        100,
        ge=8,
        le=10_000,
        description=(
            "Most header lines in a request (8 to 10000); more: 431, or 403 for an upgrade."
        ),
    )
    max_connections: int = Field(
        1000,
        ge=0,
        description=(
            "Open connections per process, HTTP and WebSocket together (≥ 0, `0` = no bound). A "
            "connection beyond it is answered `503` (`unavailable`, `Retry-After: 1`) and closed at"
            " once, and one warning per minute says how many were refused. At start-up the gateway "
            "checks that the bound, `GATEWAY_BACKLOG` and a reserve of 64 fit the process's open-"
            "files limit; it raises the soft limit up to the hard one if needed, and if that is "
            "still too small it lowers the bound to fit, with a warning."
        ),
    )
    backlog: int = Field(
        511,
        ge=1,
        le=65535,
        description=(
            "Length of the listen queue (1 to 65535): connections the kernel holds before the "
            "gateway accepts them. asyncio accepts up to this many at a time, so it counts against "
            "the open-files limit too."
        ),
    )
