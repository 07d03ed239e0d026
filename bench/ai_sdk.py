"""The Vercel AI SDK (useChat) beside the native protocol: how late a delta reaches a `Chat`,
what `resumeStream()` of a 2,000-chunk response costs, and what an idle AI SDK socket holds.

    .venv/bin/python -m bench.ai_sdk [--rounds 10] [--resume-rounds 10] [--words 993]
                                     [--connections 1000] [--backend sqlite]

One gateway subprocess (demo model, `GATEWAY_DEMO_DELAY_MS=5`, `GATEWAY_AI_SDK_REPLAY_WINDOW_S`
a day), driven from Node (tests/frontends/node/bench_ai_sdk.mjs, so `npm ci` there first), with
@ai-sdk/react's `Chat` (what useChat instantiates) over the `ai` package's two transports:

- `delta_*`: for each `message.delta` of a demo story run, the time from its `ts` (when the
  gateway produced it, before it was stored; millisecond resolution) to the moment the client
  has it: applied to a `Chat`'s messages (its messages callback, the one useChat renders from)
  over `WebSocketChatTransport` (`/v1/ai-sdk/ws`) or `DefaultChatTransport` (`POST
  /v1/ai-sdk/chat`), or parsed by a `ws` client of the native protocol (`run.start` on
  `/v1/ws`). Each round runs one story per client, in an order that rotates.
- `resume_*`: one finished run of `--words`+2 deltas (the demo's rule 5 echoes the input a word
  a delta: `You said: "alpha bravo ..."`), replayed whole by a resume within the replay window.
  A `Chat` holding no messages (a reloaded page) calls `resumeStream()` on that chat, with a new
  transport (so a new socket or connection): the time to its promise settling with the message
  rebuilt (`status` ready, every character), and (`*_first_change`) to the first change of its
  messages. Beside it, in the same rounds (in an order that rotates, after one unmeasured round
  of each, `resume_cold_ms`: the first resume of the process runs on cold code): the native
  client reading the same run from seq 0 to its `run.completed`, and (`raw_*`) the two AI SDK
  responses read without a `Chat` by the same process (fetch and `text()`; a `ws` socket with
  the options the transport gets, every frame `JSON.parse`d), which count the chunks. Then
  (`server_*`) the same responses, and the same run from seq 0 over `/v1/ws`, read from Python
  (httpx; `websockets` without compression, `orjson` per frame): the server alone, with the
  gateway's CPU time over each read. Every time includes the connect. `ws` offers
  permessage-deflate, as browsers do, and the gateway accepts it; `*_ws_plain` are the same
  over a socket that does not offer it.
- `memory`: RSS growth per idle connection at `--connections` connections (bench/memory.py's
  method, a fresh gateway for each kind): native after `hello`, and after `hello` and one run
  of a one-word message (`run.start` "hi", read to `run.completed`); `/v1/ai-sdk/ws` after one
  `resume` answered `no-active` (what a useChat page with `resume: true` sends on load, on a
  chat with nothing active), and after one `send` of the same one-word message, its response
  read to its `end`. Each AI SDK kind is divided by its native twin.
- `ratios`: the same run's figures side by side (`ratios()`).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from bench.common import (
    BACKENDS,
    TIMEOUT_S,
    Backend,
    BenchClient,
    ProtocolError,
    ServerProcess,
    connect,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
    process_cpu_seconds,
    raise_fd_limit,
    report_line,
)
from bench.frontends import STORY, lags_from_ts, node_run
from bench.memory import per_connection_kib

SCRIPT = "bench_ai_sdk.mjs"
AI_SDK_WS = "/v1/ai-sdk/ws"
# Words that match none of the demo model's rules before its echo (no refund, email, status or
# story): the answer is the input echoed a word a delta.
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
# Every ended response stays resumable for the whole benchmark.
REPLAY_WINDOW_S = "86400"


def echo_input(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


async def long_run(ws_url: str, token: str, text: str) -> tuple[str, dict[str, int], int]:
    """Runs `text` to completion over the native protocol: its thread, its events by type, and
    its last seq."""
    client = await BenchClient.connect(ws_url, token)
    try:
        _, _, ack = await client.request("run.start", input=text)
        _, completed = await client.wait_event("run.completed", ack["run_id"])
        events = Counter(frame["event"] for _, frame in client.run_events(ack["run_id"]))
    finally:
        await client.close()
    return completed["thread_id"], dict(events), completed["seq"]


async def raw_http_resume(base: str, token: str, chat_id: str) -> tuple[float, int]:
    """`GET /v1/ai-sdk/chat/{id}/stream` read to `[DONE]`: seconds (connect included), chunks."""
    chunks = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        begin = time.perf_counter()
        async with http.stream(
            "GET",
            f"/v1/ai-sdk/chat/{chat_id}/stream",
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            assert response.status_code == 200, response.status_code
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    orjson.loads(line[6:])
                    chunks += 1
                elif line == "data: [DONE]":
                    break
        elapsed = time.perf_counter() - begin
    return elapsed, chunks


def _frame(token: str, type_: str, **fields: Any) -> str:
    request = {
        "type": type_,
        "requestId": uuid.uuid4().hex,
        "headers": {"authorization": f"Bearer {token}"},
        "body": {},
    }
    return orjson.dumps({**request, **fields}).decode()


async def _answer(ws: ClientConnection, until: str) -> int:
    """Reads one request's frames up to one of type `until`; the chunks among them."""
    chunks = 0
    while True:
        frame = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
        if frame["type"] == until:
            return chunks
        if frame["type"] == "chunk":
            chunks += 1
        elif frame["type"] not in ("start",):
            raise ProtocolError(f"expected {until}, got {frame}")


