"""The audit trail: decisions, cancellations, token failures and access denials are recorded
with who, what, when and from where; `GET /v1/audit` is admin-only, per tenant, filterable and
paginated; entries outlive retention of run data; a flood of refusals stays bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateway.auth.audit_trail import AuditTrail, Transport, system_entry
from tests.support.client import Client, ProtocolFailure, clients
from tests.support.gateway import TEST_SECRET, Gateway
from tests.support.storage import migrated_store

ADMIN = ("root", "admin")


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def audit_get(
    gw: Gateway,
    params: dict[str, Any] | None = None,
    *,
    tenant: str = "acme",
    token: str | None = None,
) -> Any:
    token = token if token is not None else gw.token(*ADMIN, tenant=tenant)
    async with gw.http() as http:
        return await http.get(
            "/v1/audit", params=params or {}, headers={"Authorization": f"Bearer {token}"}
        )


async def audit_entries(gw: Gateway, tenant: str = "acme", **params: Any) -> list[dict[str, Any]]:
    response = await audit_get(gw, {"limit": 500, **params}, tenant=tenant)
    assert response.status_code == 200, response.text
    return list(response.json()["audit"])


async def eventually(
    gw: Gateway, ready: Callable[[list[dict[str, Any]]], bool], tenant: str = "acme", **params: Any
) -> list[dict[str, Any]]:
    """Refusals are written by a background task: poll until they are all there."""
    for _ in range(100):
        entries = await audit_entries(gw, tenant, **params)
        if ready(entries):
            return entries
        await asyncio.sleep(0.05)
    raise AssertionError(f"audit entries never matched: {entries}")


def db_rows(db_path: Path, action: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db_path) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "select * from audit where action = ? order by audit_id", (action,)
        ).fetchall()
    return [dict(row) for row in rows]


async def db_rows_written(db_path: Path, action: str, at_least: int) -> list[dict[str, Any]]:
    """`db_rows` once the background task has written `at_least` of them (or after 5 s, for
    the caller's assertion to show what there is)."""
    for _ in range(100):
        rows = db_rows(db_path, action)
        if len(rows) >= at_least:
            break
        await asyncio.sleep(0.05)
    return rows


# -- what is recorded -------------------------------------------------------------------------


async def test_decisions_are_recorded_with_who_what_when_and_where(
    gateway, connect, db_path
) -> None:
    before = datetime.now(UTC)
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    ack = await alice.request("run.start", input="refund order 3 for 4 and email a@example.com")
    await alice.wait_event("run.paused")
    requested = [e["data"] for e in alice.events if e["event"] == "approval.requested"]
    assert len(requested) == 2
    first, second = requested
    await bob.request("approval.decide", approval_id=first["approval_id"], decision="approve")
    async with gateway.http() as http:
        response = await http.post(
            f"/v1/approvals/{second['approval_id']}/decision",
            json={"decision": "reject", "reason": "not today"},
            headers={"Authorization": f"Bearer {gateway.token('bob', 'reviewer')}"},
        )
    assert response.status_code == 200
    after = datetime.now(UTC)

    # Written in the decision's own transaction: there at once, no waiting.
    entries = await audit_entries(gateway, action="approval.decided")
    assert [e["target"] for e in entries] == [first["approval_id"], second["approval_id"]]
    with sqlite3.connect(db_path) as db:
        digests = dict(db.execute("select approval_id, arguments_digest from approvals"))
    for entry, approval, decision in zip(
        entries, (first, second), ("approve", "reject"), strict=True
    ):
        assert entry["actor"] == "bob" and entry["tenant"] == "acme"
        assert entry["outcome"] == "success"
        assert entry["source"] == "127.0.0.1"
        assert before - timedelta(seconds=1) <= parse_ts(entry["at"]) <= after
        assert entry["details"] == {
            "decision": decision,
            "run_id": ack["run_id"],
            "thread_id": ack["thread_id"],
            "tool_name": approval["tool_name"],
            "arguments_digest": digests[approval["approval_id"]],
            "reason_given": decision == "reject",
        }


async def test_cancellations_are_recorded_idle_and_streaming(gateway_factory) -> None:
    async with gateway_factory(demo_delay_ms=20) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        paused = await alice.request("run.start", input="refund order 3 for 4")
        await alice.wait_event("run.paused")
        await alice.request("run.cancel", run_id=paused["run_id"])

        streaming = await alice.request("run.start", input="tell me a story")
        await alice.wait_for(
            lambda f: f.get("event") == "message.delta" and f["run_id"] == streaming["run_id"]
        )
        await alice.request("run.cancel", run_id=streaming["run_id"])

        entries = await audit_entries(gw, action="run.cancelled")
    assert [(e["target"], e["details"]) for e in entries] == [
        (paused["run_id"], {"thread_id": paused["thread_id"], "status": "waiting_for_review"}),
        (streaming["run_id"], {"thread_id": streaming["thread_id"], "status": "running"}),
    ]
    for entry in entries:
        assert entry["actor"] == "alice" and entry["outcome"] == "success"
        assert entry["source"] == "127.0.0.1"


async def test_token_failures_are_recorded_without_the_token(gateway, db_path) -> None:
    now = int(time.time())
    expired = jwt.encode(
        {"sub": "alice", "tenant": "acme", "exp": now - 3600}, TEST_SECRET, algorithm="HS256"
    )
    forged = jwt.encode({"sub": "alice", "tenant": "acme", "exp": now + 3600}, "x" * 64)
    for bad in (expired, forged):
        with pytest.raises(ProtocolFailure) as failure:
            await Client.connect(gateway.ws_url, bad)
        assert failure.value.code == "unauthorized"
    async with gateway.http() as http:
        assert (await http.get("/v1/threads")).status_code == 401
        response = await http.get("/v1/threads", headers={"Authorization": "Bearer not-a-jwt"})
        assert response.status_code == 401

    rows = await db_rows_written(db_path, "auth.token_rejected", 4)
    assert [json.loads(r["details"]) for r in rows] == [
        {"transport": "ws", "reason": "expired"},
        {"transport": "ws", "reason": "bad_signature"},
        {"transport": "http", "reason": "missing"},
        {"transport": "http", "reason": "invalid"},
    ]
    for row in rows:
        assert row["outcome"] == "denied" and row["source"] == "127.0.0.1"
        # Unverified claims are not trusted: no actor, no tenant.
        assert row["actor"] is None and row["tenant"] is None
        assert expired not in str(row) and forged not in str(row)
    # Tenant-less, so no tenant's admin sees them through the API.
    assert await audit_entries(gateway, action="auth.token_rejected") == []


async def test_access_denials_are_recorded_ws_and_http(gateway, connect) -> None:
    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input="hello")
    await alice.wait_event("run.completed")
    thread_id, run_id = ack["thread_id"], ack["run_id"]

    bob = await connect("bob", "user")
    with pytest.raises(ProtocolFailure, match="forbidden"):
        await bob.request("run.cancel", run_id=run_id)
    mallory = await connect("mallory", "admin", tenant="other")
    with pytest.raises(ProtocolFailure, match="not_found"):
        await mallory.request("thread.subscribe", thread_id=thread_id)
    async with gateway.http() as http:

        def auth(user: str, role: str, tenant: str = "acme") -> dict[str, str]:
            return {"Authorization": f"Bearer {gateway.token(user, role, tenant=tenant)}"}

        assert (await http.get("/v1/approvals", headers=auth("vera", "viewer"))).status_code == 403
        response = await http.get(f"/v1/runs/{run_id}", headers=auth("mallory", "admin", "other"))
        assert response.status_code == 404

    def summary(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (
                e["actor"],
                e["target"],
                e["details"]["code"],
                e["details"]["operation"],
                e["details"]["transport"],
            )
            for e in entries
        ]

    acme = await eventually(gateway, lambda e: len(e) >= 2, action="access.denied")
    assert summary(acme) == [
        ("bob", run_id, "forbidden", "run.cancel", "ws"),
        ("vera", None, "forbidden", "GET /v1/approvals", "http"),
    ]
    # The probe into another tenant is recorded in the prober's tenant, never in the target's.
    other = await eventually(gateway, lambda e: len(e) >= 2, tenant="other", action="access.denied")
    assert summary(other) == [
        ("mallory", thread_id, "not_found", "thread.subscribe", "ws"),
        ("mallory", run_id, "not_found", "GET /v1/runs/{run_id}", "http"),
    ]
    for entry in acme + other:
        assert entry["outcome"] == "denied" and entry["source"] == "127.0.0.1"


