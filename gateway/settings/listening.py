"""Settings of the listening socket: address, port, the reverse proxies believed, the demo."""

from __future__ import annotations

import ipaddress
from typing import ClassVar

from pydantic import Field, field_validator

from gateway.settings.group import SettingsGroup


class ListeningSettings(SettingsGroup):
    """Where the gateway listens, which reverse proxies it believes, and whether it serves the
    browser demo."""

    section_key: ClassVar[str] = "listening"
    section_title: ClassVar[str] = "listening"

    host: str = Field(
        "127.0.0.1",
        description=(
            "Listen address. Must be a loopback address (`127.0.0.0/8`, `::1`, `localhost`) in "
            "development mode (neither `GATEWAY_SECRET` nor a JWKS set)."
        ),
    )
    port: int = Field(
        8000,
        ge=0,
        le=65535,
        description="Listen port, 0-65535; `0` picks any free port.",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        max_length=4096,
        description=(
            "Peers whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed: the addresses or "
            "networks of your reverse proxies, comma-separated (`10.0.0.0/8,192.168.1.5`), `*` for "
            "any peer (only when nothing but the proxy can reach the gateway), empty for none. The "
            "client address they forward is the one the audit trail records. Anything that is not "
            "an address, a network or `*` stops start-up."
        ),
    )
    demo_ui: bool = Field(
        True,
        description=(
            "Serve the browser demo and the client package's modules at `/`. Off, the gateway "
            "serves its API only (what an application that embeds the gateway wants)."
        ),
    )

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses_or_networks(cls, value: str) -> str:
        items = [item.strip() for item in value.split(",") if item.strip()]
        for item in items:
            if item == "*":
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (or *)") from None
        return ",".join(items)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
