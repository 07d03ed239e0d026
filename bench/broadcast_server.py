"""The ceiling the gateway is compared with: a minimal uvicorn + Starlette WebSocket server.

    python bench/broadcast_server.py FRAMES_FILE [WS_IMPLEMENTATION] [--pace-ms N]

Bench-only. It runs on the same uvicorn configuration as `python -m gateway serve` (uvicorn's
defaults: uvloop, httptools, the websockets sans-I/O protocol) and does the least a server can
do for the same traffic:

- every connection sends one first frame (the gateway's `hello`) and gets a fixed `welcome`
  back, so an idle connection is "authenticated" exactly as far as the client can tell;
- a connection that sends `{"type":"go"}` makes the server send every line of FRAMES_FILE to
  every connected client (itself included, as the gateway's run starter also watches its
  run), in order, as text frames, straight from memory: no storage, no queues, no per-event
  work (the frames are already encoded), then `{"type":"done"}` to the sender. With
  `--pace-ms N` it waits N ms before each `message.delta` frame, as the demo model
  (`GATEWAY_DEMO_DELAY_MS`) waits before each text delta: the same story at the same pace.

WS_IMPLEMENTATION is uvicorn's `ws` option (default `auto`, uvicorn's default);
`websockets-sansio` is the protocol class the gateway's own (gateway/server/ws_guard.py) derives
from, the baseline of a raw sans-I/O connection.

The port is printed in uvicorn's usual "Uvicorn running on" line (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

WELCOME = '{"type":"welcome","protocol":1}'


def build_app(frames: list[str], pace_s: float = 0.0) -> Starlette:
    # Per-app state (not module state): the set of connections to broadcast to.
    connected: set[WebSocket] = set()

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            await websocket.receive_text()  # the hello
            await websocket.send_text(WELCOME)
            connected.add(websocket)
            while True:
                message = await websocket.receive_text()
                if message == '{"type":"go"}':
                    # The sender gets the frames too, as the gateway's run starter does.
                    watchers = list(connected)
                    for frame in frames:
                        if pace_s and '"event":"message.delta"' in frame:
                            await asyncio.sleep(pace_s)
                        for client in watchers:
                            await client.send_text(frame)
                    await websocket.send_text('{"type":"done"}')
        except WebSocketDisconnect:
            pass
        finally:
            connected.discard(websocket)

    return Starlette(routes=[WebSocketRoute("/v1/ws", endpoint)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="broadcast_server.py")
    parser.add_argument("frames_file", type=Path)
    parser.add_argument("ws", nargs="?", default="auto")
    parser.add_argument("--pace-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    frames = [line for line in args.frames_file.read_text().splitlines() if line]
    uvicorn.run(
        build_app(frames, args.pace_ms / 1000),
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_level="info",
        ws=args.ws,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
