"""The operator's command line (docs/operations.md "Operator's command line"), run as a real
subprocess on the database of a real gateway: what it lists, exports and cancels is what the
gateway stored, and what it writes is what the gateway's clients then see."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.registry import AgentRegistry
from gateway.auth.access import TokenVerifier
from gateway.protocol.frames import utc_ts
from gateway.run_lifecycle.sensitive_arguments import MASK
from persistence import schema
from persistence.backends import open_store
from persistence.clock import utcnow
from tests.integration.test_sensitive_arguments import CARD, SSN, vault_graph
from tests.support.agents import EffectLog
from tests.support.client import Client, ProtocolFailure, clients
from tests.support.fork_server import run_gateway_command
from tests.support.gateway import ROOT, TEST_SECRET, Gateway, GatewayProcess, spawn_gateway
from tests.support.redis import bus_prefix, require_redis

pytestmark = pytest.mark.both_backends

REFUND = "refund order 42 for 30 dollars"
STORY = "tell me a story"
INSTANCE = "gw-operator-test"
# Between the two pauses of the listing test: well over twice a command's start-up (under a
# second forked, tests/support/fork_server.py; the test retries a pair that took longer).
GAP_S = 8.0


@dataclass
class Done:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def cli(database_url: str, *args: str, env: dict[str, str] | None = None) -> Done:
    """`python -m gateway ARGS` in a subprocess (tests/support/fork_server.py) on
    `database_url` (through the environment, as an operator's shell would have it), without
    blocking the gateway serving in this loop."""
    done = await asyncio.to_thread(
        run_gateway_command,
        args,
        env={**os.environ, "GATEWAY_DATABASE_URL": database_url, **(env or {})},
        cwd=ROOT,
        timeout=60,
    )
    return Done(done.returncode, done.stdout, done.stderr)


async def paused_refund(client: Client) -> dict[str, Any]:
    """Start a refund and wait for its pause: the ack, with the approval id."""
    ack = await client.request("run.start", input=REFUND)
    requested = await finished(client, ack["run_id"], "approval.requested")
    await finished(client, ack["run_id"], "run.paused")
    return {**ack, "approval_id": requested["data"]["approval_id"]}


@asynccontextmanager
async def paused_with_a_reviewer(
    gateway_factory: Any,
) -> AsyncIterator[tuple[Gateway, Client, Client, dict[str, Any]]]:
    """A gateway with alice (`user`) and bob (`reviewer`) connected, and alice's refund paused."""
    async with gateway_factory() as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        yield gw, alice, bob, await paused_refund(alice)


async def finished(client: Client, run_id: str, event: str = "run.completed") -> dict[str, Any]:
    return await client.wait_for(lambda f: f.get("event") == event and f.get("run_id") == run_id)


async def replay(gw: Gateway, thread_id: str, user: str = "alice") -> list[dict[str, Any]]:
    """Every event a fresh subscriber (role `user`) gets replaying the thread from cursor 0."""
    async with clients(gw) as connect:
        client = await connect(user, "user")
        await client.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        subscribed = await client.wait_for(lambda f: f.get("type") == "subscribed")
        head = subscribed["head_seq"]
        await client.wait_for(lambda f: f.get("type") == "event" and f.get("seq") == head)
        return client.events_of(thread_id)


async def test_lists_filter_runs_and_order_approvals_by_wait(
    gateway_factory: Any, database_url: str
) -> None:
    async with gateway_factory(instance_id=INSTANCE) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        older = await paused_refund(alice)
        await asyncio.sleep(GAP_S)
        newer = await paused_refund(alice)
        done = await alice.request("run.start", input="hello there")
        await finished(alice, done["run_id"])

        # Half the gap more than the newer pause had waited: only the older one is that old,
        # as long as the second command runs within half the gap after the listing did. A
        # loaded machine can take longer to start two commands: the pair is then asked again.
        for _ in range(3):
            began = time.monotonic()
            paused = await cli(
                database_url, "runs", "list", "--state", "waiting_for_review", "--json"
            )
            assert paused.status == 0, paused.err
            threshold = f"{paused.json()[1]['in_status_s'] + GAP_S / 2:.1f}"
            stuck = await cli(
                database_url,
                "runs",
                "list",
                "--state",
                "active",
                "--older-than",
                threshold,
                "--json",
            )
            if time.monotonic() - began < GAP_S / 2:
                break
        # The longest in its state first.
        assert [r["run_id"] for r in paused.json()] == [older["run_id"], newer["run_id"]]
        assert all(r["lease"] is None and r["tenant"] == "acme" for r in paused.json())
        assert paused.json()[0]["in_status_s"] > paused.json()[1]["in_status_s"]
        assert [r["run_id"] for r in stuck.json()] == [older["run_id"]]
        ended = await cli(database_url, "runs", "list", "--state", "completed,failed", "--json")
        assert [r["run_id"] for r in ended.json()] == [done["run_id"]]
        active = await cli(database_url, "runs", "list", "--state", "active", "--json")
        assert {r["run_id"] for r in active.json()} == {older["run_id"], newer["run_id"]}
        none = await cli(database_url, "runs", "list", "--older-than", "1h", "--json")
        assert none.json() == []
        of_thread = await cli(database_url, "runs", "list", "--thread", done["thread_id"], "--json")
        assert [r["run_id"] for r in of_thread.json()] == [done["run_id"]]
        assert (await cli(database_url, "runs", "list", "--tenant", "other", "--json")).json() == []

        table = await cli(database_url, "runs", "list", "--state", "waiting_for_review")
        lines = table.out.splitlines()
        assert lines[0].split() == [
            "RUN",
            "THREAD",
            "TENANT",
            "STATE",
            "IN",
            "STATE",
            "CREATED",
            "LEASE",
        ]
        assert [line.split()[0] for line in lines[1:]] == [older["run_id"], newer["run_id"]]

        waiting = await cli(database_url, "approvals", "list", "--json")
        assert waiting.status == 0, waiting.err
        views = waiting.json()
        assert [v["approval_id"] for v in views] == [older["approval_id"], newer["approval_id"]]
        assert views[0]["waiting_s"] > views[1]["waiting_s"] >= 0
        assert views[0]["tool_name"] == "issue_refund" and views[0]["run_id"] == older["run_id"]
        # No tool arguments, in any form.
        assert not {"arguments", "order_id", "amount"} & {k for v in views for k in v}
        assert "order_id" not in waiting.out and "amount" not in waiting.out
        people = await cli(database_url, "approvals", "list")
        assert [line.split()[0] for line in people.out.splitlines()[1:]] == [
            older["approval_id"],
            newer["approval_id"],
        ]

        shown = await cli(database_url, "runs", "show", older["run_id"], "--json")
        detail = shown.json()
        assert detail["status"] == "waiting_for_review" and detail["input"] == REFUND
        assert [(a["approval_id"], a["status"]) for a in detail["approvals"]] == [
            (older["approval_id"], "pending")
        ]
        text = await cli(database_url, "runs", "show", older["run_id"])
        assert text.status == 0 and "waiting_for_review" in text.out
        assert older["approval_id"] in text.out


async def test_export_is_what_a_replay_from_cursor_zero_receives(
    gateway_factory: Any, database_url: str
) -> None:
    async with paused_with_a_reviewer(gateway_factory) as (gw, alice, bob, run):
        await bob.request("approval.decide", approval_id=run["approval_id"], decision="approve")
        await finished(alice, run["run_id"])
        # A second run on the thread: the export spans runs.
        second = await alice.request("run.input", thread_id=run["thread_id"], input="hello")
        await finished(alice, second["run_id"])

        exported = await cli(database_url, "threads", "export", run["thread_id"])
        assert exported.status == 0, exported.err
        lines = exported.out.splitlines()
        replayed = await replay(gw, run["thread_id"])
        assert [json.loads(line) for line in lines] == replayed
        assert [e["seq"] for e in replayed] == list(range(1, len(replayed) + 1))
        # Compact frames, exactly as the WebSocket sends them.
        assert all(
            line == json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False)
            for line in lines
        )

        tail = await cli(database_url, "threads", "export", run["thread_id"], "--after-seq", "5")
        assert [json.loads(line) for line in tail.out.splitlines()] == replayed[5:]


