"""Random and mutated client frames for live fuzzing, from a seeded `random.Random`.

Each `Fuzzed` says how it goes on the wire (text or binary frame), whether the gateway must
end the connection for it (`ends`: a hostile `hello`), and whether the WebSocket layer itself
must (`fatal`: over the size limit, or a text frame that is not UTF-8). The mix leans on what
real clients and attackers get wrong: valid frames with one fault, wrong JSON types, missing
fields, huge and exotic strings, deep nesting, unknown types, binary frames, invalid UTF-8,
frames over the size limit, and plain noise.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.protocol.frames import MAX_ID_CHARS
from gateway.specs.asyncapi import client_frame_models

# In the order of the protocol's frame union, not of `CLIENT_FRAME_TYPES` (a frozenset, whose
# order changes with the hash seed): a seed must give the same frames every run.
FRAME_TYPES = tuple(client_frame_models())
AFTER_HELLO = tuple(frame_type for frame_type in FRAME_TYPES if frame_type != "hello")
# Characters that tend to break things: controls, quotes, escapes, separators, astral planes.
NASTY = "\x00\x01\x1f\"\\/\u2028\u2029\ufeff\u00e9\u0301\U0001f600\U0010fffd<>&'%\t\n"


@dataclass(frozen=True)
class Fuzzed:
    data: str | bytes
    text: bool
    kind: str
    fatal: bool = False
    ends: bool = False


@dataclass
class FrameFuzzer:
    """Generates frames for one worker; `known_threads` grows from the server's acks."""

    rng: random.Random
    prefix: str
    max_frame_bytes: int
    token: str
    other_tokens: list[str]
    known_threads: list[str] = field(default_factory=list)
    _count: int = 0

    def next_id(self) -> str:
        self._count += 1
        return f"{self.prefix}-{self._count}"

    # -- values ----------------------------------------------------------------------------

    def text(self, low: int = 0, high: int = 24) -> str:
        size = self.rng.randint(low, high)
        alphabet = self.rng.choice([string.ascii_letters, string.printable, NASTY])
        return "".join(self.rng.choice(alphabet) for _ in range(size))

    def some_id(self) -> str:
        if self.known_threads and self.rng.random() < 0.5:
            return self.rng.choice(self.known_threads)
        return self.rng.choice(["t_", "r_", "ap_", ""]) + f"{self.rng.getrandbits(48):x}"

    def json_value(self, depth: int = 0) -> Any:
        roll = self.rng.random()
        if depth > 3 or roll < 0.55:
            return self.rng.choice(
                [
                    None,
                    True,
                    False,
                    0,
                    -1,
                    2**63,
                    -(2**64),
                    10**30,
                    1.5,
                    1.0,
                    -0.0,
                    1e308,
                    self.text(),
                    "",
                    " ",
                    self.rng.choice(FRAME_TYPES),
                ]
            )
        if roll < 0.8:
            return [self.json_value(depth + 1) for _ in range(self.rng.randint(0, 4))]
        return {self.text(0, 8): self.json_value(depth + 1) for _ in range(self.rng.randint(0, 4))}

    # -- frames ----------------------------------------------------------------------------

    def valid(self, frame_type: str | None = None) -> dict[str, Any]:
        frame_type = frame_type or self.rng.choice(AFTER_HELLO)
        frame: dict[str, Any] = {"type": frame_type}
        if self.rng.random() < 0.85:
            frame["id"] = self.next_id()
        words = ["hello", "status of 3", "story", "refund 42", self.text(1, 40)]
        if frame_type == "hello":
            frame |= {"protocol": 1, "token": self.token}
        elif frame_type == "thread.create":
            if self.rng.random() < 0.5:
                frame["metadata"] = {self.text(1, 8): self.json_value(2)}
        elif frame_type == "thread.subscribe":
            frame |= {"thread_id": self.some_id(), "after_seq": self.rng.randint(0, 50)}
            if self.rng.random() < 0.3:
                frame["epoch"] = self.text(1, 10)
        elif frame_type == "thread.unsubscribe":
            frame["thread_id"] = self.some_id()
        elif frame_type == "run.start":
            frame["input"] = self.rng.choice(words).strip() or "hi"
            if self.known_threads and self.rng.random() < 0.5:
                frame["thread_id"] = self.rng.choice(self.known_threads)
            if self.rng.random() < 0.2:
                frame["on_disconnect"] = "suspend"
        elif frame_type == "run.input":
            frame |= {"thread_id": self.some_id(), "input": self.rng.choice(words).strip() or "x"}
        elif frame_type == "approval.decide":
            frame |= {
                "approval_id": self.some_id(),
                "decision": self.rng.choice(["approve", "reject"]),
            }
            if self.rng.random() < 0.5:
                frame["reason"] = self.text()
        elif frame_type in ("run.cancel", "run.resume"):
            frame["run_id"] = self.some_id()
        return frame

    def mutate(self, frame: dict[str, Any]) -> dict[str, Any]:
        frame = dict(frame)
        keys = [key for key in frame if key != "id"] or ["type"]
        kind = self.rng.choice(
            ["drop", "retype", "extra", "swap_type", "huge", "unicode", "deep", "bad_id"]
        )
        key = self.rng.choice(keys)
        if kind == "drop":
            frame.pop(key, None)
        elif kind == "retype":
            frame[key] = self.json_value()
        elif kind == "extra":
            frame[self.text(1, 12)] = self.json_value()
        elif kind == "swap_type":
            frame["type"] = self.rng.choice(FRAME_TYPES)
        elif kind == "huge":
            # Up to 4 bytes a character: large, yet (mostly) under the frame size limit.
            budget = max(self.max_frame_bytes // 5 - 200, MAX_ID_CHARS + 1)
            frame[key] = self.rng.choice("xé\U0001f600") * self.rng.randint(MAX_ID_CHARS, budget)
        elif kind == "unicode":
            frame[key] = "".join(self.rng.choice(NASTY) for _ in range(self.rng.randint(1, 30)))
        elif kind == "deep":
            nested: Any = self.json_value(3)
            for _ in range(self.rng.randint(10, 400)):
                nested = [nested] if self.rng.random() < 0.5 else {"a": nested}
            frame[key] = nested
        elif kind == "bad_id":
            frame["id"] = self.rng.choice(
                ["", "i" * (MAX_ID_CHARS + 1), 7, None, ["x"], {"id": "x"}, True]
            )
        return frame

    def next(self) -> Fuzzed:
        roll = self.rng.random()
        if roll < 0.25:
            return self._json(self.valid(), "valid")
        if roll < 0.60:
            return self._json(self.mutate(self.valid()), "mutated")
        if roll < 0.68:
            return self._json(self.json_value(), "random_json")
        if roll < 0.72:
            frame = {"type": self.text(0, 30), "id": self.next_id()}
            return self._json(frame, "unknown_type")
        if roll < 0.76:
            data = self.rng.randbytes(self.rng.randint(0, 64))
            return Fuzzed(data, text=False, kind="binary")
        if roll < 0.83:
            return Fuzzed(self.text(0, 80), text=True, kind="noise")
        if roll < 0.90:
            return self._broken_json()
        if roll < 0.93:
            # Past orjson's nesting limit (1024), yet under the frame size limit.
            depth = self.rng.randint(500, max(500, (self.max_frame_bytes - 16) // 6))
            opener = self.rng.choice(["[", '{"a":'])
            closer = "]" if opener == "[" else "}"
            return Fuzzed(opener * depth + "1" + closer * depth, text=True, kind="deep_text")
        if roll < 0.945:
            return self._hello()
        if roll < 0.95:
            return self._oversized()
        if roll < 0.997:
            return self._json({"type": "run.start", "input": "x" * 2000}, "long_input")
        return Fuzzed(
            b'{"type":"ping","x":"\xff\xfe"}',
            text=True,
            kind="invalid_utf8_text",
            fatal=True,
            ends=True,
        )

    def hello(self, *, with_id: bool = False) -> Fuzzed:
        frame: dict[str, Any] = {"type": "hello", "protocol": 1, "token": self.token}
        if with_id:
            frame["id"] = self.next_id()
        return self._json(frame, "hello")

    def _hello(self) -> Fuzzed:
        frame: dict[str, Any] = {"type": "hello", "protocol": 1, "token": self.token}
        variant = self.rng.choice(
            ["renew", "renew", "other", "garbage", "protocol", "bad_signature"]
        )
        if variant == "other" and self.other_tokens:
            frame["token"] = self.rng.choice(self.other_tokens)
        elif variant == "garbage":
            frame["token"] = self.text(1, 200)
        elif variant == "protocol":
            frame["protocol"] = self.rng.choice([0, 2, -1, 2**40])
        elif variant == "bad_signature":
            frame["token"] = self.token[:-4] + "AAAA"
        if self.rng.random() < 0.7:
            frame["id"] = self.next_id()
        fuzzed = self._json(frame, f"hello_{variant}")
        return replace(fuzzed, ends=variant != "renew")

    def _oversized(self) -> Fuzzed:
        size = self.max_frame_bytes + self.rng.randint(1, 4096)
        if self.rng.random() < 0.5:
            data = self.rng.randbytes(size)
            return Fuzzed(data, text=False, kind="oversized_binary", fatal=True, ends=True)
        body = json.dumps({"type": "ping", "id": self.next_id(), "pad": "p" * size})
        return Fuzzed(body, text=True, kind="oversized_text", fatal=True, ends=True)

    def _broken_json(self) -> Fuzzed:
        raw = json.dumps(self.valid()).encode()
        cut = self.rng.randint(0, len(raw))
        choice = self.rng.random()
        if choice < 0.4:
            data = raw[:cut]
        elif choice < 0.8:
            data = raw[:cut] + self.rng.randbytes(self.rng.randint(1, 6)) + raw[cut:]
        else:
            data = raw[:cut] + raw[cut:].replace(b'"', b"'", 1)
        try:
            return Fuzzed(data.decode("utf-8"), text=True, kind="broken_json")
        except UnicodeDecodeError:
            # Not UTF-8, so it can only travel as a binary frame (a text frame would be 1007).
            return Fuzzed(data, text=False, kind="broken_json_binary")

    def _json(self, value: Any, kind: str) -> Fuzzed:
        return Fuzzed(json.dumps(value, ensure_ascii=False), text=True, kind=kind)
