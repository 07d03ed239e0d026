"""Gateway settings, read once from the environment (GATEWAY_*) and validated at start-up.

A bad value stops the server with a message naming the variable (see `load_settings`).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.claims import ClaimMapping, parse_role_map
from gateway.jwks import JwksError, load_jwks_file
from persistence.schema import DEFAULT_DATABASE_URL
from persistence.webhooks import DEFAULT_WEBHOOK_TYPES, WEBHOOK_TYPES

# Shorter secrets are refused: they are the receivers' only proof that a webhook is ours.
MIN_WEBHOOK_SECRET_CHARS = 16

ENV_PREFIX = "GATEWAY_"


class SettingsError(ValueError):
    """Invalid configuration; the message names the offending variable(s)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    # Peers whose X-Forwarded-For / X-Forwarded-Proto are believed (a reverse proxy's address):
    # addresses or networks, comma-separated, `*` for any, empty for none. The client address
    # they give is what the audit trail records.
    forwarded_allow_ips: str = Field("127.0.0.1", max_length=4096)
    # The browser demo and the client package's modules at `/`; off, only the API is served.
    demo_ui: bool = True
    port: int = Field(8000, ge=0, le=65535)
    database_url: str = DEFAULT_DATABASE_URL
    # Migrate the schema to this gateway's revision at start-up; off: refuse to serve any other
    # revision (an operator who migrates as a deployment step, with `python -m gateway migrate`).
    migrate: bool = True
    secret: SecretStr | None = None
    # Token checks (gateway/auth.py): clock skew tolerated on exp/nbf, and the iss/aud a token
    # must carry when set.
    jwt_leeway_s: int = Field(10, ge=0, le=300)
    jwt_issuer: str | None = Field(None, max_length=512)
    jwt_audience: str | None = Field(None, max_length=512)
    # An identity provider's public keys (RS256/ES256), from a file or a URL; at most one.
    jwks_file: str | None = None
    jwks_url: str | None = Field(None, max_length=2048)
    # Fetched keys are used this long before they are fetched again.
    jwks_cache_s: float = Field(300.0, ge=1.0, le=86_400.0)
    # Fetch attempts (an unknown kid, stale keys, a failed fetch) are at least this far apart.
    jwks_refetch_s: float = Field(30.0, ge=0.0, le=3600.0)
    # Where tokens verified with the JWKS keep the user, tenant and roles: dotted claim paths
    # (gateway/claims.py), a fixed tenant for single-tenant deployments, and the provider's
    # role names mapped onto the gateway's (`provider-role=gateway-role,...`).
    jwt_user_claim: str = Field("sub", min_length=1, max_length=256)
    jwt_tenant_claim: str = Field("tenant", min_length=1, max_length=256)
    jwt_roles_claim: str = Field("roles", min_length=1, max_length=256)
    jwt_tenant: str | None = Field(None, min_length=1, max_length=256)
    jwt_role_map: str = Field("", max_length=8192)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    self_approval: bool = False
    # Reviewer rules (gateway/review_rules.py): the requester of a run may not approve its calls.
    four_eyes: bool = False
    # Approvals undecided this long are rejected by the system (0: they wait forever); expired
    # ones are looked for every `approval_sweep_s`.
    approval_ttl_s: float = Field(0.0, ge=0)
    approval_sweep_s: float = Field(5.0, gt=0, le=3600)
    suspend_grace_s: float = Field(15.0, ge=0)
    max_frame_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)
    demo_delay_ms: int = Field(15, ge=0, le=10_000)
    model: str | None = None
    # How OpenAI (or a compatible server) is called: the Responses API or Chat Completions (what
    # most compatible servers speak).
    openai_api: Literal["responses", "chat_completions"] = "responses"
    agents: str | None = None
    heartbeat_s: float = Field(20.0, gt=0)
    hello_timeout_s: float = Field(10.0, gt=0)
    send_queue_size: int = Field(1024, ge=16)
    send_timeout_s: float = Field(5.0, gt=0)
    max_input_chars: int = Field(32_000, ge=1)
    # Outgoing bytes buffered per connection, beside `send_queue_size` frames.
    send_queue_bytes: int = Field(1024 * 1024, ge=64 * 1024)
    # Connection limits of the server (gateway/server_limits.py, docs/configuration.md).
    idle_timeout_s: float = Field(5.0, gt=0, le=3600)
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1024 * 1024)
    max_headers: int = Field(100, ge=8, le=10_000)
    max_connections: int = Field(1000, ge=0)
    # The listen queue; also how many connections asyncio accepts at one wake-up.
    backlog: int = Field(511, ge=1, le=65535)
    # Abuse limits (gateway/limits.py, docs/protocol.md §7); 0 turns one off. Per-user counts
    # are kept per process, and shared with the others over a Redis bus.
    frames_per_s: float = Field(20.0, ge=0)
    frame_burst: int = Field(100, ge=1)
    runs_per_minute: int = Field(30, ge=0)
    max_connections_per_user: int = Field(20, ge=0)
    max_subscriptions: int = Field(100, ge=0)
    max_pending_inputs: int = Field(10, ge=0)
    tracing: bool = False
    # OpenTelemetry spans over OTLP (the `otel` extra; OTEL_EXPORTER_OTLP_* say where to).
    otel: bool = False
    # Prometheus metrics at GET /metrics (docs/operations.md, "Metrics"); off, no route.
    metrics: bool = False
    # Serve GET /metrics on a listener of its own (and not on the gateway's port).
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # While storage fails, a cheap write is tried this often to see whether it is back.
    storage_probe_s: float = Field(5.0, gt=0, le=600)
    # Start on a SQLite file that fails the integrity check (it is reported unready).
    allow_damaged_database: bool = False
    # Identifies this gateway process to its peers on a shared database (run leases). One id
    # runs one process at a time; default: host name and port.
    instance_id: str | None = Field(None, min_length=1, max_length=64)
    lease_ttl_s: float = Field(15.0, ge=1.0, le=3600.0)
    # How often each process looks for runs whose lease expired (default: half the TTL).
    lease_scan_s: float | None = Field(None, ge=0.1, le=3600.0)
    # `serve --workers N` (gateway/workers.py): N processes on one port. Each worker is told
    # the listening socket it inherited, the supervisor's pid (to stop when it is gone) and, in
    # development mode, the signing secret they share.
    workers: int = Field(1, ge=1, le=64)
    listen_fd: int | None = Field(None, ge=0)
    supervisor_pid: int | None = Field(None, ge=1)
    dev_secret: SecretStr | None = None
    # How often to look for events other processes appended to watched threads (0: never,
    # for a single process per database).
    log_watch_interval_s: float = Field(0.5, ge=0.0, le=60.0)
    # How processes on one database wake each other at once: memory:// (one process) or
    # redis://host:port/db (several); the log watch stays as the safety net.
    bus_url: str = "memory://"
    # Prefix of the relay's Redis channel: gateways that share it hear each other.
    bus_prefix: str = Field("agents-gateway", min_length=1, max_length=128)
    # Keep checkpoints and event logs of ended runs this long (0: forever). Approvals, the
    # operation ledger and conversation history are kept regardless.
    retention_s: float = Field(0.0, ge=0.0)
    retention_sweep_s: float = Field(3600.0, gt=0.0)
    # Signed webhooks (docs/protocol.md §10): endpoints (comma-separated http(s) URLs; none:
    # off), the HMAC key, the types announced, and how deliveries are attempted.
    webhook_url: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_secret: SecretStr | None = None
    webhook_events: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_WEBHOOK_TYPES)
    )
    webhook_timeout_s: float = Field(10.0, gt=0, le=300)
    webhook_max_attempts: int = Field(12, ge=1, le=1000)
    # A delivery not taken within this long after its event is given up on.
    webhook_max_age_s: float = Field(86_400.0, gt=0)
    # The first retry's wait, doubled for each further one up to the cap.
    webhook_backoff_s: float = Field(2.0, gt=0, le=3600)
    webhook_max_backoff_s: float = Field(900.0, gt=0, le=86_400)
    # How often to look for retries due and deliveries other processes left.
    webhook_poll_s: float = Field(5.0, gt=0, le=600)
    log_level: str = "info"
    # json: one object per line, with the thread, run, agent and connection ids as keys.
    log_format: Literal["text", "json"] = "text"

    # Read without the GATEWAY_ prefix: the SDK's own variables.
    openai_api_key: SecretStr | None = Field(None, validation_alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().rstrip("/") for item in value.split(",") if item.strip()]
        return value

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

    @field_validator(
        "secret",
        "webhook_secret",
        "openai_api_key",
        "jwt_issuer",
        "jwt_audience",
        "jwks_file",
        "jwks_url",
        "jwt_tenant",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme.split("+", 1)[0] not in {"sqlite", "postgresql", "postgres"}:
            raise ValueError(
                "must be a SQLite or PostgreSQL URL such as sqlite:///./gateway.db "
                "or postgresql://user@host/dbname"
            )
        return value

    @field_validator("bus_url")
    @classmethod
    def _known_bus(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in {"memory", "redis", "rediss", "unix"}:
            raise ValueError("must be memory:// or a Redis URL such as redis://127.0.0.1:6379/0")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError("must be one of critical, error, warning, info, debug")
        return level

    @field_validator("jwks_file")
    @classmethod
    def _readable_jwks(cls, value: str | None) -> str | None:
        # Read now so a bad file stops start-up instead of refusing every token later.
        if value is not None:
            try:
                load_jwks_file(value)
            except JwksError as exc:
                raise ValueError(str(exc)) from None
        return value

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

    @field_validator("jwt_role_map")
    @classmethod
    def _role_map_pairs(cls, value: str) -> str:
        parse_role_map(value)  # raises ValueError naming the bad pair
        return value

    def claim_mapping(self) -> ClaimMapping:
        return ClaimMapping(
            user=self.jwt_user_claim,
            tenant=self.jwt_tenant_claim,
            roles=self.jwt_roles_claim,
            fixed_tenant=self.jwt_tenant,
            role_map=parse_role_map(self.jwt_role_map),
        )

    @field_validator("jwks_url")
    @classmethod
    def _trusted_jwks_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in {"https", "http"} or not parts.hostname:
            raise ValueError("must be an https:// URL")
        # Whoever can alter the key set can mint tokens: plain HTTP only on this machine.
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError("must use https:// (http:// only for a loopback host)")
        if parts.username or parts.password:
            raise ValueError("must not contain credentials")
        return value.strip()

    @model_validator(mode="after")
    def _one_jwks_source(self) -> Settings:
        if self.jwks_file is not None and self.jwks_url is not None:
            raise ValueError("set GATEWAY_JWKS_FILE or GATEWAY_JWKS_URL, not both")
        return self

    @model_validator(mode="after")
    def _dev_mode_is_loopback_only(self) -> Settings:
        if self.dev_mode and not is_loopback(self.host):
            raise ValueError(
                "GATEWAY_SECRET is unset (development tokens), so GATEWAY_HOST must be a "
                f"loopback address, not {self.host!r}; set GATEWAY_SECRET (or a JWKS) to "
                "listen publicly"
            )
        return self

    @model_validator(mode="after")
    def _metrics_listener(self) -> Settings:
        if self.metrics_port is not None and self.workers > 1:
            # Every worker would bind it; one worker's scrape already adds all of them up
            # (docs/operations.md "Several processes").
            raise ValueError(
                "GATEWAY_METRICS_PORT cannot be used with GATEWAY_WORKERS above 1: scrape "
                "GET /metrics on the gateway's port, which any worker answers for all"
            )
        return self

    @model_validator(mode="after")
    def _webhooks_are_signed(self) -> Settings:
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
        return self

    @property
    def jwks_configured(self) -> bool:
        return self.jwks_file is not None or self.jwks_url is not None

    @property
    def dev_mode(self) -> bool:
        # With only a JWKS, tokens come from the identity provider: no made-up secret and no
        # development tokens, which would let anyone mint identities next to the real ones.
        return self.secret is None and not self.jwks_configured

    def resolved_instance_id(self) -> str:
        if self.instance_id:
            return self.instance_id
        if self.port == 0:
            # An ephemeral port names no stable instance: never mistake a peer for ourselves.
            return f"{socket.gethostname()}:ephemeral-{secrets.token_hex(4)}"
        return f"{socket.gethostname()}:{self.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment plus explicit overrides (CLI flags, tests)."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            location = error.get("loc") or ()
            field = str(location[0]) if location else ""
            variable = _variable_name(field)
            problems.append(f"{variable}: {error['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None


def _variable_name(field: str) -> str:
    if field in {"OPENAI_API_KEY", "OPENAI_BASE_URL"}:
        return field
    if not field:
        return "configuration"
    return ENV_PREFIX + field.upper()
