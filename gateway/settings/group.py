"""What every group of settings shares: the `GATEWAY_` prefix, and the values an empty
variable leaves unset.

Each concern (listening, storage, tokens, ...) is a `SettingsGroup` of its own module, with its
fields and the validators that look at them only; `Settings` (gateway/settings/__init__.py) is
all of them together. A group's docstring says what its settings are about: its first paragraph
heads the group's flags in `serve --help`, and all of it the group's section of
docs/configuration.md (gateway/settings_cli.py, gateway/settings_docs.py).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BeforeValidator, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "GATEWAY_"


def _empty_is_unset(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


# Optional settings for which an empty (or blank) variable counts as unset: `GATEWAY_SECRET=`
# in a deployment's environment file means no secret, not an empty one.
OptionalText = Annotated[str | None, BeforeValidator(_empty_is_unset)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_empty_is_unset)]


class SettingsGroup(BaseSettings):
    """Settings about one concern (the docstring of each subclass says which)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # The group's section: its key in docs/configuration.md's `<!-- settings: KEY -->` markers,
    # and its title, the heading of its flags in `serve --help` and of its table in the document.
    section_key: ClassVar[str]
    section_title: ClassVar[str]