# -- GET /v1/audit ----------------------------------------------------------------------------


async def test_audit_endpoint_is_for_admins_of_the_tenant_only(gateway, connect) -> None:
    async with gateway.http() as http:
        missing = await http.get("/v1/audit")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "unauthorized"
    for role in ("user", "reviewer", "viewer"):
        response = await audit_get(gateway, token=gateway.token("eve", role))
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"

    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input="refund order 3 for 4")
    await alice.wait_event("run.paused")
    await alice.request("run.cancel", run_id=ack["run_id"])
    assert len(await audit_entries(gateway, action="run.cancelled")) == 1
    # Another tenant's admin sees none of it.
    assert await audit_entries(gateway, tenant="other", action="run.cancelled") == []
    # The refused reads are themselves on the trail.
    refused = await eventually(gateway, lambda e: len(e) >= 3, action="access.denied")
    assert {e["actor"] for e in refused} == {"eve"}
    assert {e["details"]["operation"] for e in refused} == {"GET /v1/audit"}


async def test_audit_filters_and_pagination(gateway, connect) -> None:
    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input="hello")
    await alice.wait_event("run.completed")
    run_id = ack["run_id"]
    bob = await connect("bob", "user")
    vera = await connect("vera", "viewer")

    async def refuse(client: Client, times: int) -> None:
        for _ in range(times):
            with pytest.raises(ProtocolFailure):
                await client.request("run.cancel", run_id=run_id)

    await refuse(bob, 2)
    await eventually(gateway, lambda e: len(e) == 2, action="access.denied")
    await asyncio.sleep(0.05)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await refuse(bob, 1)
    await refuse(vera, 2)
    everything = await eventually(gateway, lambda e: len(e) == 5, action="access.denied")
    ids = [e["audit_id"] for e in everything]
    assert ids == sorted(ids)

    async def actors(**params: Any) -> list[str]:
        return [e["actor"] for e in await audit_entries(gateway, **params)]

    assert await actors(actor="bob") == ["bob"] * 3
    assert await actors(actor="vera", action="access.denied") == ["vera"] * 2
    assert await actors(target=run_id) == ["bob", "bob", "bob", "vera", "vera"]
    assert await actors(target="r_nothing") == []
    assert await actors(action="approval.decided") == []
    assert await actors(since=middle.isoformat()) == ["bob", "vera", "vera"]
    assert await actors(until=middle.isoformat()) == ["bob", "bob"]
    # The same instant written with another offset, and a date without a time.
    shifted = middle.astimezone(UTC).replace(tzinfo=None) + timedelta(hours=2)
    assert await actors(since=shifted.isoformat() + "+02:00") == ["bob", "vera", "vera"]
    assert len(await actors(since="2000-01-01", until="2999-01-01")) == 5

    pages: list[list[int]] = []
    after_id: int | None = 0
    while after_id is not None:
        response = await audit_get(gateway, {"limit": 2, "after_id": after_id})
        body = response.json()
        pages.append([e["audit_id"] for e in body["audit"]])
        after_id = body["next_after_id"]
    assert pages == [ids[0:2], ids[2:4], ids[4:]]
    # The shape, field by field.
    entry = everything[0]
    assert set(entry) == {
        "audit_id",
        "at",
        "tenant",
        "actor",
        "action",
        "outcome",
        "target",
        "source",
        "details",
    }
    assert entry["at"].endswith("Z")


