"""CopilotKit's runtime, served by the gateway itself (docs/frontend.md "AG-UI and CopilotKit").

CopilotKit's browser side (`@copilotkit/core`'s `ProxiedCopilotRuntimeAgent`, an AG-UI
`HttpAgent`) talks to a "runtime" at `runtimeUrl` over four REST routes: `GET /info`, and
`POST /agent/{id}/run`, `/connect` and `/stop/{threadId}`. The last three are the gateway's AG-UI
endpoints under CopilotKit's paths; `/info` describes the gateway's agents in CopilotKit's
`RuntimeInfo` shape (SSE mode), so `runtimeUrl` can point at the gateway with no Node runtime in
between.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.resources import Services
from gateway.transport.http_api import JSONBody, authenticate, endpoint

PREFIX = "/v1/copilotkit"


@endpoint
async def runtime_info(request: Request, services: Services) -> Response:
    await authenticate(request, services)
    agents = {}
    for name in services.registry.names():
        graph = services.registry.get(name)
        agents[name] = {
            "name": name,
            "className": "AgentsGatewayAgent",
            "description": f"{name} (graph version {graph.version}) on {services.server_name}",
        }
    return JSONBody(
        {
            "version": services.server_version,
            "agents": agents,
            "audioFileTranscriptionEnabled": False,
            # Plain AG-UI over SSE: CopilotKit's "intelligence" mode is its hosted service.
            "mode": "sse",
        }
    )
