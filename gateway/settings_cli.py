"""The settings (gateway/settings/) as operators meet them: `serve`'s flags, built from the
fields of `Settings`, in the sections that `--help` and docs/configuration.md share: one per
group of settings, in the order `Settings` lists its groups.

A flag is named after its field (`jwt_leeway_s`: `--jwt-leeway-s`), parses the field's type and
takes the first sentence of the field's description as its help. Its default is `None`, so an
unset flag leaves the environment (or the field's default) alone, and a flag given wins. The
settings pydantic validates see the flag's value as they would the variable's, so a list,
a URL or a choice is checked in one place whichever way it came.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from gateway.settings import GROUPS, Settings, SettingsGroup, environment_variable


@dataclass(frozen=True)
class Section:
    """Settings that belong together, one group of gateway/settings/: an argument group of
    `serve --help`, and a section of docs/configuration.md (between `<!-- settings: KEY -->` and
    `<!-- /settings -->`)."""

    key: str
    title: str
    fields: tuple[str, ...]
    # The group's docstring (Markdown): its first paragraph is the summary.
    text: str

    @property
    def summary(self) -> str:
        return " ".join(self.text.split("\n\n", 1)[0].split())


def section(group: type[SettingsGroup]) -> Section:
    """The section of settings `group`: its own docstring, key, title and fields."""
    text = vars(group).get("__doc__")
    if not text:
        raise ValueError(f"settings group {group.__name__} has no docstring")
    return Section(
        group.section_key, group.section_title, tuple(group.model_fields), inspect.cleandoc(text)
    )


SECTIONS: tuple[Section, ...] = tuple(section(group) for group in GROUPS)

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
    for each in SECTIONS:
        offered = [name for name in each.fields if flag(name) is not None]
        if offered:
            # Help is plain text, and argparse formats a description with % only for %(prog).
            group = parser.add_argument_group(each.title, _MARKUP.sub("", each.summary))
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
