"""Settings of what runs run on: the model, the agent registry, and unwatched runs."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gateway.settings.group import SettingsGroup


class AgentModelSettings(SettingsGroup):
    """The model and the agent registry runs use, the offline model's pace, and when a run
    nobody watches is suspended."""

    section_key: ClassVar[str] = "models"
    section_title: ClassVar[str] = "models, agents and runs"

    model: str | None = Field(
        None,
        description=(
            "Model name. `offline` selects the deterministic offline model for every agent whose "
            "model is a name or unset. Any other name selects the SDK's multi-provider: a plain "
            "name or `openai/<name>` goes to OpenAI (or the server at `OPENAI_BASE_URL`), "
            "`litellm/<provider>/<model>` through LiteLLM (`pip install 'openai-agents[litellm]'`)."
            " The name is used by the demo agent and is passed as `model_name` to an agent registry"
            " factory (see docs/agents.md); the start-up log says, for every graph, which model its"
            " starting agent runs on and through what."
        ),
    )
    openai_api: Literal["responses", "chat_completions"] = Field(
        "responses",
        description=(
            "How OpenAI or a compatible server is called: `responses` (the Responses API) or "
            "`chat_completions` (what most compatible servers speak)."
        ),
    )
    agents: str | None = Field(
        None,
        description=(
            "Your agent registry as `package.module:attribute`: an `AgentRegistry`, or a callable "
            "returning one. The module must be importable (the project root when started through "
            "`dev.py`, otherwise set `PYTHONPATH`)."
        ),
    )
    demo_delay_ms: int = Field(
        15,
        ge=0,
        le=10_000,
        description=(
            "Pause between the offline model's text deltas (0 to 10000 ms); `0` streams as fast as "
            "possible."
        ),
    )
    suspend_grace_s: float = Field(
        15.0,
        ge=0,
        description=(
            'Seconds (≥ 0) a streaming `on_disconnect: "suspend"` run may go unwatched (watchers '
            "are counted in the process that executes it) before it is checkpointed at its next "
            "turn boundary and suspended (`run.paused` reason `disconnect`). A new watcher "
            "continues it."
        ),
    )
