"""Which model provider a run uses: the offline demo model, or the SDK's multi-provider.

The provider is not stored in a checkpoint (docs/architecture.md "SDK behaviours"), so the gateway
builds it once from settings and passes it in `RunConfig(model_provider=...)` on every run and
every resume.

Offline (`GATEWAY_MODEL=offline`, the default without an API key) replaces the model of every
agent whose model is a name (or unset) with the deterministic demo model; an agent built with a
`Model` object of its own keeps it. Otherwise the SDK's `MultiProvider` resolves names: a plain
name (`gpt-4.1`) or `openai/...` goes to OpenAI or the compatible server at `OPENAI_BASE_URL`,
over the Responses API or Chat Completions (`GATEWAY_OPENAI_API`), and `litellm/<provider>/<model>`
goes through LiteLLM when its extra is installed (`pip install 'openai-agents[litellm]'`).
"""

from __future__ import annotations

from typing import Literal

from agents.models.interface import ModelProvider
from agents.models.multi_provider import MultiProvider
from openai import AsyncOpenAI

from gateway.agents.demo.assistant import OfflineModelProvider

OFFLINE = "offline"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"
OpenAIApi = Literal["responses", "chat_completions"]
# A compatible server that needs no key still gets one: the OpenAI client refuses to start
# without any. It is sent as the bearer token, so it must not look like a real key.
KEYLESS_PLACEHOLDER = "unused"


def build_model_provider(
    *,
    model: str,
    delay_ms: int,
    openai_api_key: str | None,
    openai_base_url: str | None,
    openai_api: OpenAIApi = "responses",
) -> ModelProvider:
    if model == OFFLINE:
        return OfflineModelProvider(delay_ms)
    if openai_api_key is None and openai_base_url is not None:
        openai_api_key = KEYLESS_PLACEHOLDER
    use_responses = openai_api == "responses"
    if openai_api_key is None:
        # No OpenAI access configured: names routed elsewhere (`litellm/...`) still work, and
        # an OpenAI name fails at its first call with the SDK's own message.
        return MultiProvider(openai_use_responses=use_responses)
    client = AsyncOpenAI(api_key=openai_api_key, base_url=openai_base_url)
    return GatewayModelProvider(client, use_responses=use_responses)


class GatewayModelProvider(MultiProvider):
    """The SDK's multi-provider on an OpenAI client of the gateway's own.

    Without one, the SDK's OpenAI provider uses a process-wide HTTP client, bound to the first
    event loop that used it and never closed: an application that starts the gateway twice
    in one process (tests, an embedding host's reload) would reuse a dead connection pool.
    This client lives and closes with the app.
    """

    def __init__(self, client: AsyncOpenAI, *, use_responses: bool) -> None:
        # openai_api_key/openai_base_url are the client's; the multi-provider needs only it.
        super().__init__(openai_client=client, openai_use_responses=use_responses)
        self._client = client

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self._client.close()


def default_model_name(openai_api_key: str | None, configured: str | None) -> str:
    """The configured model, else offline without a key (the gateway must work with no network)."""
    if configured:
        return configured
    return DEFAULT_OPENAI_MODEL if openai_api_key else OFFLINE


def model_of(agent: object, default: str) -> str:
    """What an agent runs on under this provider, for the start-up log: its own model name or
    object, or the configured default for an agent without one."""
    configured = getattr(agent, "model", None)
    if configured is None:
        return default
    if isinstance(configured, str):
        return configured
    return f"{type(configured).__name__} (a model object of the agent)"