async def test_export_masks_sensitive_arguments_as_the_log_stores_them(
    gateway_factory: Any, database_url: str
) -> None:
    registry = AgentRegistry([vault_graph(EffectLog())])
    async with gateway_factory(registry=registry) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        run = await alice.request("run.start", input="pay")
        await finished(alice, run["run_id"], "run.paused")
        exported = await cli(database_url, "threads", "export", run["thread_id"])
        assert exported.status == 0, exported.err
        # What the owner (no reviewer role) replays; the real values are nowhere in it.
        assert [json.loads(line) for line in exported.out.splitlines()] == await replay(
            gw, run["thread_id"]
        )
        assert CARD not in exported.out and SSN not in exported.out and MASK in exported.out
        for command in (("approvals", "list"), ("runs", "show", run["run_id"])):
            for form in ((), ("--json",)):
                shown = await cli(database_url, *command, *form)
                assert shown.status == 0 and CARD not in shown.out, (command, form)


async def test_cancel_of_a_paused_run_reaches_watchers_and_refuses_its_approval(
    gateway_factory: Any, database_url: str
) -> None:
    async with paused_with_a_reviewer(gateway_factory) as (gw, alice, bob, run):
        head = max(e["seq"] for e in alice.events_of(run["thread_id"]))
        before = utcnow()

        done = await cli(database_url, "runs", "cancel", run["run_id"], "--actor", "ops-carol")
        assert done.status == 0, done.err
        assert f"cancelled run {run['run_id']} (was waiting_for_review)" in done.out
        assert run["approval_id"] in done.out

        # The gateway's subscriber gets it (its log watch reads what another process wrote),
        # at the next seq, as from a gateway.
        cancelled = await finished(alice, run["run_id"], "run.cancelled")
        assert cancelled["seq"] == head + 1 and cancelled["data"] == {}
        with pytest.raises(ProtocolFailure) as refused:
            await bob.request("approval.decide", approval_id=run["approval_id"], decision="approve")
        assert refused.value.code == "conflict"

        exported = await cli(database_url, "threads", "export", run["thread_id"])
        assert json.loads(exported.out.splitlines()[-1])["event"] == "run.cancelled"
        assert (await cli(database_url, "approvals", "list", "--json")).json() == []
        shown = (await cli(database_url, "runs", "show", run["run_id"], "--json")).json()
        assert shown["status"] == "cancelled"
        assert [a["status"] for a in shown["approvals"]] == ["superseded"]

        async with gw.http() as http:
            response = await http.get(
                "/v1/audit",
                params={"action": "run.cancelled"},
                headers={"Authorization": f"Bearer {gw.token('root', 'admin')}"},
            )
        entries = response.json()["audit"]
        assert [(e["actor"], e["target"], e["outcome"]) for e in entries] == [
            ("ops-carol", run["run_id"], "success")
        ]
        assert entries[0]["source"].startswith("cli@")
        assert entries[0]["at"] >= utc_ts(before)[:19]

        again = await cli(database_url, "runs", "cancel", run["run_id"])
        assert again.status == 4 and "already cancelled" in again.err
        # The thread goes on: the gateway starts the next run on it.
        nxt = await alice.request("run.input", thread_id=run["thread_id"], input="hello")
        assert nxt["disposition"] == "started"
        await finished(alice, nxt["run_id"])


