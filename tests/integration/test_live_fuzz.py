"""Live fuzzing: thousands of random and mutated frames against a real gateway process.

Several fuzzing connections (reconnecting whenever the server closes one) send at least
TOTAL_FRAMES frames: valid frames, valid frames with faults, noise, binary frames, invalid
UTF-8, deep nesting, frames over the size limit, frames before `hello`, hostile `hello`s. The
test then holds the gateway to its contract:

- the process stays up and `/healthz` answers 200 throughout; it logs no unhandled error;
- every server frame matches the AsyncAPI document, and no error is `internal`;
- a frame with an id gets at most one answer, and it is the right kind: the parser's own code
  for what the parser refuses (checked against `parse_client_frame` locally), an `ack` or an
  error for what it accepts; once a barrier `ping` is answered, every earlier frame with an id
  has been answered (except `pong`, which never is);
- every close uses a close code the AsyncAPI document lists;
- meanwhile a well-behaved client (another tenant) runs demo runs, one with an approval decided
  over HTTP, to completion with dense `seq`s, and its events match the documents too.

Seeded: the same frames every run. Bounded: TIME_BUDGET_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets

from gateway.auth.access import TokenVerifier
from gateway.protocol.frames import MAX_ID_CHARS, ProtocolError, parse_client_frame
from tests.support.client import Client
from tests.support.frame_fuzz import FrameFuzzer, Fuzzed
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.seeds import replay_hint, run_seed
from tests.support.specs import Spec, asyncapi, openapi

SEED = run_seed()  # fixed unless GATEWAY_TEST_SEED says otherwise (tests/support/seeds.py)
TOTAL_FRAMES = 5000
WORKERS = 4
FRAMES_PER_CONNECTION = (20, 120)
MAX_FRAME_BYTES = 16384
MAX_INPUT_CHARS = 1000
TIME_BUDGET_S = 240.0
FUZZ_TENANT = "fuzz"
ROLE_SETS = (("user",), ("user", "reviewer"), ("viewer",), ("admin",), ())
GATEWAY_ENV = {
    "GATEWAY_MAX_FRAME_BYTES": str(MAX_FRAME_BYTES),
    "GATEWAY_MAX_INPUT_CHARS": str(MAX_INPUT_CHARS),
    "GATEWAY_HELLO_TIMEOUT_S": "3",
    # Generous frame limits: fuzz frames should reach the parser and the handlers, not only
    # the limiter. `rate_limited` and its close code stay allowed outcomes.
    "GATEWAY_FRAMES_PER_S": "2000",
    "GATEWAY_FRAME_BURST": "2000",
}
# Nothing a client sends may produce an error-level line or a traceback: those page operators
# (uvicorn's traceback for invalid UTF-8 is turned into one INFO line,
# gateway/observability/log_noise.py).
GATEWAY_FAILURE = re.compile(r"Traceback|Exception in ASGI application|\b(?:ERROR|CRITICAL)\b")


@dataclass
class Expectation:
    fuzzed: Fuzzed
    local: Any  # the parsed frame, or the ProtocolError the parser raised
    # Sent before the connection was authenticated: the first frame, or the hello itself
    # (whose answer is a `welcome` without `ref`).
    pre_hello: bool


@dataclass
class FuzzConnection:
    expected: dict[str, Expectation] = field(default_factory=dict)
    frames: list[dict[str, Any]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    last_kinds: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    barrier: str | None = None
    barrier_answered: bool = False
    # A frame the WebSocket layer closes the connection for (1009, 1007) was sent.
    fatal: Fuzzed | None = None
    close_code: int | None = None


@dataclass
class Tally:
    frames_sent: int = 0
    connections: list[FuzzConnection] = field(default_factory=list)


def local_parse(fuzzed: Fuzzed) -> Any:
    try:
        return parse_client_frame(fuzzed.data, max_input_chars=MAX_INPUT_CHARS)
    except ProtocolError as exc:
        return exc


def answerable_id(fuzzed: Fuzzed) -> str | None:
    """The id the server must echo as `ref`: a valid id of a text frame, decoded exactly as
    the server decodes it (a broken frame can still carry one)."""
    if not fuzzed.text or fuzzed.fatal:
        return None
    try:
        obj = orjson.loads(fuzzed.data)
    except orjson.JSONDecodeError:
        return None
    frame_id = obj.get("id") if isinstance(obj, dict) else None
    return frame_id if isinstance(frame_id, str) and 0 < len(frame_id) <= MAX_ID_CHARS else None


async def until(event: asyncio.Event, reader: asyncio.Task[None], timeout: float) -> None:
    """Wait for `event`, or for the reader to end (the server closed), or the timeout."""
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait([waiter, reader], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


async def fuzz_connection(
    url: str, fuzzer: FrameFuzzer, rng: random.Random, tally: Tally
) -> FuzzConnection:
    conn = FuzzConnection()
    ws = await websockets.connect(url, max_size=None, open_timeout=10, close_timeout=10)
    welcomed = asyncio.Event()
    barrier_seen = asyncio.Event()

    async def read() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in ws:
                if isinstance(message, bytes):
                    conn.problems.append("the server sent a binary frame")
                    continue
                frame = json.loads(message)
                conn.frames.append(frame)
                kind, ref = frame.get("type"), frame.get("ref")
                if kind == "welcome":
                    welcomed.set()
                elif kind == "ping":
                    await ws.send('{"type":"pong"}')
                elif kind == "pong" and ref is not None and ref == conn.barrier:
                    barrier_seen.set()
                elif kind == "ack" and isinstance(frame.get("thread_id"), str):
                    fuzzer.known_threads[:] = [*fuzzer.known_threads[-19:], frame["thread_id"]]

    async def send(fuzzed: Fuzzed, *, pre_hello: bool = False) -> None:
        await ws.send(fuzzed.data, text=fuzzed.text)
        tally.frames_sent += 1
        conn.kinds[fuzzed.kind] += 1
        conn.last_kinds[:] = [*conn.last_kinds[-2:], fuzzed.kind]
        if fuzzed.fatal:
            conn.fatal = fuzzed
        ref = answerable_id(fuzzed)
        if ref is not None:
            conn.expected[ref] = Expectation(fuzzed, local_parse(fuzzed), pre_hello)

    reader = asyncio.create_task(read())
    try:
        if rng.random() < 0.08:
            await send(fuzzer.next(), pre_hello=True)
        await send(fuzzer.hello(with_id=rng.random() < 0.5), pre_hello=True)
        await until(welcomed, reader, 15)
        if welcomed.is_set():
            for _ in range(rng.randint(*FRAMES_PER_CONNECTION)):
                fuzzed = fuzzer.next()
                await send(fuzzed)
                if fuzzed.ends:
                    # Nothing more after it: the server is closing (and data still arriving
                    # when the WebSocket layer drops the socket turns its close into a reset).
                    await until(asyncio.Event(), reader, 15)
                    break
                await asyncio.sleep(0)
            if not reader.done():
                conn.barrier = fuzzer.next_id()
                await ws.send(json.dumps({"type": "ping", "id": conn.barrier}))
                await until(barrier_seen, reader, 30)
                conn.barrier_answered = barrier_seen.is_set()
    except websockets.ConnectionClosed:
        pass  # the server closed it (1009, 4001, ...): judged by its close code below
    finally:
        await ws.close()
        await reader
    conn.close_code = ws.close_code
    return conn


async def fuzz_worker(n: int, url: str, tokens: list[str], tally: Tally, deadline: float) -> None:
    rng = random.Random(SEED * 100 + n)
    fuzzer = FrameFuzzer(
        rng=rng,
        prefix=f"w{n}",
        max_frame_bytes=MAX_FRAME_BYTES,
        token=tokens[n],
        other_tokens=[t for i, t in enumerate(tokens) if i != n],
    )
    while tally.frames_sent < TOTAL_FRAMES and time.monotonic() < deadline:
        tally.connections.append(await fuzz_connection(url, fuzzer, rng, tally))


def check_answer(expectation: Expectation, answer: dict[str, Any]) -> str | None:
    kind, code = answer["type"], answer.get("code")
    local = expectation.local
    what = f"{expectation.fuzzed.kind} {str(expectation.fuzzed.data)[:120]!r}"
    if kind == "error" and code == "rate_limited":
        return None
    if isinstance(local, ProtocolError):
        if kind == "error" and code == str(local.code):
            return None
        return f"{what}: the parser says {local.code}, the server answered {kind} {code}"
    frame_type = local.type
    if expectation.pre_hello and frame_type != "hello":
        allowed = {("error", "unauthorized")}
        return None if (kind, code) in allowed else f"{what} before hello got {kind} {code}"
    if frame_type == "hello":
        allowed_kinds = {"welcome", "error"}
    elif frame_type == "ping":
        allowed_kinds = {"pong", "error"}
    elif frame_type == "pong":
        allowed_kinds = {"error"}
    else:
        allowed_kinds = {"ack", "error"}
    return None if kind in allowed_kinds else f"{what}: a {frame_type} was answered by {kind}"


def check_connection(conn: FuzzConnection, spec: Spec, close_codes: set[int]) -> list[str]:
    problems = list(conn.problems)
    answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for frame in conn.frames:
        kind = frame.get("type")
        try:
            schema = spec.server_frame_schema(str(kind))
        except KeyError:
            problems.append(f"undocumented server frame {str(frame)[:200]}")
            continue
        errors = spec.errors(schema, frame)
        if errors:
            problems.append(f"{kind} frame off its schema: {errors[:3]} in {str(frame)[:300]}")
        if kind == "error" and frame.get("code") == "internal":
            problems.append(f"internal error: {frame}")
        ref = frame.get("ref")
        if ref is not None and kind in ("ack", "error", "pong", "welcome"):
            if ref != conn.barrier and ref not in conn.expected:
                problems.append(f"an answer to an id never sent: {str(frame)[:200]}")
            answers[ref].append(frame)
    for ref, expectation in conn.expected.items():
        got = answers.get(ref, [])
        if len(got) > 1:
            problems.append(f"{len(got)} answers to {ref}: {got}")
        if got:
            problem = check_answer(expectation, got[0])
            if problem:
                problems.append(problem)
        elif conn.barrier_answered and not expectation.pre_hello:
            local = expectation.local
            if not (not isinstance(local, ProtocolError) and local.type == "pong"):
                problems.append(
                    f"no answer to {expectation.fuzzed.kind} {str(expectation.fuzzed.data)[:120]!r}"
                )
    # The WebSocket layer drops the socket right after its 1009/1007 close frame, with the rest
    # of the offending frame unread; the kernel then resets the connection, and the reset can
    # overtake the close frame. Only then may a client see 1006 instead.
    lost_close = conn.fatal is not None and conn.close_code == 1006
    if conn.close_code not in close_codes and not lost_close:
        problems.append(
            f"closed with {conn.close_code}, not a documented close code "
            f"(last frames sent: {conn.last_kinds})"
        )
    return problems


async def monitor_health(http: httpx.AsyncClient, stop: asyncio.Event, seen: Counter[int]) -> None:
    while not stop.is_set():
        try:
            response = await http.get("/healthz", timeout=10)
            seen[response.status_code] += 1
        except httpx.HTTPError as exc:
            seen[-1] += 1
            raise AssertionError(f"/healthz failed during fuzzing: {exc!r}") from exc
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def well_behaved_client(gw: GatewayProcess, verifier: TokenVerifier) -> None:
    """Three runs on one thread (tools over several turns, an approval decided over HTTP, a
    long streamed story) beside the fuzzers: all complete, `seq`s dense, documents hold."""
    ws_url = f"ws://127.0.0.1:{gw.port}/v1/ws"
    alice = await Client.connect(ws_url, verifier.issue("alice", "acme", ["user"]))
    bob = {"Authorization": f"Bearer {verifier.issue('bob', 'acme', ['reviewer'])}"}

    async def completed(run_id: str) -> None:
        await alice.wait_for(
            lambda f: (
                f.get("type") == "event"
                and f.get("run_id") == run_id
                and f.get("event") in ("run.completed", "run.failed", "run.cancelled")
            ),
            timeout=90,
        )

    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=30) as http:
            first = await alice.request("run.start", input="check the status of orders 3 and 5")
            thread_id = first["thread_id"]
            await completed(first["run_id"])
            second = await alice.request(
                "run.input", thread_id=thread_id, input="refund order 42 for 30"
            )
            requested = await alice.wait_event("approval.requested", timeout=90)
            decided = await http.post(
                f"/v1/approvals/{requested['data']['approval_id']}/decision",
                json={"decision": "approve"},
                headers=bob,
            )
            assert decided.status_code == 200, decided.text
            assert openapi().errors("ApprovalEnvelope", decided.json()) == []
            await completed(second["run_id"])
            third = await alice.request("run.input", thread_id=thread_id, input="tell a story")
            await completed(third["run_id"])

            events = alice.events_of(thread_id)
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "seq gaps"
            ends = [e for e in events if e["event"].startswith("run.") and e["run_id"]]
            for run in (first, second, third):
                assert any(
                    e["run_id"] == run["run_id"] and e["event"] == "run.completed" for e in ends
                ), f"run {run['run_id']} did not complete"
            spec = asyncapi()
            for frame in alice.frames:
                schema = spec.server_frame_schema(frame["type"])
                assert spec.errors(schema, frame) == [], frame
            page = await http.get(
                f"/v1/threads/{thread_id}/events",
                headers={"Authorization": f"Bearer {verifier.issue('alice', 'acme', ['user'])}"},
            )
            assert page.status_code == 200, page.text
            assert openapi().errors("EventPage", page.json()) == []
            assert page.json()["events"] == events
    finally:
        await alice.close()


async def test_gateway_survives_thousands_of_hostile_frames(tmp_path: Path) -> None:
    print(f"[live fuzz] {replay_hint()}")
    gw = spawn_gateway(tmp_path, env=GATEWAY_ENV)
    verifier = TokenVerifier(TEST_SECRET)
    tokens = [
        verifier.issue(f"fuzz{n}", FUZZ_TENANT, ROLE_SETS[n % len(ROLE_SETS)])
        for n in range(WORKERS)
    ]
    spec = asyncapi()
    close_codes = spec.close_codes()
    tally = Tally()
    health: Counter[int] = Counter()
    stop = asyncio.Event()
    deadline = time.monotonic() + TIME_BUDGET_S
    url = f"ws://127.0.0.1:{gw.port}/v1/ws"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as http:
            monitor = asyncio.create_task(monitor_health(http, stop, health))
            try:
                await asyncio.gather(
                    well_behaved_client(gw, verifier),
                    *(fuzz_worker(n, url, tokens, tally, deadline) for n in range(WORKERS)),
                )
            finally:
                stop.set()
                await monitor
            assert gw.process.poll() is None, "the gateway process died"
            ready = await http.get("/readyz")
            assert ready.status_code == 200, ready.text
            # Still serving the protocol after all that.
            after = await Client.connect(url, verifier.issue("late", "acme", ["user"]))
            assert (await after.request("ping"))["type"] == "pong"
            await after.close()
    finally:
        gw.terminate()

    assert tally.frames_sent >= TOTAL_FRAMES, (
        f"only {tally.frames_sent} frames within {TIME_BUDGET_S} s"
    )
    assert set(health) == {200}, f"/healthz answers during fuzzing: {dict(health)}"
    failures = GATEWAY_FAILURE.findall(gw.log())
    assert not failures, f"the gateway logged failures: {failures[:5]}\n{gw.log()[-4000:]}"
    problems = [p for conn in tally.connections for p in check_connection(conn, spec, close_codes)]
    closes = Counter(conn.close_code for conn in tally.connections)
    kinds = sum((conn.kinds for conn in tally.connections), Counter())
    summary = (
        f"{tally.frames_sent} frames over {len(tally.connections)} connections; "
        f"closes {dict(closes)}; kinds {dict(kinds)}"
    )
    assert not problems, f"{len(problems)} problems ({summary}):\n" + "\n".join(problems[:25])
    # The mix must actually reach the interesting paths, or the test proves little.
    barriers = sum(conn.barrier_answered for conn in tally.connections)
    assert barriers >= 10, f"too few connections reached their barrier ({summary})"
    answers = sum(
        frame.get("type") in ("ack", "error", "pong", "welcome")
        for conn in tally.connections
        for frame in conn.frames
    )
    assert answers >= TOTAL_FRAMES // 2, f"only {answers} answers: frames went unread ({summary})"
    assert {1000, 1009, 4001} <= set(closes), f"expected closes missing ({summary})"
