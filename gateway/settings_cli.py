"""The settings (gateway/settings.py) as operators meet them: `serve`'s flags, built from the
fields of `Settings`, in the sections that `--help` and docs/configuration.md share.

A flag is named after its field (`jwt_leeway_s`: `--jwt-leeway-s`), parses the field's type and
takes the first sentence of the field's description as its help. Its default is `None`, so an
unset flag leaves the environment (or the field's default) alone, and a flag given wins. The
settings pydantic validates see the flag's value as they would the variable's, so a list,
a URL or a choice is checked in one place whichever way it came.
"""

from __future__ import annotations

import argparse
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from gateway.settings import Settings, environment_variable


@dataclass(frozen=True)
class Section:
    """Settings that belong together: an argument group of `serve --help`, and a table of
    docs/configuration.md (between `<!-- settings: KEY -->` and `<!-- /settings -->`)."""

    key: str
    title: str
    fields: tuple[str, ...]


SECTIONS: tuple[Section, ...] = (
    Section("listening", "listening", ("host", "port", "forwarded_allow_ips", "demo_ui")),
    Section(
        "storage",
        "storage",
        ("database_url", "migrate", "storage_probe_s", "allow_damaged_database"),
    ),
    Section(
        "tokens",
        "tokens and origins",
        (
            "secret",
            "jwt_leeway_s",
            "jwt_issuer",
            "jwt_audience",
            "jwks_file",
            "jwks_url",
            "jwks_cache_s",
            "jwks_refetch_s",
            "jwt_user_claim",
            "jwt_tenant_claim",
            "jwt_roles_claim",
            "jwt_tenant",
            "jwt_role_map",
            "allowed_origins",
        ),
    ),
    Section(
        "approvals",
        "approvals",
        ("self_approval", "four_eyes", "approval_ttl_s", "approval_sweep_s"),
    ),
    Section(
        "models",
        "models, agents and runs",
        ("model", "openai_api", "agents", "demo_delay_ms", "suspend_grace_s"),
    ),
    Section(
        "connections",
        "connections",
        (
            "heartbeat_s",
            "hello_timeout_s",
            "max_frame_bytes",
            "send_queue_size",
            "send_timeout_s",
            "send_queue_bytes",
            "max_input_chars",
            "frontend_body_bytes",
            "ai_sdk_replay_window_s",
        ),
    ),
    Section(
        "abuse",
        "abuse limits",
        (
            "frames_per_s",
            "frame_burst",
            "runs_per_minute",
            "max_connections_per_user",
            "max_subscriptions",
            "max_pending_inputs",
        ),
    ),
    Section(
        "server-limits",
        "connection limits",
        (
            "idle_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "max_header_bytes",
            "max_headers",
            "max_connections",
            "backlog",
        ),
    ),
    Section("retention", "retention", ("retention_s", "retention_sweep_s")),
    Section(
        "processes",
        "several processes",
        (
            "instance_id",
            "lease_ttl_s",
            "lease_scan_s",
            "workers",
            "log_watch_interval_s",
            "bus_url",
            "bus_prefix",
            "listen_fd",
            "ready_fd",
            "supervisor_pid",
            "dev_secret",
        ),
    ),
    Section(
        "webhooks",
        "webhooks",
        (
            "webhook_url",
            "webhook_secret",
            "webhook_events",
            "webhook_timeout_s",
            "webhook_max_attempts",
            "webhook_max_age_s",
            "webhook_backoff_s",
            "webhook_max_backoff_s",
            "webhook_poll_s",
            "webhook_allow_link_local",
        ),
    ),
    Section(
        "observability",
        "logs, traces and metrics",
        ("log_level", "log_format", "tracing", "otel", "metrics", "metrics_port", "metrics_host"),
    ),
    Section("openai", "OpenAI", ("openai_api_key", "openai_base_url")),
)