async def raw_ws_resume(base: str, token: str, chat_id: str) -> tuple[float, int]:
    """A `resume` on a new `/v1/ai-sdk/ws` socket read to its `end`: seconds (connect
    included), chunks."""
    url = base.replace("http", "ws", 1) + AI_SDK_WS
    begin = time.perf_counter()
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(_frame(token, "resume", id=chat_id))
        chunks = await _answer(ws, "end")
        elapsed = time.perf_counter() - begin
    return elapsed, chunks


async def raw_native_replay(ws_url: str, token: str, thread_id: str) -> tuple[float, int]:
    """The thread read from seq 0 to its first `run.completed` over `/v1/ws` (no compression,
    `orjson` per frame): seconds (connect and `hello` included), events."""
    begin = time.perf_counter()
    ws = await connect(ws_url, token)
    try:
        subscribe = {"type": "thread.subscribe", "id": "r", "thread_id": thread_id, "after_seq": 0}
        await ws.send(orjson.dumps(subscribe).decode())
        events = 0
        while True:
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if frame["type"] == "error":
                raise ProtocolError(f"thread.subscribe: {frame}")
            if frame["type"] == "event":
                events += 1
                if frame["event"] == "run.completed":
                    break
        elapsed = time.perf_counter() - begin
    finally:
        await ws.close()
    return elapsed, events


async def server_reads(
    gateway: ServerProcess, token: str, chat_id: str, rounds: int
) -> dict[str, dict[str, Any]]:
    """The long run read `rounds` times each way by Python clients, the way most cheaply read
    (no compression, `orjson`): the wall time, and the gateway's CPU time over each read (it
    serves nothing else meanwhile)."""
    base = f"http://127.0.0.1:{gateway.port}"
    readers = {
        "http": partial(raw_http_resume, base, token, chat_id),
        "ws": partial(raw_ws_resume, base, token, chat_id),
        "native": partial(raw_native_replay, gateway.ws_url, token, chat_id),
    }
    seen: dict[str, list[tuple[float, int, float]]] = {kind: [] for kind in readers}
    for _ in range(rounds):
        for kind, read in readers.items():
            cpu_before = process_cpu_seconds(gateway.pid) or 0.0
            elapsed, items = await read()
            cpu = (process_cpu_seconds(gateway.pid) or 0.0) - cpu_before
            seen[kind].append((elapsed, items, cpu))
    return {
        kind: {
            **latency_summary([t for t, _, _ in reads]),
            "items": sorted({n for _, n, _ in reads}),
            # /proc counts CPU in clock ticks (10 ms): the mean over all reads, not a median.
            "cpu_ms_mean": round(statistics.fmean(c for _, _, c in reads) * 1000, 1),
        }
        for kind, reads in seen.items()
    }


