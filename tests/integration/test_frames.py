"""Frame-level rules of docs/protocol.md §2, §5 and §7: malformed frames, ids, limits, heartbeats,
slow clients.

Every malformed or invalid frame gets exactly one coded `error` (with `ref` = the frame's id when
that id is itself valid) and changes nothing; a `bad_request` keeps the socket open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import websockets

from tests.integration.test_metrics import scrape, value
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import Gateway

PAUSING_INPUT = "refund order 42 for 30"
LONG_ID = "i" * 65


def errors_of(client: Client) -> list[dict[str, Any]]:
    return [f for f in client.frames if f.get("type") == "error"]


async def still_works(client: Client) -> None:
    """The socket answers requests after whatever the test sent before."""
    pong = await client.request("ping")
    assert pong["type"] == "pong" and pong["ref"].startswith("q")
    created = await client.request("thread.create")
    assert created["thread_id"]


async def flush(client: Client) -> int:
    """Round-trip a ping; every reply to earlier frames has arrived when its pong does.

    Returns the index in `client.frames` of that pong.
    """
    pong = await client.request("ping")
    return next(i for i, f in enumerate(client.frames) if f is pong)


async def pause_a_run(client: Client) -> tuple[str, str, str]:
    ack = await client.request("run.start", input=PAUSING_INPUT)
    requested = await client.wait_event("approval.requested")
    await client.wait_event("run.paused")
    return ack["thread_id"], ack["run_id"], requested["data"]["approval_id"]


async def http_get(gateway: Gateway, path: str, user: str, *roles: str) -> tuple[int, Any]:
    async with gateway.http() as http:
        response = await http.get(
            path, headers={"Authorization": f"Bearer {gateway.token(user, *roles)}"}
        )
    return response.status_code, response.json()


# -- malformed frames: bad_request, the socket stays open ----------------------------------------

# (case id, frame builder taking an existing thread id, expected ref)
BAD_FRAMES: list[tuple[str, Callable[[str], str | bytes], str | None]] = [
    ("invalid-json", lambda t: '{"type": "ping", "id": "j1"', None),
    ("json-array", lambda t: '[{"type": "ping", "id": "a1"}]', None),
    ("json-string", lambda t: '"ping"', None),
    ("json-number", lambda t: "42", None),
    ("missing-type", lambda t: json.dumps({"id": "m1"}), "m1"),
    ("type-not-string", lambda t: json.dumps({"type": 5, "id": "m2"}), "m2"),
    ("unknown-type", lambda t: json.dumps({"type": "thread.delete", "id": "u1"}), "u1"),
    (
        "after_seq-string",
        lambda t: json.dumps(
            {"type": "thread.subscribe", "id": "s1", "thread_id": t, "after_seq": "5"}
        ),
        "s1",
    ),
    (
        "after_seq-negative",
        lambda t: json.dumps(
            {"type": "thread.subscribe", "id": "s2", "thread_id": t, "after_seq": -1}
        ),
        "s2",
    ),
    (
        "after_seq-bool",
        lambda t: json.dumps(
            {"type": "thread.subscribe", "id": "s3", "thread_id": t, "after_seq": True}
        ),
        "s3",
    ),
    (
        "after_seq-float",
        lambda t: json.dumps(
            {"type": "thread.subscribe", "id": "s4", "thread_id": t, "after_seq": 1.5}
        ),
        "s4",
    ),
    (
        "thread_id-int",
        lambda t: json.dumps({"type": "thread.subscribe", "id": "s5", "thread_id": 123}),
        "s5",
    ),
    (
        "input-int",
        lambda t: json.dumps({"type": "run.start", "id": "r1", "thread_id": t, "input": 5}),
        "r1",
    ),
    (
        "input-empty",
        lambda t: json.dumps({"type": "run.start", "id": "r2", "thread_id": t, "input": ""}),
        "r2",
    ),
    (
        "input-blank",
        lambda t: json.dumps({"type": "run.input", "id": "r3", "thread_id": t, "input": "  \n"}),
        "r3",
    ),
    (
        "decision-maybe",
        lambda t: json.dumps(
            {"type": "approval.decide", "id": "d1", "approval_id": "a_x", "decision": "maybe"}
        ),
        "d1",
    ),
    ("id-65-chars", lambda t: json.dumps({"type": "ping", "id": LONG_ID}), None),
    ("id-int", lambda t: json.dumps({"type": "ping", "id": 7}), None),
    ("id-empty", lambda t: json.dumps({"type": "ping", "id": ""}), None),
    ("binary-frame", lambda t: b'{"type": "ping", "id": "b1"}', None),
]


@pytest.mark.parametrize(
    ("build", "ref"), [(b, r) for _, b, r in BAD_FRAMES], ids=[c for c, _, _ in BAD_FRAMES]
)
async def test_malformed_frame_is_bad_request_and_socket_stays_open(connect, build, ref) -> None:
    alice = await connect("alice", "user")
    thread_id = (await alice.request("thread.create"))["thread_id"]
    before = len(alice.frames)

    await alice.send_raw(build(thread_id))
    pong_at = await flush(alice)

    replies = alice.frames[before:pong_at]
    assert len(replies) == 1, replies  # exactly one answer, and nothing else
    error = replies[0]
    assert error["type"] == "error" and error["code"] == "bad_request", error
    assert error["ref"] == ref
    assert error["message"]
    await still_works(alice)
    assert not alice.closed.done()
    # Nothing was subscribed or started by the bad frame.
    assert not alice.events


async def test_error_message_does_not_echo_the_frame(connect) -> None:
    alice = await connect("alice", "user")
    secret = "s3cr3t-" + "z" * 200
    await alice.send_raw('{"type": "' + secret + '", "id": "e1"')  # invalid JSON
    await alice.send_raw(json.dumps({"type": secret, "id": "e2"}))  # unknown type
    await flush(alice)
    errors = errors_of(alice)
    assert [e["code"] for e in errors] == ["bad_request", "bad_request"]
    assert all(secret not in e["message"] for e in errors)
    assert all(len(e["message"]) < 200 for e in errors)


# -- invalid frames change nothing ---------------------------------------------------------------


async def test_invalid_frames_change_nothing(connect, gateway) -> None:
    alice = await connect("alice", "user")
    thread_id, run_id, approval_id = await pause_a_run(alice)
    head_before = (await http_get(gateway, f"/v1/threads/{thread_id}/events", "alice"))[1][
        "head_seq"
    ]
    run_starts: list[dict[str, Any]] = [
        {"input": 5},
        {"input": ""},
        {"input": "   "},
        {"input": None},
        {},
        {"input": "hello", "thread_id": 123},
        {"input": "hello", "thread_id": ""},
        {"input": "hello", "agent": 5},
        {"input": "hello", "agent": "no-such-agent"},
        {"input": "hello", "on_disconnect": "never"},
        {"input": ["hello"]},
    ]
    decides: list[dict[str, Any]] = [
        {"approval_id": approval_id, "decision": "maybe"},
        {"approval_id": approval_id, "decision": "APPROVE"},
        {"approval_id": approval_id, "decision": True},
        {"approval_id": approval_id},
        {"approval_id": 5, "decision": "approve"},
        {"approval_id": "", "decision": "approve"},
        {"approval_id": [approval_id], "decision": "approve"},
        {"approval_id": approval_id, "decision": "approve", "reason": 5},
        {"approval_id": approval_id, "decision": "reject", "reason": "r" * 5000},
    ]
    frames = [{"type": "run.start", "id": f"rs{i}", **f} for i, f in enumerate(run_starts)]
    frames += [{"type": "approval.decide", "id": f"ad{i}", **f} for i, f in enumerate(decides)]
    # A valid request behind an invalid id must not be executed either.
    frames.append({"type": "run.start", "id": LONG_ID, "input": "hello"})
    frames.append(
        {
            "type": "approval.decide",
            "id": LONG_ID,
            "approval_id": approval_id,
            "decision": "approve",
        }
    )
    before = len(alice.frames)
    for frame in frames:
        await alice.send_raw(json.dumps(frame))
    pong_at = await flush(alice)

    replies = alice.frames[before:pong_at]
    non_events = [f for f in replies if f.get("type") != "event"]
    assert [f["type"] for f in non_events] == ["error"] * len(frames), non_events
    assert {f["code"] for f in non_events} == {"bad_request"}, non_events
    expected_refs = [f["id"] if len(f["id"]) <= 64 else None for f in frames]
    assert [f["ref"] for f in non_events] == expected_refs

    # The run is still the only one; the approval is still pending; the log did not grow.
    status, body = await http_get(gateway, "/v1/threads", "alice")
    assert status == 200
    assert [t["thread_id"] for t in body["threads"]] == [thread_id]
    status, body = await http_get(gateway, "/v1/approvals", "rita", "reviewer")
    assert status == 200
    assert [(a["approval_id"], a["status"]) for a in body["approvals"]] == [
        (approval_id, "pending")
    ]
    status, body = await http_get(gateway, f"/v1/runs/{run_id}", "alice")
    assert body["run"]["status"] == "waiting_for_review"
    status, body = await http_get(gateway, f"/v1/threads/{thread_id}/events", "alice")
    assert body["head_seq"] == head_before
    await still_works(alice)


# -- unknown ids --------------------------------------------------------------------------------

UNKNOWN_ID_FRAMES: list[tuple[str, dict[str, Any]]] = [
    ("thread.subscribe", {"thread_id": "t_does_not_exist"}),
    ("run.start", {"thread_id": "t_does_not_exist", "input": "hello"}),
    ("run.input", {"thread_id": "t_does_not_exist", "input": "hello"}),
    ("run.cancel", {"run_id": "r_does_not_exist"}),
    ("run.resume", {"run_id": "r_does_not_exist"}),
    ("approval.decide", {"approval_id": "a_does_not_exist", "decision": "approve"}),
]


@pytest.mark.parametrize(
    ("type_", "fields"), UNKNOWN_ID_FRAMES, ids=[t for t, _ in UNKNOWN_ID_FRAMES]
)
@pytest.mark.parametrize("role", ["user", "admin"])
async def test_unknown_ids_are_not_found(connect, type_, fields, role) -> None:
    client = await connect("alice", role)
    with pytest.raises(ProtocolFailure) as failure:
        await client.request(type_, **fields)
    assert failure.value.code == "not_found"
    await still_works(client)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/threads/t_does_not_exist/events"),
        ("GET", "/v1/runs/r_does_not_exist"),
        ("POST", "/v1/approvals/a_does_not_exist/decision"),
    ],
)
async def test_unknown_ids_are_not_found_over_http(gateway, method, path) -> None:
    async with gateway.http() as http:
        response = await http.request(
            method,
            path,
            headers={"Authorization": f"Bearer {gateway.token('adam', 'admin')}"},
            json={"decision": "approve"} if method == "POST" else None,
        )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_run_start_with_unknown_agent_is_bad_request(connect, gateway) -> None:
    alice = await connect("alice", "user")
    thread_id = (await alice.request("thread.create"))["thread_id"]
    for fields in ({}, {"thread_id": thread_id}):
        with pytest.raises(ProtocolFailure) as failure:
            await alice.request("run.start", input="hello", agent="no-such-agent", **fields)
        assert failure.value.code == "bad_request"
        assert failure.value.frame["ref"].startswith("q")
    _, body = await http_get(gateway, "/v1/threads", "alice")
    assert [t["thread_id"] for t in body["threads"]] == [thread_id]
    assert body["threads"][0]["head_seq"] == 0
    await still_works(alice)


# -- size limit ---------------------------------------------------------------------------------


def _padded(size: int, pad_char: str = "a") -> str:
    frame = {"type": "ping", "id": "big", "pad": ""}
    base = len(json.dumps(frame).encode())
    pad = (size - base) // len(pad_char.encode())
    return json.dumps({**frame, "pad": pad_char * pad}, ensure_ascii=False)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(_padded(3000), id="text-3000-bytes"),
        # 1000 characters, but 3 bytes each: the limit is in bytes.
        pytest.param(_padded(3000, "€"), id="text-3000-bytes-multibyte"),
        pytest.param(_padded(3000).encode(), id="binary-3000-bytes"),
    ],
)
async def test_oversized_frame_closes_with_1009(gateway_factory, payload) -> None:
    async with gateway_factory(max_frame_bytes=2048) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ok = await alice.request("ping", pad="a" * 1800)  # under the limit: fine
        assert ok["type"] == "pong"
        await alice.send_raw(payload)
        code, _ = await asyncio.wait_for(alice.closed, 10)
        assert code == 1009
        await alice.close()


# -- frames without an id (a second hello re-authenticates: see test_token_expiry.py) -----


async def test_frames_without_id_get_no_ack_but_errors_with_null_ref(connect) -> None:
    alice = await connect("alice", "user")
    thread_id = (await alice.request("thread.create"))["thread_id"]
    await alice.request("thread.subscribe", thread_id=thread_id)
    await alice.wait_for(lambda f: f.get("type") == "subscribed")
    before = len(alice.frames)

    await alice.send_raw(json.dumps({"type": "thread.unsubscribe", "thread_id": thread_id}))
    await alice.send_raw(json.dumps({"type": "pong"}))
    pong_at = await flush(alice)
    assert alice.frames[before:pong_at] == []  # no ack, nothing at all

    await alice.send_raw(json.dumps({"type": "run.cancel", "run_id": "r_does_not_exist"}))
    await alice.send_raw(json.dumps({"type": "thread.subscribe"}))  # missing thread_id
    await alice.send_raw(json.dumps({"type": "ping"}))
    start = pong_at + 1
    pong_at = await flush(alice)
    replies = alice.frames[start:pong_at]
    assert [(f["type"], f.get("code"), f.get("ref")) for f in replies] == [
        ("error", "not_found", None),
        ("error", "bad_request", None),
        ("pong", None, None),
    ]
    await still_works(alice)


async def test_thread_create_without_id_gets_no_ack(connect, gateway) -> None:
    alice = await connect("alice", "user")
    before = len(alice.frames)
    await alice.send_raw(json.dumps({"type": "thread.create"}))
    pong_at = await flush(alice)
    assert alice.frames[before:pong_at] == []


# -- heartbeats ---------------------------------------------------------------------------------


async def test_server_sends_heartbeat_pings_and_answers_client_ping(gateway_factory) -> None:
    async with gateway_factory(heartbeat_s=0.2) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        assert alice.welcome["heartbeat_s"] == 0.2
        await asyncio.sleep(1.1)
        pings = [f for f in alice.frames if f.get("type") == "ping"]
        assert 3 <= len(pings) <= 8, pings
        assert all(p == {"type": "ping"} for p in pings)
        pong = await alice.request("ping")
        assert pong == {"type": "pong", "ref": pong["ref"]}
        # The client's automatic pongs (Client answers every ping) are never errors.
        assert not errors_of(alice)
        assert not alice.closed.done()
        await alice.close()


# -- slow consumers -----------------------------------------------------------------------------
#
# What it takes to make a client "slow" on loopback: the kernel absorbs a lot. With receive
# buffer autotuning a non-reading client took 50-70 demo stories (several MB) before the
# gateway's writer blocked, because the server's send buffer autotunes up to tcp_wmem's maximum
# (4 MiB here). The tests therefore give the gateway's listening socket a small SO_SNDBUF
# (accepted sockets inherit it), so a few stories fill every buffer on the way.
# Under load the event log merges a story's queued deltas into a few `message.delta`s, which
# leaves ~5 KB of frames per story instead of ~45 KB: hence dozens of stories and a small
# receive buffer on the client (merged frames stay small, so it no longer makes them crawl).

QUEUE = 16
BIG_RUNS = 40


def _slow_settings(**overrides: Any) -> dict[str, Any]:
    # send_timeout_s: how long the gateway waits for room in a full send queue before it
    # closes with 4009. socket_sndbuf: a small kernel send buffer on the gateway's side, so
    # a client that stops reading pushes back after kilobytes rather than megabytes.
    return {
        "send_queue_size": QUEUE,
        "demo_delay_ms": 0,
        "send_timeout_s": 1.0,
        "socket_sndbuf": 8192,
        **overrides,
    }


def _stall_s(gw: Gateway) -> float:
    """Long enough for the gateway to give up on a client that does not read."""
    return float(getattr(gw.settings, "send_timeout_s", 5.0)) + 3.0


async def _raw_slow_client(gw: Gateway, token: str) -> Any:
    """A client that buffers little: one queued message, a small fixed kernel receive buffer.

    (Much smaller SO_RCVBUF values make megabyte frames crawl once the client reads again.)
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port))
    ws = await websockets.connect(
        gw.ws_url,
        sock=sock,
        max_queue=1,
        compression=None,
        max_size=None,
        ping_interval=None,
    )
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "token": token}))
    welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert welcome["type"] == "welcome"
    return ws


