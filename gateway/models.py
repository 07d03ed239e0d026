"""Which model provider a run uses: the offline demo model or OpenAI (or a compatible server).

The provider is not stored in a checkpoint (docs/architecture.md "SDK behaviours"), so the gateway
builds it once from settings and passes it in `RunConfig(model_provider=...)` on every run and
every resume.
"""

from __future__ import annotations

from agents.models.interface import ModelProvider
from agents.models.openai_provider import OpenAIProvider

from gateway.demo import OfflineModelProvider

OFFLINE = "offline"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"


def build_model_provider(
    *,
    model: str,
    delay_ms: int,
    openai_api_key: str | None,
    openai_base_url: str | None,
) -> ModelProvider:
    if model == OFFLINE:
        return OfflineModelProvider(delay_ms)
    return OpenAIProvider(api_key=openai_api_key, base_url=openai_base_url, use_responses=True)


def default_model_name(openai_api_key: str | None, configured: str | None) -> str:
    """The configured model, else offline without a key (the gateway must work with no network)."""
    if configured:
        return configured
    return DEFAULT_OPENAI_MODEL if openai_api_key else OFFLINE
