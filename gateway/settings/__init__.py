"""Gateway settings, read once from the environment (GATEWAY_*) and validated at start-up.

`Settings` is every group of settings together, one module per concern (gateway/settings/*.py,
each a `SettingsGroup` with its fields, their validators and a docstring saying what the group
is about); the rules that need settings of two groups are here. A bad value stops the server
with a message naming the variable (see `load_settings`). Each field's description is what
`serve --help` and docs/configuration.md say of it (both are made from these groups:
gateway/settings_cli.py, gateway/settings_docs.py).
"""

from __future__ import annotations

import secrets
import socket
from typing import Self

from pydantic import ValidationError, model_validator

from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.settings.abuse import AbuseLimitSettings
from gateway.settings.approvals import ApprovalSettings
from gateway.settings.connections import ConnectionSettings
from gateway.settings.group import ENV_PREFIX, SettingsGroup
from gateway.settings.listening import ListeningSettings, is_loopback
from gateway.settings.models import AgentModelSettings
from gateway.settings.observability import ObservabilitySettings
from gateway.settings.openai_sdk import OpenAISettings
from gateway.settings.processes import ProcessSettings
from gateway.settings.retention import RetentionSettings
from gateway.settings.server_limits import ConnectionLimitSettings
from gateway.settings.storage import StorageSettings
from gateway.settings.tokens import TokenSettings
from gateway.settings.webhooks import WebhookSettings

__all__ = [
    "ENV_PREFIX",
    "GROUPS",
    "Settings",
    "SettingsError",
    "SettingsGroup",
    "environment_variable",
    "is_loopback",
    "load_settings",
]


class SettingsError(GatewayError, ValueError):
    """Invalid configuration; the message names the offending variable(s)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL, message)


# The groups in the order `serve --help` and docs/configuration.md show them.
class Settings(
    ListeningSettings,
    StorageSettings,
    TokenSettings,
    ApprovalSettings,
    AgentModelSettings,
    ConnectionSettings,
    AbuseLimitSettings,
    ConnectionLimitSettings,
    RetentionSettings,
    ProcessSettings,
    WebhookSettings,
    ObservabilitySettings,
    OpenAISettings,
):
    @model_validator(mode="after")
    def _dev_mode_is_loopback_only(self) -> Self:
        if self.dev_mode and not is_loopback(self.host):
            raise ValueError(
                "GATEWAY_SECRET is unset (development tokens), so GATEWAY_HOST must be a "
                f"loopback address, not {self.host!r}; set GATEWAY_SECRET (or a JWKS) to "
                "listen publicly"
            )
        return self

    @model_validator(mode="after")
    def _compatible_server_names_its_model(self) -> Self:
        # Without a key the default model is `offline`: a base URL alone would be ignored
        # without a word, and no default name fits every compatible server.
        if self.openai_base_url and self.openai_api_key is None and not self.model:
            raise ValueError(
                "OPENAI_BASE_URL is set but neither GATEWAY_MODEL nor OPENAI_API_KEY is, so the "
                "gateway would stay on its offline demo model: set GATEWAY_MODEL (--model) to a "
                "model the server at OPENAI_BASE_URL serves (no key is needed for a server that "
                "asks for none), or GATEWAY_MODEL=offline to keep the offline model"
            )
        return self

    @model_validator(mode="after")
    def _metrics_listener(self) -> Self:
        if self.metrics_port is not None and self.workers > 1:
            # Every worker would bind it; one worker's scrape already adds all of them up
            # (docs/operations.md "Several processes").
            raise ValueError(
                "GATEWAY_METRICS_PORT cannot be used with GATEWAY_WORKERS above 1: scrape "
                "GET /metrics on the gateway's port, which any worker answers for all"
            )
        return self

    def resolved_instance_id(self) -> str:
        if self.instance_id:
            return self.instance_id
        if self.port == 0:
            # An ephemeral port names no stable instance: never mistake a peer for ourselves.
            return f"{socket.gethostname()}:ephemeral-{secrets.token_hex(4)}"
        return f"{socket.gethostname()}:{self.port}"


GROUPS: tuple[type[SettingsGroup], ...] = tuple(
    base for base in Settings.__bases__ if issubclass(base, SettingsGroup)
)


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


def environment_variable(name: str) -> str:
    """The variable setting `name` is read from."""
    alias = Settings.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else ENV_PREFIX + name.upper()


def _variable_name(field: str) -> str:
    # A field read under an alias is reported under it (the name the error carries).
    if field in Settings.model_fields:
        return environment_variable(field)
    return field or "configuration"
