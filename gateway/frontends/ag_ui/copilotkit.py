"""CopilotKit's runtime, served by the gateway itself (docs/frontend.md "AG-UI and CopilotKit").

CopilotKit's browser side (`@copilotkit/core`'s `ProxiedCopilotRuntimeAgent`, an AG-UI
`HttpAgent`) talks to a "runtime" at `runtimeUrl`: over four REST routes (`GET /info`, and
`POST /agent/{id}/run`, `/connect` and `/stop/{threadId}`), or over one route whose envelope
names the operation (`{"method": "agent/run", "params": {"agentId"}, "body": RunAgentInput}`).
Run, connect and stop are the gateway's AG-UI operations; this module describes the gateway's
agents in CopilotKit's `RuntimeInfo` shape (SSE mode) and reads the single route's envelope, so
`runtimeUrl` can point at the gateway with no Node runtime in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.resources import Services

PREFIX = "/v1/copilotkit"
METHODS = ("info", "agent/run", "agent/connect", "agent/stop")


def runtime_info(services: Services) -> dict[str, Any]:
    agents = {}
    for name in services.registry.names():
        graph = services.registry.get(name)
        agents[name] = {
            "name": name,
            "className": "AgentsGatewayAgent",
            "description": f"{name} (graph version {graph.version}) on {services.server_name}",
        }
    return {
        "version": services.server_version,
        "agents": agents,
        "audioFileTranscriptionEnabled": False,
        # Plain AG-UI over SSE: CopilotKit's "intelligence" mode is its hosted service.
        "mode": "sse",
    }


@dataclass(frozen=True)
class SingleRouteRequest:
    method: str
    agent_id: Any
    thread_id: Any
    body: dict[str, Any]


def single_route_request(envelope: dict[str, Any]) -> SingleRouteRequest:
    """The single route's envelope, or `bad_request` naming what is wrong."""
    method = envelope.get("method")
    if method not in METHODS:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"method must be one of {', '.join(METHODS)}")
    params = envelope.get("params") or {}
    body = envelope.get("body") or {}
    if not isinstance(params, dict) or not isinstance(body, dict):
        raise GatewayError(ErrorCode.BAD_REQUEST, "params and body must be JSON objects")
    if method != "info" and not isinstance(params.get("agentId"), str):
        raise GatewayError(ErrorCode.BAD_REQUEST, "params.agentId must be a string")
    return SingleRouteRequest(method, params.get("agentId"), params.get("threadId"), body)
