"""The per-connection state the guarded WebSocket protocol puts in place of uvicorn's queue and
event (gateway/server/connection_state.py): the same behaviour for what uvicorn calls, and
nothing held while idle."""

from __future__ import annotations

import asyncio

import pytest

from gateway.server.connection_state import ReceivedMessages, Writable


async def test_messages_come_out_in_order_and_a_reader_waits_for_the_next() -> None:
    messages = ReceivedMessages()
    assert messages.empty()
    messages.put_nowait({"type": "websocket.connect"})
    messages.put_nowait({"type": "websocket.receive", "text": "a"})
    assert messages.qsize() == 2
    assert await messages.get() == {"type": "websocket.connect"}
    assert await messages.get() == {"type": "websocket.receive", "text": "a"}
    reader = asyncio.create_task(messages.get())
    await asyncio.sleep(0)
    assert not reader.done()
    messages.put_nowait({"type": "websocket.disconnect", "code": 1005})
    assert await asyncio.wait_for(reader, 1) == {"type": "websocket.disconnect", "code": 1005}
    assert messages.empty() and messages._getter is None


async def test_a_cancelled_reader_leaves_the_message_for_the_next() -> None:
    messages = ReceivedMessages()
    reader = asyncio.create_task(messages.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    messages.put_nowait("kept")
    assert await asyncio.wait_for(messages.get(), 1) == "kept"


async def test_writable_holds_writers_while_cleared_and_releases_them_all_on_set() -> None:
    writable = Writable()
    assert writable.is_set()
    await asyncio.wait_for(writable.wait(), 1)  # set: no wait
    writable.clear()
    assert not writable.is_set()
    writers = [asyncio.create_task(writable.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(writer.done() for writer in writers)
    writable.set()
    await asyncio.wait_for(asyncio.gather(*writers), 1)
    assert writable._waiters is None


async def test_a_cancelled_writer_is_forgotten() -> None:
    writable = Writable()
    writable.clear()
    writer = asyncio.create_task(writable.wait())
    await asyncio.sleep(0)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert not writable._waiters
    writable.set()
    assert writable.is_set()
