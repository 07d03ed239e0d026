"""GET /metrics as a Starlette route, on the clients' listener or on one of its own
(gateway/server/metrics_listener.py). Kept apart from gateway/observability/metrics.py, which
everything that counts imports, so that counting never pulls in the web framework."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.observability.metrics import CONTENT_TYPE, GatewayMetrics

__all__ = ["metrics_route"]


async def _scrape(request: Request) -> Response:
    metrics: GatewayMetrics | None = request.app.state.services.metrics
    if metrics is None:
        return Response(status_code=404)
    await metrics.refresh()
    return Response(metrics.exposition(), media_type=CONTENT_TYPE)


def metrics_route() -> Route:
    """GET /metrics, served only when GATEWAY_METRICS is on: it carries no secret, and still
    says how busy the gateway is, so an operator chooses who may reach it."""
    return Route("/metrics", _scrape, methods=["GET"])
