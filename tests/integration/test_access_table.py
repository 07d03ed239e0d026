"""The access table of docs/protocol.md §3, case by case, over the WebSocket and the HTTP reviewer
API.

Every case works on a thread of `alice` (user, tenant acme) whose run is paused on an
`issue_refund` approval. Principals are the five acme roles of the table plus the four roles in
tenant `globex`; the globex user is also called `alice`, so ownership can never be confused
with a matching user id across tenants.

Expected: allowed -> ack / 200; refused in the same tenant -> `forbidden` / 403; another
tenant's thread, run or approval -> `not_found` / 404, never `forbidden` (and indistinguishable
from an id that does not exist at all).

One gateway per module (and one more with GATEWAY_SELF_APPROVAL=true) keeps the suite fast:
read-only cases share one paused run, mutating cases (input, cancel, decide, start) get a fresh
thread or run each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import Gateway, running_gateway
from tests.support.gateway import test_settings as make_settings

pytestmark = pytest.mark.asyncio(loop_scope="module")

PAUSING_INPUT = "refund order 42 for 30"
OK = "ok"
FORBIDDEN = "forbidden"
NOT_FOUND = "not_found"
HTTP_STATUS = {OK: 200, FORBIDDEN: 403, NOT_FOUND: 404}


@dataclass(frozen=True)
class Who:
    user: str
    role: str
    tenant: str


OWNER = Who("alice", "user", "acme")
PRINCIPALS: dict[str, Who] = {
    "owner": OWNER,
    "other_user": Who("bob", "user", "acme"),
    "reviewer": Who("rita", "reviewer", "acme"),
    "viewer": Who("vera", "viewer", "acme"),
    "admin": Who("adam", "admin", "acme"),
    # Same user id as the owner on purpose: only the tenant differs.
    "globex_user": Who("alice", "user", "globex"),
    "globex_reviewer": Who("rita", "reviewer", "globex"),
    "globex_viewer": Who("vera", "viewer", "globex"),
    "globex_admin": Who("adam", "admin", "globex"),
}
ALL = list(PRINCIPALS)


def _expect(allowed: set[str]) -> list[tuple[str, str]]:
    """(principal, expected) for every principal: globex is always not_found."""
    out = []
    for name, who in PRINCIPALS.items():
        if who.tenant != "acme":
            out.append((name, NOT_FOUND))
        else:
            out.append((name, OK if name in allowed else FORBIDDEN))
    return out


# The table of docs/protocol.md §3.
ACT = _expect({"owner", "admin"})  # start run, send input, cancel own run
SUBSCRIBE = _expect({"owner", "reviewer", "viewer", "admin"})
DECIDE = _expect({"reviewer", "admin"})
DECIDE_SELF = _expect({"owner", "reviewer", "admin"})
# With self-approval on, only these can plausibly change; the rest are covered above.
SELF_APPROVAL_SUBSET = {"owner", "other_user", "viewer", "reviewer", "globex_user"}
DECIDE_SELF = [case for case in DECIDE_SELF if case[0] in SELF_APPROVAL_SUBSET]
# The inbox is tenant-wide, not a resource: the role decides, in either tenant.
INBOX = [
    (name, OK if who.role in ("reviewer", "admin") else FORBIDDEN)
    for name, who in PRINCIPALS.items()
]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{name}-{expected}" for name, expected in cases]


# -- fixtures -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _gateway(tmp: Path, **overrides: Any) -> AsyncIterator[Gateway]:
    async with running_gateway(make_settings(tmp / "gateway.db", **overrides)) as gw:
        yield gw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async with _gateway(tmp_path_factory.mktemp("access"), self_approval=False) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw_self(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async with _gateway(tmp_path_factory.mktemp("access-self"), self_approval=True) as gateway:
        yield gateway


@dataclass(frozen=True)
class Paused:
    thread_id: str
    run_id: str
    approval_id: str


async def pause_a_run(gateway: Gateway) -> Paused:
    """A fresh thread of OWNER whose run waits for review on `issue_refund`."""
    owner = await Client.connect(gateway.ws_url, token_for(gateway, OWNER))
    try:
        ack = await owner.request("run.start", input=PAUSING_INPUT)
        requested = await owner.wait_event("approval.requested")
        await owner.wait_event("run.paused")
        assert requested["data"]["tool_name"] == "issue_refund"
        return Paused(ack["thread_id"], ack["run_id"], requested["data"]["approval_id"])
    finally:
        await owner.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_paused(gw: Gateway) -> Paused:
    """For read-only cases only: nobody decides, cancels or feeds this run."""
    return await pause_a_run(gw)


@pytest_asyncio.fixture(loop_scope="module")
async def open_client() -> AsyncIterator[Callable[[Gateway, Who], Awaitable[Client]]]:
    clients: list[Client] = []

    async def opener(gateway: Gateway, who: Who) -> Client:
        client = await Client.connect(gateway.ws_url, token_for(gateway, who))
        clients.append(client)
        return client

    yield opener
    for client in clients:
        await client.close()


def token_for(gateway: Gateway, who: Who) -> str:
    return gateway.token(who.user, who.role, tenant=who.tenant)


def bearer(gateway: Gateway, who: Who) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for(gateway, who)}"}


# -- assertion helpers --------------------------------------------------------------------------


async def ws_outcome(client: Client, type_: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    try:
        return OK, await client.request(type_, **fields)
    except ProtocolFailure as failure:
        return str(failure.code), failure.frame


def assert_ws(outcome: tuple[str, dict[str, Any]], expected: str) -> dict[str, Any]:
    code, frame = outcome
    assert code == expected, f"expected {expected}, got {code}: {frame}"
    return frame


async def http_outcome(
    gateway: Gateway, who: Who, method: str, path: str, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    async with gateway.http() as http:
        response = await http.request(method, path, headers=bearer(gateway, who), **kwargs)
    return response.status_code, response.json()


def assert_http(outcome: tuple[int, dict[str, Any]], expected: str) -> dict[str, Any]:
    status, body = outcome
    assert status == HTTP_STATUS[expected], f"expected {expected}, got {status}: {body}"
    if expected != OK:
        assert body["error"]["code"] == expected, body
    return body


async def run_status(gateway: Gateway, run_id: str) -> dict[str, Any]:
    status, body = await http_outcome(gateway, OWNER, "GET", f"/v1/runs/{run_id}")
    assert status == 200, body
    return body["run"]


async def thread_events(gateway: Gateway, thread_id: str) -> list[dict[str, Any]]:
    status, body = await http_outcome(gateway, OWNER, "GET", f"/v1/threads/{thread_id}/events")
    assert status == 200, body
    return body["events"]


async def pending_ids(gateway: Gateway) -> set[str]:
    status, body = await http_outcome(gateway, PRINCIPALS["reviewer"], "GET", "/v1/approvals")
    assert status == 200, body
    return {a["approval_id"] for a in body["approvals"]}


# -- start a run, send input, cancel (WebSocket only: there is no HTTP equivalent) --------------


@pytest.mark.parametrize(("name", "expected"), ACT, ids=_ids(ACT))
async def test_run_start_on_existing_thread(gw, open_client, name, expected) -> None:
    owner = await open_client(gw, OWNER)
    idle = (await owner.request("thread.create"))["thread_id"]
    busy = await pause_a_run(gw)
    client = await open_client(gw, PRINCIPALS[name])

    frame = assert_ws(
        await ws_outcome(client, "run.start", thread_id=idle, input="hello there"), expected
    )
    if expected == OK:
        assert frame["thread_id"] == idle and frame["run_id"].startswith("r")
        await client.wait_event("run.started")
        return
    assert await thread_events(gw, idle) == []
    # A busy thread refuses the same way: the denial comes before the `conflict` check.
    assert_ws(await ws_outcome(client, "run.start", thread_id=busy.thread_id, input="x"), expected)
    assert (await run_status(gw, busy.run_id))["status"] == "waiting_for_review"


@pytest.mark.parametrize(("name", "expected"), ACT, ids=_ids(ACT))
async def test_run_input(gw, open_client, name, expected) -> None:
    paused = await pause_a_run(gw)
    client = await open_client(gw, PRINCIPALS[name])
    before = await thread_events(gw, paused.thread_id)

    frame = assert_ws(
        await ws_outcome(client, "run.input", thread_id=paused.thread_id, input="also thanks"),
        expected,
    )
    after = await thread_events(gw, paused.thread_id)
    if expected == OK:
        assert frame["disposition"] == "staged" and frame["run_id"] == paused.run_id
        assert [e["event"] for e in after[len(before) :]] == ["input.staged"]
    else:
        assert after == before


@pytest.mark.parametrize(("name", "expected"), ACT, ids=_ids(ACT))
async def test_run_cancel_owners_run(gw, open_client, name, expected) -> None:
    paused = await pause_a_run(gw)
    client = await open_client(gw, PRINCIPALS[name])

    frame = assert_ws(await ws_outcome(client, "run.cancel", run_id=paused.run_id), expected)
    run = await run_status(gw, paused.run_id)
    if expected == OK:
        assert frame["run_id"] == paused.run_id
        assert run["status"] == "cancelled"
        assert paused.approval_id not in await pending_ids(gw)
    else:
        assert run["status"] == "waiting_for_review"
        assert paused.approval_id in await pending_ids(gw)


# -- subscribe: thread.subscribe, GET events, GET run -------------------------------------------


@pytest.mark.parametrize(("name", "expected"), SUBSCRIBE, ids=_ids(SUBSCRIBE))
async def test_ws_thread_subscribe(gw, shared_paused, open_client, name, expected) -> None:
    client = await open_client(gw, PRINCIPALS[name])
    thread_id = shared_paused.thread_id
    assert_ws(await ws_outcome(client, "thread.subscribe", thread_id=thread_id), expected)
    if expected == OK:
        subscribed = await client.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["thread_id"] == thread_id and subscribed["head_seq"] > 0
        await client.wait_event("run.paused")
        assert [e["seq"] for e in client.events] == list(range(1, subscribed["head_seq"] + 1))
    else:
        pong = await client.request("ping")  # nothing of the thread arrives before this
        assert pong["type"] == "pong"
        assert not client.events
        assert not [f for f in client.frames if f.get("type") == "subscribed"]


@pytest.mark.parametrize(("name", "expected"), SUBSCRIBE, ids=_ids(SUBSCRIBE))
async def test_http_thread_events(gw, shared_paused, name, expected) -> None:
    thread_id = shared_paused.thread_id
    body = assert_http(
        await http_outcome(gw, PRINCIPALS[name], "GET", f"/v1/threads/{thread_id}/events"),
        expected,
    )
    if expected == OK:
        assert body["head_seq"] == len(body["events"]) > 0
        assert {e["thread_id"] for e in body["events"]} == {thread_id}
    else:
        assert "events" not in body


@pytest.mark.parametrize(("name", "expected"), SUBSCRIBE, ids=_ids(SUBSCRIBE))
async def test_http_get_run(gw, shared_paused, name, expected) -> None:
    body = assert_http(
        await http_outcome(gw, PRINCIPALS[name], "GET", f"/v1/runs/{shared_paused.run_id}"),
        expected,
    )
    if expected == OK:
        run = body["run"]
        assert run["status"] == "waiting_for_review"
        assert run["thread_id"] == shared_paused.thread_id
        assert [a["approval_id"] for a in run["pending_approvals"]] == [shared_paused.approval_id]


# -- decide an approval -------------------------------------------------------------------------


async def _decide_ws(gateway: Gateway, open_client, name: str, expected: str) -> None:
    paused = await pause_a_run(gateway)
    client = await open_client(gateway, PRINCIPALS[name])
    frame = assert_ws(
        await ws_outcome(
            client, "approval.decide", approval_id=paused.approval_id, decision="approve"
        ),
        expected,
    )
    await _check_decided(gateway, paused, PRINCIPALS[name], expected, frame.get("approval"))


async def _decide_http(gateway: Gateway, name: str, expected: str) -> None:
    paused = await pause_a_run(gateway)
    body = assert_http(
        await http_outcome(
            gateway,
            PRINCIPALS[name],
            "POST",
            f"/v1/approvals/{paused.approval_id}/decision",
            json={"decision": "approve", "reason": "fine"},
        ),
        expected,
    )
    await _check_decided(gateway, paused, PRINCIPALS[name], expected, body.get("approval"))


async def _check_decided(
    gateway: Gateway, paused: Paused, who: Who, expected: str, approval: dict[str, Any] | None
) -> None:
    if expected == OK:
        assert approval is not None
        assert approval["approval_id"] == paused.approval_id
        assert approval["status"] == "approved" and approval["reviewer"] == who.user
        assert paused.approval_id not in await pending_ids(gateway)
    else:
        assert approval is None
        assert paused.approval_id in await pending_ids(gateway)
        run = await run_status(gateway, paused.run_id)
        assert run["status"] == "waiting_for_review"
        events = [e["event"] for e in await thread_events(gateway, paused.thread_id)]
        assert "approval.decided" not in events


@pytest.mark.parametrize(("name", "expected"), DECIDE, ids=_ids(DECIDE))
async def test_ws_decide(gw, open_client, name, expected) -> None:
    await _decide_ws(gw, open_client, name, expected)


@pytest.mark.parametrize(("name", "expected"), DECIDE, ids=_ids(DECIDE))
async def test_http_decide(gw, name, expected) -> None:
    await _decide_http(gw, name, expected)


@pytest.mark.parametrize(("name", "expected"), DECIDE_SELF, ids=_ids(DECIDE_SELF))
async def test_ws_decide_with_self_approval(gw_self, open_client, name, expected) -> None:
    await _decide_ws(gw_self, open_client, name, expected)


@pytest.mark.parametrize(("name", "expected"), DECIDE_SELF, ids=_ids(DECIDE_SELF))
async def test_http_decide_with_self_approval(gw_self, name, expected) -> None:
    await _decide_http(gw_self, name, expected)


# -- inbox: inbox.subscribe, GET /v1/approvals --------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), INBOX, ids=_ids(INBOX))
async def test_ws_inbox_subscribe(gw, shared_paused, open_client, name, expected) -> None:
    who = PRINCIPALS[name]
    client = await open_client(gw, who)
    assert_ws(await ws_outcome(client, "inbox.subscribe"), expected)
    if expected == OK:
        inbox = await client.wait_for(lambda f: f.get("type") == "inbox")
        ids = {a["approval_id"] for a in inbox["approvals"]}
        if who.tenant == "acme":
            assert shared_paused.approval_id in ids
        else:
            assert inbox["approvals"] == []  # nothing of acme leaks into globex
    else:
        await client.request("ping")
        assert not [f for f in client.frames if f.get("type") in ("inbox", "inbox.update")]


@pytest.mark.parametrize(("name", "expected"), INBOX, ids=_ids(INBOX))
async def test_http_list_approvals(gw, shared_paused, name, expected) -> None:
    who = PRINCIPALS[name]
    body = assert_http(await http_outcome(gw, who, "GET", "/v1/approvals"), expected)
    if expected == OK:
        ids = {a["approval_id"] for a in body["approvals"]}
        if who.tenant == "acme":
            assert shared_paused.approval_id in ids
        else:
            assert body["approvals"] == []


# -- another tenant's ids look exactly like ids that do not exist -------------------------------


@pytest.mark.parametrize("name", ["globex_user", "globex_admin"])
async def test_cross_tenant_is_indistinguishable_from_missing(
    gw, shared_paused, open_client, name
) -> None:
    client = await open_client(gw, PRINCIPALS[name])
    probes = [
        ("thread.subscribe", {"thread_id": shared_paused.thread_id}, {"thread_id": "t_missing"}),
        ("run.cancel", {"run_id": shared_paused.run_id}, {"run_id": "r_missing"}),
        (
            "approval.decide",
            {"approval_id": shared_paused.approval_id, "decision": "approve"},
            {"approval_id": "a_missing", "decision": "approve"},
        ),
    ]
    for type_, real, missing in probes:
        _, real_frame = await ws_outcome(client, type_, **real)
        _, missing_frame = await ws_outcome(client, type_, **missing)
        assert real_frame["code"] == missing_frame["code"] == NOT_FOUND
        assert real_frame["message"] == missing_frame["message"], type_
    for real_path, missing_path in [
        (f"/v1/threads/{shared_paused.thread_id}/events", "/v1/threads/t_missing/events"),
        (f"/v1/runs/{shared_paused.run_id}", "/v1/runs/r_missing"),
    ]:
        real_out = await http_outcome(gw, PRINCIPALS[name], "GET", real_path)
        missing_out = await http_outcome(gw, PRINCIPALS[name], "GET", missing_path)
        assert real_out == missing_out
        assert real_out[0] == 404
