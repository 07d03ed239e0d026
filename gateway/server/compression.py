"""WebSocket compression (permessage-deflate, RFC 7692) as the gateway negotiates it.

Browsers offer permessage-deflate on every connection. The gateway accepts it without context
takeover in either direction: each message is compressed (and decompressed) on its own, so

- a connection keeps no compressor or decompressor between messages: an idle connection costs
  what it costs uncompressed (docs/benchmarks.md figure 6h), where a compressor kept per
  connection cost 40 KiB more;
- a frame is compressed once for every watcher, like the uncompressed frame-once path
  (gateway/server/shared_frames.py);
- texts shorter than `min_bytes` (most streamed deltas) go out uncompressed.

The price is the ratio on a stream of small messages, which a kept context would compress
against each other; the figures are in docs/configuration.md and docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from websockets.extensions import Extension, ServerExtensionFactory
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)

from gateway.settings import Settings

CompressionMode = Literal["deflate", "off"]


@dataclass(frozen=True)
class Compression:
    mode: CompressionMode = "deflate"
    # The LZ77 window the gateway compresses with, 9-15 bits (zlib refuses 8 for raw
    # deflate); a client may ask for a smaller one.
    window_bits: int = 12
    # zlib's level, 1 (fastest) to 9 (smallest).
    level: int = 6
    # Texts below this many bytes are sent uncompressed.
    min_bytes: int = 512
    # zlib's memory for one message's compressor: 2^(MEM_LEVEL+9) bytes of hash tables. Each
    # compressor lives for one message, so its set-up cost is paid per compressed frame.
    MEM_LEVEL: ClassVar[int] = 5

    @classmethod
    def from_settings(cls, settings: Settings) -> Compression:
        return cls(
            mode=settings.ws_compression,
            window_bits=settings.ws_compression_window_bits,
            level=settings.ws_compression_level,
            min_bytes=settings.ws_compression_min_bytes,
        )

    @property
    def enabled(self) -> bool:
        return self.mode == "deflate"

    def extension_factories(self) -> list[ServerExtensionFactory]:
        """What the server offers to negotiate; empty when compression is off."""
        if not self.enabled:
            return []
        return [
            ServerPerMessageDeflateFactory(
                server_no_context_takeover=True,
                client_no_context_takeover=True,
                server_max_window_bits=self.window_bits,
                compress_settings={"level": self.level, "memLevel": self.MEM_LEVEL},
            )
        ]


def message_deflate(extensions: Sequence[Extension]) -> PerMessageDeflate | None:
    """A connection's negotiated permessage-deflate when it is the only extension and the
    server compresses without context takeover (each message on its own); else None."""
    if len(extensions) == 1:
        (extension,) = extensions
        if isinstance(extension, PerMessageDeflate) and extension.local_no_context_takeover:
            return extension
    return None
