"""The gateway inside an existing Starlette application, under `/chat`.

    GATEWAY_SECRET=... python docs/examples/mounted_gateway.py

The host's own routes stay as they are; the gateway's API is under the prefix
(`/chat/v1/ws`, `/chat/v1/approvals`, `/chat/healthz`...). FastAPI works the same way
(`app.mount("/chat", gateway)`, with the gateway's lifespan passed to `FastAPI(lifespan=...)`).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from gateway.app import create_app
from gateway.settings import Settings, load_settings

PREFIX = "/chat"


async def home(request: Request) -> JSONResponse:
    return JSONResponse({"service": "shop", "chat": f"{PREFIX}/v1/ws"})


def build(settings: Settings) -> Starlette:
    gateway = create_app(settings)
    return Starlette(
        routes=[Route("/", home), Mount(PREFIX, app=gateway)],
        # A mounted application's lifespan does not run by itself: the host runs the gateway's
        # (storage, the bus, the run manager), or every request would find them missing.
        lifespan=gateway.router.lifespan_context,
    )


if __name__ == "__main__":
    import uvicorn

    from gateway.server.config import gateway_config

    # The browser demo expects to be served at "/": an embedded gateway serves its API only.
    settings = load_settings(demo_ui=False)
    # gateway_config brings the gateway's server-level guards (deadlines, connection bound,
    # header limits) to the host application as well.
    uvicorn.Server(gateway_config(build(settings), settings)).run()