async def test_over_redis_the_gateways_hear_of_a_cancel_at_once(
    gateway_factory: Any, database_url: str
) -> None:
    bus = {"bus_url": require_redis(), "bus_prefix": bus_prefix()}
    # No log watch: only the relay can tell this gateway of what the command wrote.
    async with (
        gateway_factory(log_watch_interval_s=0, **bus) as gw,
        clients(gw) as connect,
    ):
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        run = await paused_refund(alice)
        await bob.request("inbox.subscribe")
        done = await cli(
            database_url,
            "runs",
            "cancel",
            run["run_id"],
            env={"GATEWAY_BUS_URL": bus["bus_url"], "GATEWAY_BUS_PREFIX": bus["bus_prefix"]},
        )
        assert done.status == 0, done.err
        await asyncio.wait_for(finished(alice, run["run_id"], "run.cancelled"), 5)
        await bob.wait_for(
            lambda f: f.get("type") == "inbox.update" and run["approval_id"] in f.get("removed", [])
        )


async def test_a_run_a_live_process_streams_is_cancelled_only_when_forced(
    gateway_factory: Any, database_url: str
) -> None:
    async with (
        gateway_factory(instance_id=INSTANCE, demo_delay_ms=100, lease_ttl_s=3) as gw,
        clients(gw) as connect,
    ):
        alice = await connect("alice", "user")
        run = await alice.request("run.start", input=STORY)
        await alice.wait_event("message.delta")

        listed = (await cli(database_url, "runs", "list", "--state", "running", "--json")).json()
        assert [(r["run_id"], r["lease"]["owner"], r["lease"]["live"]) for r in listed] == [
            (run["run_id"], INSTANCE, True)
        ]
        refused = await cli(database_url, "runs", "cancel", run["run_id"])
        assert refused.status == 4
        assert INSTANCE in refused.err and "run.cancel" in refused.err
        assert "--force" in refused.err and refused.out == ""
        assert alice.events_of(run["thread_id"])[-1]["event"] != "run.cancelled"

        forced = await cli(database_url, "runs", "cancel", run["run_id"], "--force")
        assert forced.status == 0, forced.err
        cancelled = await finished(alice, run["run_id"], "run.cancelled")
        # The process that streamed it is fenced off: after a lease renewal (a third of the
        # TTL) it has stopped, and nothing follows `run.cancelled` in the log.
        await asyncio.sleep(2.5)
        exported = await cli(database_url, "threads", "export", run["thread_id"])
        last = json.loads(exported.out.splitlines()[-1])
        assert (last["seq"], last["event"]) == (cancelled["seq"], "run.cancelled")
        shown = (await cli(database_url, "runs", "show", run["run_id"], "--json")).json()
        assert shown["status"] == "cancelled" and shown["lease"] is None


