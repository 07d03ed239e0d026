"""A text frame framed (and compressed) once for every connection is what each connection
would have sent itself."""

from __future__ import annotations

import pytest
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import OP_TEXT, Frame
from websockets.protocol import State
from websockets.server import ServerProtocol

from gateway.server.compression import Compression, message_deflate
from gateway.server.shared_frames import SharedFrames

TEXT_LENGTHS = [0, 1, 125, 126, 600, 65_535, 65_536, 200_000]
CHARACTERS = ["x", "é", "🙂"]


def sent_by_websockets(text: str, extensions: list[PerMessageDeflate] | None = None) -> bytes:
    connection = ServerProtocol(state=State.OPEN)
    if extensions:
        connection.extensions = list(extensions)
    connection.send_text(text.encode())
    return b"".join(connection.data_to_send())


def deflate_without_context(window_bits: int, compression: Compression) -> PerMessageDeflate:
    return PerMessageDeflate(
        True,  # remote_no_context_takeover
        True,  # local_no_context_takeover
        window_bits,
        window_bits,
        {"level": compression.level, "memLevel": Compression.MEM_LEVEL},
    )


@pytest.mark.parametrize("length", TEXT_LENGTHS)
@pytest.mark.parametrize("character", CHARACTERS)
def test_the_shared_frame_is_the_bytes_a_server_connection_sends(
    length: int, character: str
) -> None:
    text = '{"type":"event","data":"' + character * length + '"}'
    assert SharedFrames(Compression()).wire(text) == sent_by_websockets(text)


@pytest.mark.parametrize("length", TEXT_LENGTHS)
@pytest.mark.parametrize("character", CHARACTERS)
@pytest.mark.parametrize("window_bits", [9, 12, 15])
def test_a_compressed_shared_frame_is_what_websockets_compresses(
    length: int, character: str, window_bits: int
) -> None:
    compression = Compression(window_bits=window_bits, min_bytes=0)
    deflate = deflate_without_context(window_bits, compression)
    text = '{"type":"event","data":"' + character * length + '"}'
    shared = SharedFrames(compression).wire_for(deflate, text)
    assert shared == sent_by_websockets(text, [deflate])
    assert shared[0] & 0x40  # RSV1: compressed


def test_a_short_text_goes_out_uncompressed_on_a_compressed_connection() -> None:
    compression = Compression(min_bytes=512)
    deflate = deflate_without_context(12, compression)
    frames = SharedFrames(compression)
    short, long = "x" * 100, "y" * 2000
    assert frames.wire_for(deflate, short) == sent_by_websockets(short)  # RSV1 clear
    compressed = frames.wire_for(deflate, long)
    assert compressed == sent_by_websockets(long, [deflate])
    assert len(compressed) < 100


def test_a_frame_is_compressed_once_per_window_size() -> None:
    compression = Compression(min_bytes=0)
    frames = SharedFrames(compression)
    text = "z" * 1000
    at_12 = frames.wire_for(deflate_without_context(12, compression), text)
    assert frames.wire_for(deflate_without_context(12, compression), text) is at_12
    at_9 = frames.wire_for(deflate_without_context(9, compression), text)
    assert at_9 == sent_by_websockets(text, [deflate_without_context(9, compression)])


def test_a_new_text_is_framed_anew() -> None:
    shared = SharedFrames(Compression())
    first = shared.wire("one")
    assert shared.wire("one") is first  # the same object: framed once
    assert shared.wire("two") == Frame(OP_TEXT, b"two").serialize(mask=False)


def test_only_per_message_deflate_is_shared() -> None:
    compression = Compression()
    per_message = deflate_without_context(12, compression)
    with_context = PerMessageDeflate(False, False, 12, 12)
    assert message_deflate([per_message]) is per_message
    assert message_deflate([with_context]) is None
    assert message_deflate([]) is None


def test_compression_off_offers_nothing() -> None:
    assert Compression(mode="off").extension_factories() == []
    (factory,) = Compression().extension_factories()
    assert factory.name == "permessage-deflate"