@contextlib.asynccontextmanager
async def ai_sdk_sockets(
    url: str, count: int, *, request: str, user: str = "alice"
) -> AsyncIterator[list[ClientConnection]]:
    """`count` `/v1/ai-sdk/ws` sockets, each after one request answered: a `resume` of a chat
    with nothing active (`no-active`), or a `send` of a one-word message read to its `end`.
    Opened a few at a time, all closed afterwards (as `bench.common.clients`)."""
    token = issue_token(user, ["user"])
    opened: list[ClientConnection] = []

    async def open_one() -> ClientConnection:
        ws = await websockets.connect(url, max_size=None, compression=None, ping_interval=None)
        opened.append(ws)
        chat_id = f"idle-{uuid.uuid4().hex}"
        if request == "resume":
            await ws.send(_frame(token, "resume", id=chat_id))
            await _answer(ws, "no-active")
        else:
            message = {
                "id": uuid.uuid4().hex,
                "role": "user",
                "parts": [{"type": "text", "text": "hi"}],
            }
            await ws.send(
                _frame(token, "send", id=chat_id, trigger="submit-message", messages=[message])
            )
            await _answer(ws, "end")
        return ws

    try:
        for start in range(0, count, 50):
            await asyncio.gather(*(open_one() for _ in range(min(50, count - start))))
        yield opened
    finally:
        await asyncio.gather(
            *(asyncio.wait_for(ws.close(), 10) for ws in opened), return_exceptions=True
        )


@contextlib.asynccontextmanager
async def native_run_clients(
    url: str, count: int, user: str = "alice"
) -> AsyncIterator[list[ClientConnection]]:
    """`count` native connections, each after `hello` and one run of a one-word message read to
    its `run.completed`: the native twin of `ai_sdk_sockets(request="send")`."""
    token = issue_token(user, ["user"])
    opened: list[ClientConnection] = []

    async def open_one() -> None:
        ws = await connect(url, token)
        opened.append(ws)
        await ws.send(orjson.dumps({"type": "run.start", "id": "s", "input": "hi"}).decode())
        while True:
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if frame["type"] == "error":
                raise ProtocolError(f"run.start: {frame}")
            if frame["type"] == "event" and frame["event"] == "run.completed":
                return

    try:
        for start in range(0, count, 50):
            await asyncio.gather(*(open_one() for _ in range(min(50, count - start))))
        yield opened
    finally:
        await asyncio.gather(
            *(asyncio.wait_for(ws.close(), 10) for ws in opened), return_exceptions=True
        )


async def memory(count: int, backend: Backend, workdir: Path) -> dict[str, Any]:
    """KiB per idle connection, each kind on a fresh gateway and database (a gateway that
    held and closed other connections would reuse their freed memory)."""
    limit = raise_fd_limit(2 * count + 512)
    if limit < count + 64:
        raise RuntimeError(f"the open-files limit ({limit}) is too low for {count} connections")
    kinds: dict[str, dict[str, Any]] = {
        "native_hello": {},
        "native_run": {"open_clients": native_run_clients},
        "ai_sdk_resume": {
            "open_clients": partial(ai_sdk_sockets, request="resume"),
            "path": AI_SDK_WS,
        },
        "ai_sdk_send": {"open_clients": partial(ai_sdk_sockets, request="send"), "path": AI_SDK_WS},
    }
    figures: dict[str, Any] = {"connections": count}
    for kind, options in kinds.items():
        async with fresh_database(backend, workdir, name=f"memory_{kind}") as database:
            with gateway_process(workdir, database=database, name=f"memory_{kind}") as gateway:
                figures[kind] = await per_connection_kib(gateway, count, **options)
    # Each AI SDK socket against the native connection that did the same: authenticated, or
    # authenticated and one small run read to its end.
    for kind, twin in (("ai_sdk_resume", "native_hello"), ("ai_sdk_send", "native_run")):
        ratio = figures[kind]["kib_per_connection"] / figures[twin]["kib_per_connection"]
        figures[f"{kind}_over_{twin}"] = round(ratio, 3)
    return figures


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    """What the same run says side by side: each AI SDK client over the native one (delta
    latency; a resume against the native read of the same run), and a `Chat`'s resume over the
    raw read of the same response (what the client itself adds)."""
    out: dict[str, float] = {}
    for kind in ("ws", "http"):
        for p in ("p50_ms", "p99_ms"):
            name = p.removesuffix("_ms")
            delta = figures[f"delta_{kind}"][p] / figures["delta_native"][p]
            out[f"delta_{kind}_over_native_{name}"] = round(delta, 3)
        resume = figures[f"resume_{kind}"]["p50_ms"]
        out[f"resume_{kind}_over_native_p50"] = round(
            resume / figures["resume_native"]["p50_ms"], 3
        )
        out[f"resume_{kind}_over_raw_p50"] = round(resume / figures[f"raw_{kind}"]["p50_ms"], 3)
    return out


