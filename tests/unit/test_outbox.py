"""The outgoing queue: full at its frame bound or its byte bound, whichever comes first."""

from __future__ import annotations

import asyncio

import pytest

from gateway.protocol.wire_size import encoded_size
from gateway.transport.outbox import Outbox


def test_full_at_the_byte_bound_before_the_frame_bound() -> None:
    outbox = Outbox(max_frames=100, max_bytes=1000)
    for _ in range(4):
        outbox.put_nowait("x" * 250)
    assert outbox.full() and outbox.qsize() == 4
    with pytest.raises(asyncio.QueueFull):
        outbox.put_nowait("y")
    outbox.get_nowait()
    assert not outbox.full() and outbox.queued_bytes == 750


def test_full_at_the_frame_bound() -> None:
    outbox = Outbox(max_frames=2, max_bytes=10_000)
    outbox.put_nowait("a")
    outbox.put_nowait("b")
    with pytest.raises(asyncio.QueueFull):
        outbox.put_nowait("c")


def test_a_frame_larger_than_the_bound_goes_into_a_queue_below_it() -> None:
    outbox = Outbox(max_frames=10, max_bytes=100)
    outbox.put_nowait("z" * 500)
    assert outbox.full()
    assert outbox.get_nowait() == "z" * 500
    assert outbox.queued_bytes == 0


def test_sizes_are_utf8_bytes() -> None:
    assert encoded_size("abc") == 3
    assert encoded_size("é") == 2
    outbox = Outbox(max_frames=10, max_bytes=100)
    outbox.put_nowait("€" * 10)
    assert outbox.queued_bytes == 30


def test_a_batch_takes_the_queued_frames_in_order_up_to_its_byte_bound() -> None:
    outbox = Outbox(max_frames=100, max_bytes=10_000)
    for index, text in enumerate(("a" * 100, "b" * 100, "c" * 100, "d" * 100), start=1):
        outbox.put_stamped_nowait(text, float(index))
    first = outbox.get_nowait()
    frames, stamps = outbox.take_batch(first, max_bytes=300)
    assert frames == ["a" * 100, "b" * 100, "c" * 100]
    assert stamps == [1.0, 2.0, 3.0]
    assert outbox.qsize() == 1 and outbox.queued_bytes == 100
    # A first frame above the bound still goes, alone.
    frames, stamps = outbox.take_batch(outbox.get_nowait(), max_bytes=10)
    assert frames == ["d" * 100] and stamps == [4.0] and outbox.empty()


async def test_a_writer_waiting_in_get_is_woken_by_the_next_frame() -> None:
    outbox = Outbox(max_frames=10, max_bytes=1000)
    waiting = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    outbox.put_stamped_nowait("a", 7.0)
    assert await asyncio.wait_for(waiting, 1) == "a"
    assert outbox.taken_stamp == 7.0 and outbox.empty() and outbox.queued_bytes == 0


async def test_a_sender_waits_for_room_in_order_and_a_cancelled_one_passes_its_turn() -> None:
    outbox = Outbox(max_frames=1, max_bytes=1000)
    outbox.put_nowait("first")
    cancelled = asyncio.create_task(outbox.put("cancelled"))
    second = asyncio.create_task(outbox.put("second"))
    await asyncio.sleep(0)
    assert not cancelled.done() and not second.done()
    # Room for one: the first waiter is woken, then cancelled before it queues.
    assert outbox.get_nowait() == "first"
    cancelled.cancel()
    await asyncio.wait_for(second, 1)
    assert cancelled.cancelled()
    assert outbox.get_nowait() == "second" and outbox.empty()


async def test_an_empty_outbox_holds_no_queue() -> None:
    """An idle connection's outbox: no deque, no waiter, before and after traffic."""
    outbox = Outbox(max_frames=10, max_bytes=1000)
    assert outbox._entries is None and outbox._getter is None and outbox._putters is None
    outbox.put_nowait("a")
    assert outbox.get_nowait() == "a"
    assert outbox._entries is None
    with pytest.raises(asyncio.QueueEmpty):
        outbox.get_nowait()