async def test_a_run_left_by_a_killed_process_is_cancelled_and_stays_cancelled(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    env = {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_LEASE_TTL_S": "2",
        "GATEWAY_DEMO_DELAY_MS": "80",
        "GATEWAY_INSTANCE_ID": "gw-a",
    }
    a = spawn_gateway(tmp_path, env=env)
    processes.append(a)
    token = TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])
    alice = await Client.connect(a.ws_url, token)
    run = await alice.request("run.start", input=STORY)
    await alice.wait_event("message.delta")
    await alice.close()
    a.kill()
    await asyncio.sleep(2.5)  # past the lease's expiry: nobody streams the run any more

    shown = (await cli(database_url, "runs", "show", run["run_id"], "--json")).json()
    assert shown["status"] == "running"
    assert (shown["lease"]["owner"], shown["lease"]["live"]) == ("gw-a", False)
    done = await cli(database_url, "runs", "cancel", run["run_id"])
    assert done.status == 0, done.err
    assert f"cancelled run {run['run_id']} (was running)" in done.out

    # The same instance id takes its own runs over at once on start-up: not a cancelled one.
    again = spawn_gateway(tmp_path, env=env)
    processes.append(again)
    watcher = await Client.connect(again.ws_url, token)
    try:
        await watcher.request("thread.subscribe", thread_id=run["thread_id"], after_seq=0)
        await finished(watcher, run["run_id"], "run.cancelled")
        await asyncio.sleep(1)
        names = [e["event"] for e in watcher.events_of(run["thread_id"])]
        assert names[-1] == "run.cancelled" and "run.recovered" not in names
    finally:
        await watcher.close()
    shown = (await cli(database_url, "runs", "show", run["run_id"], "--json")).json()
    assert shown["status"] == "cancelled" and shown["lease"] is None