def summarise(times_ms: list[float]) -> dict[str, float | int]:
    return latency_summary([t / 1000 for t in times_ms])


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    token = issue_token("alice", ["user"])
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            settings = {"GATEWAY_AI_SDK_REPLAY_WINDOW_S": REPLAY_WINDOW_S}
            with gateway_process(
                workdir, database=database, demo_delay_ms=5, env=settings
            ) as gateway:
                base = f"http://127.0.0.1:{gateway.port}"
                common = {"base": base, "wsUrl": gateway.ws_url, "token": token}
                timed = node_run(
                    SCRIPT, {**common, "scenario": "latency", "input": STORY, "rounds": args.rounds}
                )
                for kind, rounds in timed.items():
                    figures[f"delta_{kind}"] = latency_summary(
                        await lags_from_ts(base, token, rounds)
                    )

                text = echo_input(args.words)
                chat_id, events, last_seq = await long_run(gateway.ws_url, token, text)
                chars = len(f'You said: "{text}"')
                resumed = node_run(
                    SCRIPT,
                    {
                        **common,
                        "scenario": "resume",
                        "chatId": chat_id,
                        "chars": chars,
                        "rounds": args.resume_rounds,
                    },
                )
                server = await server_reads(gateway, token, chat_id, args.resume_rounds)
        figures["resume_run"] = {
            "events": sum(events.values()),
            "by_type": events,
            "chunks": sorted(
                {r["chunks"] for kind in ("rawWs", "rawHttp", "rawWsPlain") for r in resumed[kind]}
                | {n for kind in ("http", "ws") for n in server[kind]["items"]}
            ),
            "native_events_read": sorted({r["events"] for r in resumed["native"]}),
            "chars": chars,
            "last_seq": last_seq,
        }
        pairs = (("ws", "rawWs"), ("http", "rawHttp"), ("ws_plain", "rawWsPlain"))
        for kind, raw in pairs:
            rounds = resumed["wsPlain" if kind == "ws_plain" else kind]
            figures[f"resume_{kind}"] = summarise([r["ms"] for r in rounds])
            figures[f"resume_{kind}_first_change"] = summarise([r["firstMs"] for r in rounds])
            figures[f"raw_{kind}"] = summarise([r["ms"] for r in resumed[raw]])
        for kind, read in server.items():
            figures[f"server_{kind}"] = read
        figures["resume_native"] = summarise([r["ms"] for r in resumed["native"]])
        figures["resume_cold_ms"] = {k: round(v, 1) for k, v in resumed["cold"].items()}
        figures["ratios"] = ratios(figures)
        figures["memory"] = await memory(args.connections, backend, workdir)
    return report_line("ai-sdk", backend, figures, rounds=args.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="story runs per client")
    parser.add_argument("--resume-rounds", type=int, default=10, help="resumes per client")
    parser.add_argument(
        "--words", type=int, default=993, help="input words of the long run (deltas - 2)"
    )
    parser.add_argument("--connections", type=int, default=1000, help="idle connections")
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args, args.backend))))


if __name__ == "__main__":
    main()
