"""Settings read under the OpenAI Agents SDK's own variable names: its key and base URL."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gateway.settings.group import OptionalSecret, SettingsGroup


class OpenAISettings(SettingsGroup):
    """The SDK's own variables, read without the `GATEWAY_` prefix: how the gateway reaches
    OpenAI or a compatible server.

    Neither has a CLI flag: `OPENAI_API_KEY` because command lines are visible to every user of
    the machine (`ps`)."""

    section_key: ClassVar[str] = "openai"
    section_title: ClassVar[str] = "OpenAI"

    openai_api_key: OptionalSecret = Field(
        None,
        validation_alias="OPENAI_API_KEY",
        description=(
            "API key for OpenAI or a compatible server. Setting it changes the default model from "
            "`offline` to `gpt-4.1-mini`. An empty value counts as unset."
        ),
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias="OPENAI_BASE_URL",
        description=(
            "Base URL of an OpenAI-compatible server (one that serves the Responses API, or Chat "
            "Completions with `GATEWAY_OPENAI_API=chat_completions`), for example "
            "`http://localhost:8080/v1`. Without `OPENAI_API_KEY` it needs `GATEWAY_MODEL` (a "
            "model the server serves; no key is sent but a placeholder): the gateway refuses to "
            "start with the base URL alone rather than stay offline without a word."
        ),
    )
