"""Gateway settings, read once from the environment (GATEWAY_*) and validated at start-up.

A bad value stops the server with a message naming the variable (see `load_settings`).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Annotated

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "GATEWAY_"


class SettingsError(ValueError):
    """Invalid configuration; the message names the offending variable(s)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    database_url: str = "sqlite+aiosqlite:///./gateway.db"
    secret: SecretStr | None = None
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    self_approval: bool = False
    suspend_grace_s: float = Field(15.0, ge=0)
    max_frame_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)
    demo_delay_ms: int = Field(15, ge=0, le=10_000)
    model: str | None = None
    agents: str | None = None
    heartbeat_s: float = Field(20.0, gt=0)
    hello_timeout_s: float = Field(10.0, gt=0)
    send_queue_size: int = Field(1024, ge=16)
    send_timeout_s: float = Field(5.0, gt=0)
    max_input_chars: int = Field(32_000, ge=1)
    tracing: bool = False
    # Identifies this gateway process to its peers on a shared database (run leases). One id
    # runs one process at a time; default: host name and port.
    instance_id: str | None = Field(None, min_length=1, max_length=64)
    lease_ttl_s: float = Field(15.0, ge=1.0, le=3600.0)
    # How often to look for events other processes appended to watched threads (0: never,
    # for a single process per database).
    log_watch_interval_s: float = Field(0.5, ge=0.0, le=60.0)
    # Keep checkpoints and event logs of ended runs this long (0: forever). Approvals, the
    # operation ledger and conversation history are kept regardless.
    retention_s: float = Field(0.0, ge=0.0)
    retention_sweep_s: float = Field(3600.0, gt=0.0)
    log_level: str = "info"

    # Read without the GATEWAY_ prefix: the SDK's own variables.
    openai_api_key: SecretStr | None = Field(None, validation_alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().rstrip("/") for item in value.split(",") if item.strip()]
        return value

    @field_validator("secret", "openai_api_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        scheme = value.split("://", 1)[0]
        if "://" not in value or "+" not in scheme:
            raise ValueError(
                "must be an async SQLAlchemy URL such as sqlite+aiosqlite:///./gateway.db "
                "or postgresql+asyncpg://user@host/db"
            )
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError("must be one of critical, error, warning, info, debug")
        return level

    @model_validator(mode="after")
    def _dev_mode_is_loopback_only(self) -> Settings:
        if self.secret is None and not is_loopback(self.host):
            raise ValueError(
                "GATEWAY_SECRET is unset (development tokens), so GATEWAY_HOST must be a "
                f"loopback address, not {self.host!r}; set GATEWAY_SECRET to listen publicly"
            )
        return self

    @property
    def dev_mode(self) -> bool:
        return self.secret is None

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
