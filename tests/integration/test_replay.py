"""Catch-up by `after_seq` (docs/protocol.md §4): reconnects, full replays, resets, several
subscribers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.client import Client, clients

pytestmark = pytest.mark.both_backends

FRAME_KEYS = ("type", "thread_id", "seq", "run_id", "event", "ts", "data")


def count_events(client: Client, name: str) -> int:
    return sum(1 for e in client.events if e["event"] == name)


async def wait_count(client: Client, name: str, n: int, timeout: float = 20) -> None:
    await client.wait_for(lambda _frame: count_events(client, name) >= n, timeout)


async def wait_events(client: Client, thread_id: str, n: int, timeout: float = 20) -> None:
    await client.wait_for(lambda _frame: len(client.events_of(thread_id)) >= n, timeout)


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events]


def frames_after(client: Client, frame_type: str) -> list[dict[str, Any]]:
    """Every frame received after the first frame of `frame_type` (e.g. the replay after
    `subscribed`)."""
    index = next(i for i, f in enumerate(client.frames) if f.get("type") == frame_type)
    return client.frames[index + 1 :]


async def test_reconnect_mid_stream_with_after_seq_is_dense_and_text_is_exact(
    gateway_factory,
) -> None:
    async with gateway_factory(demo_delay_ms=5) as gw, clients(gw) as connect:
        first = await connect("alice", "user")
        ack = await first.request("run.start", input="tell me a story about lighthouses")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await wait_count(first, "message.delta", 20)
        await first.close()
        seen_first = first.events_of(thread_id)
        assert "run.completed" not in [e["event"] for e in seen_first], "run ended too soon"
        assert seqs(seen_first) == list(range(1, len(seen_first) + 1))
        last = seen_first[-1]["seq"]

        await asyncio.sleep(0.15)  # the run streams on with nobody watching
        second = await connect("alice", "user")
        await second.request("thread.subscribe", thread_id=thread_id, after_seq=last)
        subscribed = await second.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["reset"] is False
        assert subscribed["head_seq"] > last
        done = await second.wait_event("run.completed", timeout=30)

        seen_second = second.events_of(thread_id)
        assert seqs(seen_second) == list(range(last + 1, done["seq"] + 1))
        completed = [e for e in seen_first + seen_second if e["event"] == "message.completed"]
        assert len(completed) == 1
        message_id = completed[0]["data"]["message_id"]
        deltas = "".join(
            e["data"]["delta"]
            for e in seen_first + seen_second
            if e["event"] == "message.delta" and e["data"]["message_id"] == message_id
        )
        assert deltas == completed[0]["data"]["text"]
        assert len(completed[0]["data"]["text"].split()) >= 200
        assert done["run_id"] == run_id


async def test_full_replay_after_completion_equals_live_frames(gateway_factory) -> None:
    async with gateway_factory() as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="refund order 8 for 15")
        thread_id = ack["thread_id"]
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        live = alice.events_of(thread_id)
        assert seqs(live) == list(range(1, len(live) + 1))

        watcher = await connect("victor", "viewer")
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_for(
            lambda _f: len(watcher.events_of(thread_id)) >= len(live), timeout=10
        )
        await asyncio.sleep(0.1)  # nothing more may arrive
        replayed = watcher.events_of(thread_id)
        assert len(replayed) == len(live)
        for got, want in zip(replayed, live, strict=True):
            assert {k: got.get(k) for k in FRAME_KEYS} == {k: want.get(k) for k in FRAME_KEYS}
            assert got == want


async def test_wrong_epoch_or_future_after_seq_resets_and_replays_from_one(
    gateway_factory,
) -> None:
    async with gateway_factory() as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        ack = await alice.request("run.start", input="hello there, how are you")
        thread_id = ack["thread_id"]
        await alice.wait_event("run.completed")
        head = alice.events_of(thread_id)[-1]["seq"]

        wrong_epoch = await connect("alice", "user")
        await wrong_epoch.request(
            "thread.subscribe", thread_id=thread_id, after_seq=2, epoch="not-the-epoch"
        )
        future = await connect("alice", "user")
        await future.request("thread.subscribe", thread_id=thread_id, after_seq=head + 50)
        good = await connect("alice", "user")
        await good.request("thread.subscribe", thread_id=thread_id, after_seq=2)

        for client in (wrong_epoch, future):
            subscribed = await client.wait_for(lambda f: f.get("type") == "subscribed")
            assert subscribed["reset"] is True
            assert subscribed["head_seq"] == head
            await wait_events(client, thread_id, head)
            replay = [f for f in frames_after(client, "subscribed") if f["type"] == "event"]
            assert seqs(replay) == list(range(1, head + 1))

        subscribed = await good.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["reset"] is False
        epoch = subscribed["epoch"]
        await good.wait_for(lambda _f: len(good.events_of(thread_id)) >= head - 2)
        assert seqs(good.events_of(thread_id)) == list(range(3, head + 1))

        # The right epoch is honoured.
        again = await connect("alice", "user")
        await again.request("thread.subscribe", thread_id=thread_id, after_seq=head, epoch=epoch)
        subscribed = await again.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["reset"] is False
        await asyncio.sleep(0.1)
        assert again.events_of(thread_id) == []


async def test_two_subscribers_receive_identical_sequences(gateway_factory) -> None:
    async with gateway_factory(demo_delay_ms=2) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        created = await alice.request("thread.create")
        thread_id = created["thread_id"]
        bob = await connect("bob", "reviewer")
        vera = await connect("vera", "viewer")
        for client in (bob, vera):
            await client.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            await client.wait_for(lambda f: f.get("type") == "subscribed")
        ack = await alice.request("run.start", thread_id=thread_id, input="a story about owls")
        for client in (bob, vera):
            await client.wait_for(
                lambda f: f.get("event") == "run.completed" and f["run_id"] == ack["run_id"],
                timeout=30,
            )
        await asyncio.sleep(0.1)
        from_bob, from_vera = bob.events_of(thread_id), vera.events_of(thread_id)
        assert from_bob == from_vera
        assert seqs(from_bob) == list(range(1, len(from_bob) + 1))
        assert count_events(bob, "message.delta") > 20


async def test_subscribe_mid_stream_switches_replay_to_live_without_gap_or_repeat(
    gateway_factory,
) -> None:
    async with gateway_factory(demo_delay_ms=2) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        ack = await alice.request("run.start", input="tell me a story about mountains")
        thread_id = ack["thread_id"]
        await wait_count(alice, "message.delta", 15)

        late = await connect("alice", "user")
        await late.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        subscribed = await late.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["reset"] is False
        assert subscribed["head_seq"] >= 15
        done = await late.wait_event("run.completed", timeout=30)
        assert done["seq"] > subscribed["head_seq"], "the run finished before the switch"

        seen = late.events_of(thread_id)
        assert seqs(seen) == list(range(1, done["seq"] + 1))
        await alice.wait_event("run.completed")
        assert seen == alice.events_of(thread_id)