async def test_errors_are_coded_and_on_stderr(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url)
    try:
        await store.ping()  # an empty database: on SQLite, a file with no tables
        empty = await cli(database_url, "runs", "list")
        assert empty.status == 6 and "never migrated" in empty.err and empty.out == ""
        await schema.migrate(store)
        await schema.downgrade(store, "0005")
        behind = await cli(database_url, "approvals", "list")
        assert behind.status == 6 and "revision 0005" in behind.err
        await schema.migrate(store)
    finally:
        await store.close()

    cases = [
        (("runs", "show", "r_missing"), 3, "no run 'r_missing'"),
        (("runs", "cancel", "r_missing"), 3, "no run 'r_missing'"),
        (("threads", "export", "t_missing"), 3, "no thread 't_missing'"),
        (("runs", "list", "--state", "stuck"), 2, "unknown run state 'stuck'"),
        (("runs", "list", "--older-than", "ten minutes"), 2, "not a duration"),
        (("approvals", "list", "--limit", "0"), 2, "--limit"),
    ]
    for args, status, message in cases:
        done = await cli(database_url, *args)
        assert (done.status, done.out) == (status, ""), (args, done)
        assert done.err.startswith("error (") and message in done.err, (args, done.err)

    nowhere = f"sqlite:///{tmp_path / 'typo.db'}"
    missing = await cli(nowhere, "runs", "list")
    assert missing.status == 6 and "no database file" in missing.err
    assert not (tmp_path / "typo.db").exists()

    # The console script is the same command line.
    script = Path(sys.executable).with_name("agents-gateway")
    if script.exists():
        process = await asyncio.create_subprocess_exec(
            str(script),
            "runs",
            "list",
            "--json",
            env={**os.environ, "GATEWAY_DATABASE_URL": database_url},
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await process.communicate()
        assert process.returncode == 0 and json.loads(out) == []


async def test_threads_list_lists_every_tenant_s_threads_newest_first(
    gateway_factory: Any, database_url: str
) -> None:
    async with gateway_factory() as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        older = await alice.request("run.start", input="hello there")
        await finished(alice, older["run_id"])
        newer = await alice.request("run.start", input="a second thread")
        await finished(alice, newer["run_id"])
        token = TokenVerifier(TEST_SECRET).issue("zed", "globex", ["user"])
        other = await Client.connect(gw.ws_url, token)
        theirs = await other.request("run.start", input="another tenant")
        await finished(other, theirs["run_id"])
        async with gw.http() as http:
            archived = await http.patch(
                f"/v1/threads/{older['thread_id']}",
                json={"archived": True},
                headers={"Authorization": f"Bearer {gw.token('alice', 'user')}"},
            )
        assert archived.status_code == 200, archived.text
        await other.close()

    listed = await cli(database_url, "threads", "list", "--json")
    assert listed.status == 0, listed.err
    assert [t["thread_id"] for t in listed.json()] == [theirs["thread_id"], newer["thread_id"]]
    first = listed.json()[1]
    assert first["tenant"] == "acme" and first["owner"] == "alice"
    assert first["title"] == "a second thread" and first["events"] > 0

    acme = await cli(database_url, "threads", "list", "--tenant", "acme", "--archived", "too")
    assert acme.status == 0, acme.err
    lines = acme.out.splitlines()
    assert lines[0].split() == [
        "THREAD",
        "TENANT",
        "OWNER",
        "EVENTS",
        "CREATED",
        "ARCHIVED",
        "TITLE",
    ]
    assert [line.split()[0] for line in lines[1:]] == [newer["thread_id"], older["thread_id"]]
    assert "archived" in lines[2]
    only = await cli(database_url, "threads", "list", "--archived", "only", "--json")
    assert [t["thread_id"] for t in only.json()] == [older["thread_id"]]