async def _start_big_runs(ws: Any, count: int = BIG_RUNS) -> None:
    """`count` + 1 story runs (5-45 KB of frames each, see above), each on a new thread."""
    await ws.send(json.dumps({"type": "run.start", "id": "story", "input": "tell me a story"}))
    for i in range(count):
        story = f"tell me story number {i}"
        await ws.send(json.dumps({"type": "run.start", "id": f"big{i}", "input": story}))


async def _drain_until_closed(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Read everything; the close code received (None: the TCP connection just ended)."""
    frames: list[dict[str, Any]] = []
    try:
        while True:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
    except websockets.ConnectionClosed as closed:
        return frames, closed.rcvd.code if closed.rcvd else None


def _seqs(frames: list[dict[str, Any]], thread_id: str) -> list[int]:
    return [f["seq"] for f in frames if f.get("type") == "event" and f["thread_id"] == thread_id]


async def test_slow_consumer_is_closed_with_4009_and_catches_up(gateway_factory) -> None:
    async with gateway_factory(**_slow_settings(metrics=True)) as gw:
        slow = await _raw_slow_client(gw, gw.token("alice"))
        await _start_big_runs(slow)
        await asyncio.sleep(_stall_s(gw))  # not reading
        frames, code = await _drain_until_closed(slow)
        acks = [f for f in frames if f.get("type") == "ack"]
        assert acks, f"not even the first ack arrived (close code {code})"
        for ack in acks:  # what did arrive was in order, without gaps
            seen = _seqs(frames, ack["thread_id"])
            assert seen == list(range(1, len(seen) + 1))

        # Every run went on without its watcher; a new connection resumes each thread after
        # the last seq the slow one saw, and the log is complete and dense.
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        status, body = await http_get(gw, "/v1/threads", "alice")
        threads = [t["thread_id"] for t in body["threads"]]
        assert {a["thread_id"] for a in acks} <= set(threads)
        for thread_id in threads:
            seen = _seqs(frames, thread_id)
            last = seen[-1] if seen else 0
            await alice.request("thread.subscribe", thread_id=thread_id, after_seq=last)
            finished_before = any(
                f.get("event") == "run.completed" and f.get("thread_id") == thread_id
                for f in frames
            )
            if finished_before:  # the slow client saw this run end: nothing left to catch up
                status, log = await http_get(gw, f"/v1/threads/{thread_id}/events", "alice")
                assert seen == [e["seq"] for e in log["events"]]
                continue
            await alice.wait_for(
                lambda f, t=thread_id: f.get("event") == "run.completed" and f["thread_id"] == t,
                30,
            )
            caught_up = [e["seq"] for e in alice.events_of(thread_id)]
            assert caught_up == list(range(last + 1, last + 1 + len(caught_up)))
            status, log = await http_get(gw, f"/v1/threads/{thread_id}/events", "alice")
            assert status == 200
            assert [e["seq"] for e in log["events"]] == list(range(1, log["head_seq"] + 1))
            assert caught_up[-1] == log["head_seq"]
            assert log["events"][-1]["event"] == "run.completed"
        await alice.close()
        samples = await scrape(gw)
        # Last, so that the catch-up above is checked whatever the close looked like.
        assert code == 4009, (
            f"the slow consumer read {len(frames)} frames, then the connection ended with "
            f"close code {code} (None: no close frame at all) instead of 4009"
        )
        assert value(samples, "gateway_slow_consumer_closes_total") == 1


async def test_fast_consumer_is_not_closed_as_slow(gateway_factory) -> None:
    """A client that reads everything as it comes must not get 4009, whatever the queue size.

    With demo_delay_ms=0 the event log group-commits dozens of deltas at once; a batch larger
    than the send queue is no sign of a slow client.
    """
    async with gateway_factory(**_slow_settings()) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        run_ids = []
        for i in range(3):
            ack = await alice.request("run.start", input=f"tell me a story {i}")
            run_ids.append(ack["run_id"])
        try:
            for run_id in run_ids:
                await alice.wait_for(
                    lambda f, r=run_id: f.get("event") == "run.completed" and f["run_id"] == r, 30
                )
        except ConnectionError:
            pytest.fail(
                f"a client reading as fast as it can was closed {alice.closed.result()} after "
                f"{len(alice.events)} events"
            )
        for thread_id in {e["thread_id"] for e in alice.events}:
            seqs = [e["seq"] for e in alice.events_of(thread_id)]
            assert seqs == list(range(1, len(seqs) + 1))
        await alice.close()


async def test_connection_given_up_is_torn_down(gateway_factory) -> None:
    """After the gateway gives up on a slow client, its side of the connection must end.

    The client stops reading while the gateway still owes it answers (runs streaming, then
    `ping`s with ids), so subscriptions and the reader all wait for room in the send queue
    when the connection is given up. A handler left waiting forever for room nobody will free
    keeps its subscriptions alive and uvicorn's graceful shutdown waiting. Observable from
    outside: the gateway still shuts down promptly (bounded here at 10 s).
    """
    manager = gateway_factory(**_slow_settings())
    gw = await manager.__aenter__()
    slow = None
    try:
        slow = await _raw_slow_client(gw, gw.token("alice"))
        await _start_big_runs(slow)
        for i in range(200):
            await slow.send(f'{{"type":"ping","id":"p{i}"}}')
        await asyncio.sleep(_stall_s(gw))
        await _drain_until_closed(slow)  # the connection does end (see the test above for how)
    finally:
        started = time.monotonic()
        try:
            await asyncio.wait_for(manager.__aexit__(None, None, None), 10)
        except TimeoutError:
            pytest.fail(
                "the gateway did not shut down within 10 s after giving up on a slow "
                "consumer: its connection handler is stuck"
            )
        finally:
            if slow is not None:
                with contextlib.suppress(Exception):
                    await slow.close()
    assert time.monotonic() - started < 10


async def test_a_merge_window_sends_a_paced_story_in_fewer_larger_deltas(gateway_factory) -> None:
    """GATEWAY_DELTA_MERGE_MS: the demo model streams a delta every 10 ms; held 200 ms for
    more of their message's text, they reach the client joined, the text exact."""
    async with gateway_factory(demo_delay_ms=10, delta_merge_ms=200) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input="tell me a story")
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["run_id"] == ack["run_id"], 60
        )
        events = alice.events_of(ack["thread_id"])
        deltas = [e["data"]["delta"] for e in events if e["event"] == "message.delta"]
        (completed,) = [e for e in events if e["event"] == "message.completed"]
        assert "".join(deltas) == completed["data"]["text"]
        words = len(completed["data"]["text"].split())
        # Each joined delta carries about 20 of the model's (200 ms of 10 ms deltas); a
        # loaded machine may split some, never into one per model delta.
        assert len(deltas) * 4 < words, (len(deltas), words)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        await alice.close()
