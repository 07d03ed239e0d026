"""Threads as people see them (docs/protocol.md §8 "Threads") on a real server: titles from the
first input, renames over HTTP and the WebSocket, archive, delete, the audit trail of each, and
the live thread list over SSE and the WebSocket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.test_http_api import assert_error, bearer, paused_refund
from tests.integration.test_metrics import scrape, value
from tests.integration.test_sse import messages
from tests.integration.test_token_expiry import rehello
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import Gateway

pytestmark = pytest.mark.both_backends


async def listed(gw: Gateway, user: str, *roles: str, **params: str) -> list[dict[str, Any]]:
    async with gw.http() as http:
        response = await http.get("/v1/threads", headers=bearer(gw, user, *roles), params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["threads"])


async def test_a_thread_is_titled_by_its_first_input_and_listed_with_its_state(
    gateway: Gateway, connect: Any
) -> None:
    alice, thread_id, run_id, _ = await paused_refund(connect, "  refund order 42\n for 30  ")
    (thread,) = await listed(gateway, "alice", "user")
    assert thread["thread_id"] == thread_id
    assert thread["title"] == "refund order 42 for 30"
    assert thread["status"] == "waiting_for_review" and thread["run_id"] == run_id
    assert thread["pending_approvals"] == 1
    assert thread["archived"] is False and thread["archived_at"] is None
    assert thread["last_activity_at"] >= thread["created_at"]

    # A later input does not rename it; an empty thread gets the title of its first run.
    empty = await alice.request("thread.create")
    async with gateway.http() as http:
        one = await http.get(f"/v1/threads/{empty['thread_id']}", headers=bearer(gateway, "alice"))
    assert one.json()["thread"]["title"] is None and one.json()["thread"]["status"] is None
    await alice.request("run.start", thread_id=empty["thread_id"], input="tell me a story " * 10)
    await alice.wait_event("run.completed", timeout=30)
    titles = {t["thread_id"]: t["title"] for t in await listed(gateway, "alice", "user")}
    assert len(titles[empty["thread_id"]]) == 80 and titles[empty["thread_id"]].endswith("…")
    assert titles[thread_id] == "refund order 42 for 30"


async def test_rename_and_archive_over_http_and_the_websocket_are_audited(
    gateway: Gateway, connect: Any
) -> None:
    alice, thread_id, _, _ = await paused_refund(connect)
    owner = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        renamed = await http.patch(
            f"/v1/threads/{thread_id}", headers=owner, json={"title": "  Refund for Ann  "}
        )
        assert renamed.status_code == 200, renamed.text
        assert renamed.json()["thread"]["title"] == "Refund for Ann"
        # Refusals change nothing.
        for body in ({"title": ""}, {"title": "x" * 201}, {"title": 5}, {"archived": "yes"}, {}):
            assert_error(
                await http.patch(f"/v1/threads/{thread_id}", headers=owner, json=body),
                400,
                "bad_request",
            )
        bob = bearer(gateway, "bob", "reviewer")
        assert_error(
            await http.patch(f"/v1/threads/{thread_id}", headers=bob, json={"title": "mine"}),
            403,
            "forbidden",
        )
        other = bearer(gateway, "eve", "admin", tenant="other")
        assert_error(
            await http.patch(f"/v1/threads/{thread_id}", headers=other, json={"title": "x"}),
            404,
            "not_found",
        )

    ack = await alice.request("thread.update", thread_id=thread_id, archived=True, title="Ann")
    assert ack["thread"]["archived"] is True and ack["thread"]["title"] == "Ann"
    assert await listed(gateway, "alice", "user") == []
    (archived,) = await listed(gateway, "alice", "user", archived="true")
    assert archived["thread_id"] == thread_id and archived["archived_at"]
    with pytest.raises(ProtocolFailure) as refused:
        await alice.request("thread.update", thread_id=thread_id, title="\n \t")
    assert refused.value.code == "bad_request"
    ack = await alice.request("thread.update", thread_id=thread_id, archived=False)
    assert ack["thread"]["archived"] is False

    async with gateway.http() as http:
        audit = await http.get(
            "/v1/audit", headers=bearer(gateway, "root", "admin"), params={"target": thread_id}
        )
    actions = [entry["action"] for entry in audit.json()["audit"]]
    assert actions.count("thread.renamed") == 2
    assert actions.count("thread.archived") == 1 and actions.count("thread.unarchived") == 1
    entry = next(e for e in audit.json()["audit"] if e["action"] == "thread.renamed")
    assert entry["actor"] == "alice" and entry["details"] == {"owner": "alice"}
    # The words people wrote stay out of the trail.
    assert "Ann" not in str(audit.json())


async def test_delete_removes_the_conversation_and_keeps_decisions_and_the_audit_trail(
    gateway: Gateway, connect: Any
) -> None:
    alice, thread_id, run_id, requested = await paused_refund(connect)
    owner = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        # A thread whose run is active (here: waiting for a decision) is not deleted.
        assert_error(await http.delete(f"/v1/threads/{thread_id}", headers=owner), 409, "conflict")
        decided = await http.post(
            f"/v1/approvals/{requested['approval_id']}/decision",
            headers=bearer(gateway, "bob", "reviewer"),
            json={"decision": "approve"},
        )
        assert decided.status_code == 200
    await alice.wait_event("run.completed", timeout=30)
    async with gateway.http() as http:
        assert_error(
            await http.delete(
                f"/v1/threads/{thread_id}", headers=bearer(gateway, "bob", "reviewer")
            ),
            403,
            "forbidden",
        )
        gone = await http.delete(f"/v1/threads/{thread_id}", headers=owner)
        assert gone.status_code == 200 and gone.json() == {"thread_id": thread_id, "deleted": True}
        # Gone for everyone, everywhere; a second delete finds nothing.
        admin = bearer(gateway, "root", "admin")
        for path in (f"/v1/threads/{thread_id}", f"/v1/threads/{thread_id}/events"):
            assert_error(await http.get(path, headers=admin), 404, "not_found")
        assert_error(await http.delete(f"/v1/threads/{thread_id}", headers=owner), 404, "not_found")
        audit = (await http.get("/v1/audit", headers=admin, params={"target": thread_id})).json()
        decision = await http.get(
            "/v1/audit", headers=admin, params={"target": requested["approval_id"]}
        )
        run = await http.get(f"/v1/runs/{run_id}", headers=admin)
    assert await listed(gateway, "root", "admin") == []
    assert await listed(gateway, "root", "admin", archived="true") == []
    with pytest.raises(ProtocolFailure) as refused:
        await alice.request("thread.subscribe", thread_id=thread_id)
    assert refused.value.code == "not_found"
    with pytest.raises(ProtocolFailure) as refused:
        await alice.request("run.input", thread_id=thread_id, input="again")
    assert refused.value.code == "not_found"
    deleted = [e for e in audit["audit"] if e["action"] == "thread.deleted"]
    assert [e["actor"] for e in deleted] == ["alice"]
    # The decision stays on record (who approved what), as retention keeps it.
    (decided_entry,) = decision.json()["audit"]
    assert decided_entry["action"] == "approval.decided" and decided_entry["actor"] == "bob"
    assert_error(run, 404, "not_found")


async def test_the_live_list_follows_runs_renames_archives_and_deletes_over_sse(
    gateway: Gateway, connect: Any
) -> None:
    headers = bearer(gateway, "alice", "user")
    updates: list[dict[str, Any]] = []
    first: dict[str, Any] = {}

    async def read_feed(ready: asyncio.Event, done: asyncio.Event) -> None:
        async with (
            gateway.http() as http,
            http.stream("GET", "/v1/threads/stream", headers=headers) as response,
        ):
            assert response.status_code == 200
            async for message in messages(response):
                if message.comment:
                    continue
                if message.event == "threads":
                    first.update(message.frame)
                    ready.set()
                    continue
                assert message.event == "threads.update"
                updates.append(message.frame)
                if message.frame["removed"]:
                    done.set()
                    return

    ready, done = asyncio.Event(), asyncio.Event()
    reader = asyncio.create_task(read_feed(ready, done))
    await asyncio.wait_for(ready.wait(), 10)
    assert first == {"type": "threads", "threads": []}

    alice, thread_id, _, requested = await paused_refund(connect)

    async def seen(predicate: Any) -> dict[str, Any]:
        for _ in range(200):
            for frame in updates:
                for thread in frame["threads"]:
                    if predicate(thread):
                        return dict(thread)
            await asyncio.sleep(0.05)
        raise AssertionError(f"not seen in {updates}")

    waiting = await seen(lambda t: t["pending_approvals"] == 1)
    assert waiting["thread_id"] == thread_id and waiting["status"] == "waiting_for_review"
    async with gateway.http() as http:
        await http.post(
            f"/v1/approvals/{requested['approval_id']}/decision",
            headers=bearer(gateway, "bob", "reviewer"),
            json={"decision": "reject"},
        )
    await seen(lambda t: t["status"] == "completed" and t["pending_approvals"] == 0)
    await alice.request("thread.update", thread_id=thread_id, title="Renamed live")
    await seen(lambda t: t["title"] == "Renamed live")
    await alice.request("thread.delete", thread_id=thread_id)
    await asyncio.wait_for(done.wait(), 10)
    assert updates[-1]["removed"] == [thread_id] and updates[-1]["threads"] == []
    await reader
    # Another user's threads never reach alice's list.
    carol = await connect("carol", "user")
    await carol.request("run.start", input="tell me a story")
    assert all(t["owner"] == "alice" for frame in updates for t in frame["threads"])


async def test_the_live_list_over_the_websocket_per_reader(gateway: Gateway, connect: Any) -> None:
    bob = await connect("bob", "reviewer")
    await bob.request("threads.subscribe")
    snapshot = await bob.wait_for(lambda f: f["type"] == "threads")
    assert snapshot["threads"] == []
    archive_reader = await connect("alice", "user")
    await archive_reader.request("threads.subscribe", archived=True)
    await archive_reader.wait_for(lambda f: f["type"] == "threads")

    alice, thread_id, _, _ = await paused_refund(connect)
    # A reviewer sees the tenant's threads, with the approval waiting on this one.
    update = await bob.wait_for(
        lambda f: (
            f["type"] == "threads.update" and any(t["pending_approvals"] == 1 for t in f["threads"])
        )
    )
    assert update["threads"][0]["thread_id"] == thread_id
    await alice.request("thread.update", thread_id=thread_id, archived=True)
    # Archived: it leaves the reviewer's list and enters the archive list.
    left = await bob.wait_for(lambda f: f["type"] == "threads.update" and f["removed"])
    assert left["removed"] == [thread_id]
    entered = await archive_reader.wait_for(
        lambda f: f["type"] == "threads.update" and f["threads"]
    )
    assert entered["threads"][0]["archived"] is True

    # A token without a role that lists threads is refused, over both transports.
    nobody = await Client.connect(gateway.ws_url, gateway.verifier.issue("nobody", "acme", ()))
    with pytest.raises(ProtocolFailure) as refused:
        await nobody.request("threads.subscribe")
    assert refused.value.code == "forbidden"
    async with gateway.http() as http:
        assert_error(
            await http.get(
                "/v1/threads/stream",
                headers={"Authorization": f"Bearer {gateway.verifier.issue('nobody', 'acme', ())}"},
            ),
            403,
            "forbidden",
        )
        assert_error(
            await http.get(
                "/v1/threads/stream",
                headers=bearer(gateway, "bob", "reviewer"),
                params={"archived": "maybe"},
            ),
            400,
            "bad_request",
        )


async def test_an_approval_carries_the_input_it_is_for_and_its_thread_keeps_its_title(
    gateway: Gateway, connect: Any
) -> None:
    bob = await connect("bob", "reviewer")
    await bob.request("inbox.subscribe")
    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input="what is the status of order 3?")
    await alice.wait_event("run.completed", timeout=30)
    await alice.request("run.input", thread_id=ack["thread_id"], input="refund order 42 for 30")
    added = await bob.wait_for(lambda f: f["type"] == "inbox.update" and f["added"])
    (approval,) = added["added"]
    assert approval["run_input"] == "refund order 42 for 30"
    async with gateway.http() as http:
        inbox = await http.get("/v1/approvals", headers=bearer(gateway, "bob", "reviewer"))
        thread = await http.get(
            f"/v1/threads/{ack['thread_id']}", headers=bearer(gateway, "bob", "reviewer")
        )
    assert inbox.json()["approvals"][0]["run_input"] == "refund order 42 for 30"
    assert thread.json()["thread"]["title"] == "what is the status of order 3?"


async def test_a_list_followed_under_new_roles_holds_what_they_allow(
    gateway: Gateway, connect: Any
) -> None:
    carol = await connect("carol", "user")
    await carol.request("run.start", input="tell me a story")
    await carol.wait_event("run.completed", timeout=30)
    alice = await connect("alice", "user", "reviewer")
    await alice.request("threads.subscribe")
    first = await alice.wait_for(lambda f: f["type"] == "threads")
    assert [t["owner"] for t in first["threads"]] == ["carol"]
    # A new hello with the user role alone: the list is sent again, alice's own threads only.
    await rehello(alice, gateway.token("alice", "user"), "h2")
    again = await alice.wait_for(lambda f: f["type"] == "threads" and f is not first)
    assert again["threads"] == []


async def test_lists_and_changes_are_counted(gateway_factory: Any) -> None:
    async with gateway_factory(metrics=True) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        await alice.request("threads.subscribe")
        ack = await alice.request("run.start", input="tell me a story")
        await alice.wait_event("run.completed", timeout=30)
        await alice.request("thread.update", thread_id=ack["thread_id"], title="A story")
        await alice.request("thread.update", thread_id=ack["thread_id"], archived=True)
        await alice.request("thread.delete", thread_id=ack["thread_id"])
        samples = await scrape(gw)
        assert value(samples, "gateway_thread_lists") == 1
        for action in ("renamed", "archived", "deleted"):
            assert value(samples, "gateway_thread_changes_total", action=action) == 1
        await alice.close()
        for _ in range(100):
            if value(await scrape(gw), "gateway_thread_lists") == 0:
                break
            await asyncio.sleep(0.05)
        assert value(await scrape(gw), "gateway_thread_lists") == 0


async def test_a_deleted_threads_id_is_never_used_again(gateway: Gateway, connect: Any) -> None:
    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input="tell me a story")
    await alice.wait_event("run.completed", timeout=30)
    await alice.request("thread.delete", thread_id=ack["thread_id"])
    # The AI SDK adapter makes a thread under the id its client chose: not this one again.
    chat = {
        "id": ack["thread_id"],
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        "trigger": "submit-message",
    }
    async with gateway.http() as http:
        answer = await http.post("/v1/ai-sdk/chat", json=chat, headers=bearer(gateway, "alice"))
    assert_error(answer, 404, "not_found")
    assert await listed(gateway, "alice", "user") == []
