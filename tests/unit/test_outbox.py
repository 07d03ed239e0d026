"""The outgoing queue: full at its frame bound or its byte bound, whichever comes first."""

from __future__ import annotations

import asyncio

import pytest

from gateway.transport.outbox import Outbox, encoded_size


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
