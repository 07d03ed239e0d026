"""Settings of a client connection once it is served: heartbeats, sizes and outgoing queues."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gateway.protocol.close_codes import CloseCode
from gateway.settings.group import SettingsGroup


class ConnectionSettings(SettingsGroup):
    """What a WebSocket connection or a streaming response may hold and how long it may lag:
    heartbeats, frame and input sizes, outgoing queues, and the frontend adapters' requests and
    replays."""

    section_key: ClassVar[str] = "connections"
    section_title: ClassVar[str] = "connections"

    heartbeat_s: float = Field(
        20.0,
        gt=0,
        description=(
            "Seconds between server `ping` frames (> 0); announced to clients as `heartbeat_s`; "
            "also the interval of the SSE feed's `: heartbeat` comments."
        ),
    )
    hello_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a new socket has to send `hello` (> 0) before it is closed with "
        f"{int(CloseCode.UNAUTHORIZED)}; on the AI SDK's WebSocket (`/v1/ai-sdk/ws`), a request "
        "with a valid token.",
    )
    max_frame_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description=(
            "Largest client WebSocket frame (1024 to 16 MiB). Larger frames close the socket with "
            f"{int(CloseCode.TOO_LARGE)}. Also passed to uvicorn as its WebSocket size limit."
        ),
    )
    delta_merge_ms: int = Field(
        0,
        ge=0,
        le=1000,
        description=(
            "Milliseconds (0 to 1000) a streamed text delta waits for more text of its message "
            "before it is stored and sent: the model's deltas within the window go out as one "
            "`message.delta` (docs/protocol.md §6), so each event, frame and stored row carries "
            "more text, for that much added latency. Anything else to store (an approval, a "
            "status) ends the wait at once. 0 stores each delta as soon as the event log's writer "
            "is free; deltas that queue while it is busy join either way. docs/benchmarks.md "
            "gives the CPU saved and the latency added."
        ),
    )
    gc_thaw_s: float = Field(
        900.0,
        ge=0.0,
        le=86400.0,
        description=(
            "Seconds (0-86400) between thaws of what the garbage collector froze. After each full "
            "collection the process freezes the objects that survived it (its connections, runs "
            "and caches), so later full collections walk only newer ones: with 10,000 connections "
            "open, each would otherwise stall every socket for 100-400 ms. Frozen objects are "
            "still freed when nothing refers to them; reference cycles among them wait for the "
            "next thaw, after which one full collection walks everything again. With the "
            "freezing on, a full collection follows each collection of the middle generation "
            "(CPython waits for ten), so each walks only a few milliseconds' worth. 0: the "
            "collector's own policy (only the start-up heap frozen). docs/benchmarks.md gives "
            "the figures."
        ),
    )
    send_queue_size: int = Field(
        1024,
        ge=16,
        description=(
            "Outgoing frames buffered per connection (≥ 16). Live events that do not fit are read "
            "from the log later, at the client's pace; an `inbox.update` that does not fit closes "
            f"the connection with {int(CloseCode.TOO_SLOW)}. The SSE feeds "
            "(`GET /v1/threads/{thread_id}/stream`, `GET "
            "/v1/approvals/stream`) have a queue of this size too; an inbox feed that overflows it "
            "ends."
        ),
    )
    send_timeout_s: float = Field(
        5.0,
        gt=0,
        description=(
            "Seconds (> 0) a frame may wait for room in a full outgoing queue before the connection"
            f" is closed with {int(CloseCode.TOO_SLOW)}. The client catches up by subscribing "
            "with `after_seq`. A streaming HTTP response (an SSE feed, an AI SDK or AG-UI "
            "stream) whose client takes nothing of what was written for this long is ended "
            f"(`event: end` with {int(CloseCode.TOO_SLOW)}); the client resumes with its "
            "`Last-Event-ID`."
        ),
    )
    send_queue_bytes: int = Field(
        1024 * 1024,
        ge=64 * 1024,
        description=(
            "Outgoing bytes (UTF-8) buffered per connection (≥ 65536), beside "
            "`GATEWAY_SEND_QUEUE_SIZE` frames: the queue is full when either is reached. A single "
            "frame larger than this still goes into a queue below it."
        ),
    )
    max_input_chars: int = Field(
        32_000,
        ge=1,
        description=(
            "Longest `input` accepted by `run.start` / `run.input` (≥ 1); a longer one gets "
            "`too_large`."
        ),
    )
    frontend_body_bytes: int = Field(
        1024 * 1024,
        ge=65536,
        le=16 * 1024 * 1024,
        description=(
            "Largest request body, or WebSocket frame, of the frontend adapters (the Vercel AI "
            "SDK's and AG-UI's; 64 KiB to 16 MiB). Their clients send the whole conversation with "
            "every request, of which only the newest message is used; a larger one gets "
            "`too_large`."
        ),
    )
    ws_compression: Literal["deflate", "off"] = Field(
        "deflate",
        description=(
            "WebSocket compression: `deflate` accepts the permessage-deflate that browsers offer,"
            " without context takeover either way (each message compressed on its own: a "
            "connection keeps no compressor between messages, and a frame is compressed once for"
            " all its watchers); `off` declines it. Measured costs are in docs/benchmarks.md "
            '("Compression").'
        ),
    )
    ws_compression_level: int = Field(
        6,
        ge=1,
        le=9,
        description="zlib's compression level for WebSocket frames, 1 (fastest) to 9 (smallest).",
    )
    ws_compression_window_bits: int = Field(
        12,
        ge=9,
        le=15,
        description=(
            "The compression window, 9 to 15 bits (4 KiB at 12): the most the gateway "
            "compresses with and asks clients to keep per message; a client may ask for less."
        ),
    )
    ws_compression_min_bytes: int = Field(
        512,
        ge=0,
        le=16 * 1024 * 1024,
        description=(
            "Frames whose text is shorter than this many bytes (UTF-8) go out uncompressed on a"
            " compressed connection (as RFC 7692 allows): compressing a streamed delta of a few"
            " hundred bytes on its own saves a few dozen bytes and costs a compressor's set-up."
            " `0` compresses every frame."
        ),
    )
    ai_sdk_replay_window_s: float = Field(
        60.0,
        ge=0,
        le=86400,
        description=(
            "How long after a chat's response ends (the run finished, or paused on calls its "
            "reader decides) a resume of the Vercel AI SDK's transports still replays it, so a "
            "client that dropped just before the end gets the end (0 to 86400 s). Replaying a "
            "message the client already has whole gives the same message. `0`: only a running "
            "response is resumed, as the AI SDK's own servers do."
        ),
    )