_VISIBLE_TO_ALL = "a command line is visible to every user of the machine (`ps`)"
_FOR_EACH_WORKER = "the `serve --workers` supervisor sets it for each worker"
# Settings read from the environment only, and why.
ENVIRONMENT_ONLY: Mapping[str, str] = MappingProxyType(
    {
        "secret": _VISIBLE_TO_ALL,
        "webhook_secret": _VISIBLE_TO_ALL,
        "openai_api_key": _VISIBLE_TO_ALL,
        "openai_base_url": "the SDK's own variable, read where the SDK reads it",
        "listen_fd": _FOR_EACH_WORKER,
        "ready_fd": _FOR_EACH_WORKER,
        "supervisor_pid": _FOR_EACH_WORKER,
        "dev_secret": _FOR_EACH_WORKER,
    }
)
# Booleans that are on by default: their flag switches them off.
SWITCH_OFF_FLAGS: Mapping[str, str] = MappingProxyType(
    {"demo_ui": "--no-demo", "migrate": "--no-migrate"}
)
# What such a flag does, in its own words: the setting's description says what the setting
# does when on, which under `--no-…` would read as the opposite of the flag.
SWITCH_OFF_HELP: Mapping[str, str] = MappingProxyType(
    {
        "demo_ui": "Do not serve the browser demo and the client package's modules at /.",
        "migrate": "Do not migrate the schema at start-up (it must be at this gateway's revision).",
    }
)
# Defaults worked out at start-up: described, as the field's own default says nothing.
DESCRIBED_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "model": "`offline`, or `gpt-4.1-mini` when `OPENAI_API_KEY` is set",
        "agents": "unset (the demo agent `assistant`)",
        "instance_id": "`<host name>:<port>`; with port `0`, "
        "`<host name>:ephemeral-<8 random hex digits>`, new at every start",
        "lease_scan_s": "half of `GATEWAY_LEASE_TTL_S`",
        "webhook_url": "unset (no webhooks)",
    }
)
# The end of a description's first sentence: a full stop before the next one's capital.
_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z`])")
_MARKUP = re.compile(r"`")


def flag(name: str) -> str | None:
    """The `serve` flag of setting `name`; `None` for one read from the environment only."""
    if name in ENVIRONMENT_ONLY:
        return None
    return SWITCH_OFF_FLAGS.get(name, "--" + name.replace("_", "-"))


def flags(names: tuple[str, ...]) -> frozenset[str]:
    """The flags of these settings (each must have one)."""
    found = {name: flag(name) for name in names}
    missing = [name for name, given in found.items() if given is None]
    if missing:
        raise ValueError(f"settings offered in the environment only: {', '.join(missing)}")
    return frozenset(given for given in found.values() if given is not None)


def shown_default(name: str) -> str:
    """The default of setting `name` as the documentation shows it (Markdown)."""
    if name in DESCRIBED_DEFAULTS:
        return DESCRIBED_DEFAULTS[name]
    value = Settings.model_fields[name].get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, list):
        return f"`{','.join(value)}`" if value else "empty"
    return f"`{value}`" if str(value) else "empty"


def summary(name: str) -> str:
    """The first sentence of setting `name`'s description."""
    return _SENTENCE_END.split(description(name), maxsplit=1)[0]


def description(name: str) -> str:
    text = Settings.model_fields[name].description
    if not text:
        raise ValueError(f"setting {name} has no description")
    return text


def add_setting_flag(parser: argparse._ActionsContainer, name: str) -> None:
    """Add setting `name`'s flag to `parser` (a command or one of its argument groups)."""
    given = flag(name)
    if given is None:
        raise ValueError(f"{name} is offered in the environment only: {ENVIRONMENT_ONLY[name]}")
    variable = environment_variable(name)
    kind = value_type(Settings.model_fields[name])
    switch_off = name in SWITCH_OFF_FLAGS
    if switch_off:
        help_text = f"{SWITCH_OFF_HELP[name]} [sets {variable}=false; without it: true]"
    elif kind is bool:
        help_text = f"{summary(name)} [sets {variable}=true, default: {shown_default(name)}]"
    else:
        help_text = f"{summary(name)} [{variable}, default: {shown_default(name)}]"
    # Help is plain text, and argparse formats it with %.
    help_text = _MARKUP.sub("", help_text).replace("%", "%%")
    if kind is bool:
        action = "store_false" if switch_off else "store_true"
        parser.add_argument(given, dest=name, action=action, default=None, help=help_text)
    else:
        parser.add_argument(given, dest=name, type=kind, default=None, help=help_text)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """Add every setting's flag, an argument group per section, to `parser` (`serve`)."""
    for section in SECTIONS:
        offered = [name for name in section.fields if flag(name) is not None]
        if offered:
            group = parser.add_argument_group(section.title)
            for name in offered:
                add_setting_flag(group, name)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave (flags not given are left out)."""
    return {
        name: value
        for name, value in vars(args).items()
        if name in Settings.model_fields and value is not None
    }


def value_type(field: FieldInfo) -> type:
    """What a flag's value is parsed as before pydantic validates it: bool, int, float or str
    (lists, URLs and choices arrive as the text a variable would hold)."""
    kinds: list[type] = [kind for kind in _alternatives(field.annotation) if kind is not type(None)]
    if len(kinds) == 1 and kinds[0] in (bool, int, float):
        return kinds[0]
    return str


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)