@pytest.mark.parametrize(
    ("params", "mentions"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after_id": "-1"}, "after_id"),
        ({"after_id": "x"}, "after_id"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
        ({"action": ""}, "action"),
        ({"actor": "a" * 129}, "actor"),
        ({"target": ""}, "target"),
    ],
)
async def test_bad_audit_filters_are_bad_requests(
    gateway, params: dict[str, str], mentions: str
) -> None:
    response = await audit_get(gateway, params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "bad_request" and mentions in error["message"]


# -- durability and floods --------------------------------------------------------------------


async def test_audit_outlives_retention_of_run_data(gateway_factory, db_path) -> None:
    async with (
        gateway_factory(retention_s=0.5, retention_sweep_s=0.2) as gw,
        clients(gw) as connect,
    ):
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="refund order 3 for 4")
        requested = await alice.wait_event("approval.requested")
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        before = await audit_entries(gw)
        assert [e["action"] for e in before] == ["approval.decided"]

        for _ in range(100):  # the sweep runs every 0.2 s once the run is 0.5 s old
            with sqlite3.connect(db_path) as db:
                left = db.execute(
                    "select count(*) from events where run_id = ?", (ack["run_id"],)
                ).fetchone()[0]
            if left == 0:
                break
            await asyncio.sleep(0.1)
        assert left == 0, "retention never removed the run's events"
        assert await audit_entries(gw) == before


async def test_a_flood_of_refusals_is_bounded_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with migrated_store(f"sqlite:///{tmp_path / 'audit.db'}") as store:
        trail = AuditTrail(store, max_queued=10)
        trail.start()
        with caplog.at_level(logging.WARNING, logger="gateway.auth.audit_trail"):
            # No await in between: the writer cannot drain, so the queue overflows.
            for _ in range(50):
                trail.token_rejected(
                    source="203.0.113.9", transport=Transport.HTTP, message="token is invalid"
                )
            assert trail.dropped_total == 40
            # A system action (what approval expiry records), written at once.
            await trail.record(
                system_entry(
                    "approval.expired", tenant="acme", target="ap_1", details={"run_id": "r_1"}
                )
            )
            await trail.close()
        assert "dropped 40 entries" in caplog.text
    with sqlite3.connect(tmp_path / "audit.db") as db:
        counts = dict(db.execute("select action, count(*) from audit group by action"))
        system = db.execute(
            "select actor, tenant, target, outcome from audit where action = 'approval.expired'"
        ).fetchall()
    assert counts == {"auth.token_rejected": 10, "approval.expired": 1}
    assert system == [("system", "acme", "ap_1", "success")]
