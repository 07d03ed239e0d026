"""Settings of webhooks: where signed notifications of run events go, and how they are retried."""

from __future__ import annotations

from typing import Annotated, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from gateway.settings.group import OptionalSecret, SettingsGroup
from persistence.webhook_targets import forbidden_host
from persistence.webhooks import DEFAULT_WEBHOOK_TYPES, WEBHOOK_TYPES

# Shorter secrets are refused: they are the receivers' only proof that a webhook is ours.
MIN_WEBHOOK_SECRET_CHARS = 16


class WebhookSettings(SettingsGroup):
    """Signed HTTP notifications of run events to your endpoints (docs/protocol.md §10): where
    they go, which events, and how failed deliveries are retried."""

    section_key: ClassVar[str] = "webhooks"
    section_title: ClassVar[str] = "webhooks"

    webhook_url: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Endpoints that receive signed webhooks (docs/protocol.md §10), comma-separated; each "
            "an `http://` or `https://` URL with a host and without credentials, none twice. Every "
            "endpoint gets every type in `GATEWAY_WEBHOOK_EVENTS`. Logs name only an endpoint's "
            "host and port, never its path or query."
        ),
    )
    webhook_secret: OptionalSecret = Field(
        None,
        description=(
            "The HMAC-SHA256 key webhooks are signed with (at least 16 characters); required when "
            "`GATEWAY_WEBHOOK_URL` is set. Never logged."
        ),
    )
    webhook_events: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_WEBHOOK_TYPES),
        description="The webhook types sent, comma-separated, from those and `run.cancelled`.",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description=(
            "Seconds (0 < s ≤ 300) an attempt may take, from connecting to the end of the answer; "
            "longer counts as a failed attempt."
        ),
    )
    webhook_max_attempts: int = Field(
        12,
        ge=1,
        le=1000,
        description=(
            "Attempts (1-1000) before a delivery is given up (kept as `failed`, with a warning)."
        ),
    )
    webhook_max_age_s: float = Field(
        86_400.0,
        gt=0,
        description=(
            "Seconds (> 0) after its event past which a delivery is not attempted again, however "
            "few attempts it had."
        ),
    )
    webhook_backoff_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) before the first retry; each further retry waits twice as long,"
            " each wait drawn between half and all of it."
        ),
    )
    webhook_max_backoff_s: float = Field(
        900.0,
        gt=0,
        le=86_400,
        description="The longest wait between two attempts (0 < s ≤ 86400).",
    )
    webhook_poll_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description=(
            "Seconds (0 < s ≤ 600) between looks for retries falling due and for deliveries other "
            "processes left; a commit that adds deliveries wakes its own process at once."
        ),
    )
    webhook_allow_link_local: bool = Field(
        False,
        description=(
            "Allow webhook endpoints in the link-local ranges (169.254.0.0/16, fe80::/10), where "
            "cloud machines reach their metadata service and its credentials, and at the metadata "
            "services' other names and addresses. Off: such a URL refuses start-up, and a delivery "
            "to a name that resolves there fails (`forbidden address`)."
        ),
    )

    @field_validator("webhook_url", "webhook_events", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("webhook_url")
    @classmethod
    def _http_endpoints(cls, value: list[str]) -> list[str]:
        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
            if parts.username or parts.password:
                # Logged hosts would be safe, but the URL is stored with every delivery.
                raise ValueError("must not contain credentials (receivers check the signature)")
        if len(set(value)) != len(value):
            raise ValueError("names an endpoint twice")
        return value

    @field_validator("webhook_events")
    @classmethod
    def _known_webhook_events(cls, value: list[str]) -> list[str]:
        unknown = [item for item in value if item not in WEBHOOK_TYPES]
        if unknown:
            raise ValueError(
                f"unknown webhook event type(s) {', '.join(unknown)}: "
                f"choose from {', '.join(WEBHOOK_TYPES)}"
            )
        if not value:
            raise ValueError(f"must name at least one of {', '.join(WEBHOOK_TYPES)}")
        return value

    @model_validator(mode="after")
    def _webhooks_are_signed(self) -> Self:
        if not self.webhook_url:
            return self
        if self.webhook_secret is None:
            raise ValueError(
                "GATEWAY_WEBHOOK_URL is set, so GATEWAY_WEBHOOK_SECRET must be too (the key "
                "receivers verify each webhook's signature with)"
            )
        if len(self.webhook_secret.get_secret_value()) < MIN_WEBHOOK_SECRET_CHARS:
            raise ValueError(
                f"GATEWAY_WEBHOOK_SECRET must be at least {MIN_WEBHOOK_SECRET_CHARS} characters"
            )
        if not self.webhook_allow_link_local:
            for url in self.webhook_url:
                host = urlsplit(url).hostname or ""
                if forbidden_host(host):
                    raise ValueError(
                        f"GATEWAY_WEBHOOK_URL names {host}, a link-local or cloud metadata "
                        "address: set GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL=true if a receiver "
                        "really lives there"
                    )
        return self
