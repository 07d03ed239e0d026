"""A text frame framed once for every connection is what each connection would have sent."""

from __future__ import annotations

import pytest
from websockets.frames import OP_TEXT, Frame
from websockets.protocol import State
from websockets.server import ServerProtocol

from gateway.server.ws_guard import SharedTextFrame


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65_535, 65_536, 200_000])
@pytest.mark.parametrize("character", ["x", "é", "🙂"])
def test_the_shared_frame_is_the_bytes_a_server_connection_sends(
    length: int, character: str
) -> None:
    text = '{"type":"event","data":"' + character * length + '"}'
    connection = ServerProtocol(state=State.OPEN)
    connection.send_text(text.encode())
    assert SharedTextFrame().wire(text) == b"".join(connection.data_to_send())


def test_a_new_text_is_framed_anew() -> None:
    shared = SharedTextFrame()
    first = shared.wire("one")
    assert shared.wire("one") is first  # the same object: framed once
    assert shared.wire("two") == Frame(OP_TEXT, b"two").serialize(mask=False)
