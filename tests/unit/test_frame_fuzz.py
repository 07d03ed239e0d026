"""Property-based fuzzing of the frame parser (`gateway.protocol.frames.parse_client_frame`).

Whatever arrives, the parser either returns a typed frame or raises `ProtocolError` with a
documented code (`bad_request`, or `too_large` for an over-long `input`), the right `ref`, a
bounded message that echoes no long client text, and an error frame that matches the AsyncAPI
document. Valid frames round-trip, and the parser and the published schemas agree.

Derandomized with no example database, so CI runs the same examples every time (unless
GATEWAY_TEST_SEED asks for another seed: tests/support/seeds.py).
"""

from __future__ import annotations

import json
import string
from typing import Any, TypeVar

import orjson
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from gateway.protocol import frames as protocol
from gateway.protocol.frames import (
    MAX_ID_CHARS,
    MAX_METADATA_BYTES,
    ErrorCode,
    ProtocolError,
    parse_client_frame,
    peek,
)
from gateway.specs.asyncapi import client_frame_models
from tests.support.seeds import is_default, run_seed
from tests.support.specs import Spec, asyncapi

T = TypeVar("T")
SETTINGS = settings(
    max_examples=150,
    derandomize=is_default(),
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(test: T) -> T:
    """The fuzz settings, derandomized; with another GATEWAY_TEST_SEED (tests/support/seeds.py),
    that seed instead."""
    return SETTINGS(test if is_default() else seed(run_seed())(test))


PARSER_CODES = {ErrorCode.BAD_REQUEST, ErrorCode.TOO_LARGE}
# Long enough that finding it in an error message means the message echoed client text.
ECHO_PROBE_CHARS = 48
MAX_MESSAGE_CHARS = 600
MODELS = client_frame_models()
SPEC: Spec = asyncapi()
FIELDS = sorted({name for model in MODELS.values() for name in model.model_fields} | {"type", "id"})

# Metadata the JSON decoder takes (under 1024 levels) but the encoder cannot write back (over
# 254): it used to escape the parser as a TypeError.
DEEP_METADATA = (
    '{"type": "thread.create", "id": "c1", "metadata": {"a": ' + "[" * 300 + "]" * 300 + "}}"
)

# --- strategies ---------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(sorted(protocol.CLIENT_FRAME_TYPES))
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.text(min_size=1, max_size=MAX_ID_CHARS)
texts = st.text(min_size=1, max_size=80).filter(str.strip)
int64 = st.integers(min_value=0, max_value=2**63 - 1)
metadata = st.dictionaries(
    st.text(max_size=8),
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    max_size=4,
)


def frame_of(frame_type: str, required: dict[str, Any], optional: dict[str, Any]) -> Any:
    return st.fixed_dictionaries(
        {"type": st.just(frame_type), **required}, optional={"id": ids, **optional}
    )


VALID: dict[str, Any] = {
    "hello": frame_of("hello", {"protocol": st.integers(-(2**63), 2**63 - 1), "token": texts}, {}),
    "thread.create": frame_of("thread.create", {}, {"metadata": st.none() | metadata}),
    "thread.subscribe": frame_of(
        "thread.subscribe", {"thread_id": ids}, {"after_seq": int64, "epoch": st.none() | ids}
    ),
    "thread.unsubscribe": frame_of("thread.unsubscribe", {"thread_id": ids}, {}),
    "run.start": frame_of(
        "run.start",
        {"input": texts},
        {
            "thread_id": st.none() | ids,
            "agent": st.none() | ids,
            "on_disconnect": st.sampled_from(["continue", "suspend"]),
        },
    ),
    "run.input": frame_of("run.input", {"thread_id": ids, "input": texts}, {}),
    "approval.decide": frame_of(
        "approval.decide",
        {"approval_id": ids, "decision": st.sampled_from(["approve", "reject"])},
        {"reason": st.none() | st.text(max_size=80)},
    ),
    "run.cancel": frame_of("run.cancel", {"run_id": ids}, {}),
    "run.resume": frame_of("run.resume", {"run_id": ids}, {}),
    "inbox.subscribe": frame_of("inbox.subscribe", {}, {}),
    "ping": frame_of("ping", {}, {}),
    "pong": frame_of("pong", {}, {}),
}
valid_frames = st.sampled_from(sorted(VALID)).flatmap(lambda t: VALID[t])


@st.composite
def mutated_frames(draw: st.DrawFn) -> str | bytes:
    """A valid frame with one or two faults of the kinds clients (and attackers) produce."""
    frame = dict(draw(valid_frames))
    for _ in range(draw(st.integers(1, 2))):
        keys = sorted(frame)
        kind = draw(
            st.sampled_from(
                [
                    "drop",
                    "retype",
                    "extra",
                    "other_type",
                    "huge",
                    "unicode",
                    "deep",
                    "long_id",
                    "big_metadata",
                ]
            )
        )
        if kind == "drop" and keys:
            frame.pop(draw(st.sampled_from(keys)))
        elif kind == "retype" and keys:
            frame[draw(st.sampled_from(keys))] = draw(json_values)
        elif kind == "extra":
            frame[draw(st.text(max_size=10))] = draw(json_values)
        elif kind == "other_type":
            frame["type"] = draw(st.sampled_from(sorted(protocol.CLIENT_FRAME_TYPES)))
        elif kind == "huge" and keys:
            size = draw(st.sampled_from([65, 4001, 32_001, 70_000]))
            frame[draw(st.sampled_from(keys))] = draw(st.sampled_from("xé\u2028")) * size
        elif kind == "unicode" and keys:
            frame[draw(st.sampled_from(keys))] = draw(
                st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
            )
        elif kind == "deep" and keys:
            depth = draw(st.integers(1, 1100))
            nested: Any = "x"
            for _ in range(depth):
                nested = [nested]
            frame[draw(st.sampled_from(keys))] = nested
        elif kind == "long_id":
            frame["id"] = "i" * draw(st.integers(MAX_ID_CHARS + 1, 300))
        elif kind == "big_metadata":
            frame["metadata"] = {"k": "m" * (MAX_METADATA_BYTES + draw(st.integers(0, 50)))}
    try:
        raw = json.dumps(frame, allow_nan=True)
    except RecursionError:
        raw = "[" * 5000 + "]" * 5000  # nesting too deep even to encode: send such text anyway
    if draw(st.booleans()):
        return raw
    data = raw.encode("utf-8", "surrogatepass")
    cut = draw(st.integers(0, len(data)))
    textual = draw(st.sampled_from(["as_bytes", "truncate", "insert", "invalid_utf8"]))
    if textual == "truncate":
        return data[:cut]
    if textual == "insert":
        return data[:cut] + draw(st.binary(min_size=1, max_size=4)) + data[cut:]
    if textual == "invalid_utf8":
        return data[:cut] + b"\xff\xfe" + data[cut:]
    return data


# --- checks -------------------------------------------------------------------------------


def decoded(raw: str | bytes) -> Any:
    """What the parser sees after decoding, or a sentinel when it cannot decode."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _UNDECODABLE


_UNDECODABLE = object()


def long_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value) >= ECHO_PROBE_CHARS else []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in long_strings(k) + long_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in long_strings(v)]
    return []


def parse_or_refusal(raw: str | bytes) -> Any:
    """Parse; a refusal must be a well-formed, documented error. Anything else propagates."""
    try:
        return parse_client_frame(raw)
    except ProtocolError as exc:
        check_refusal(raw, exc)
        return exc


def check_refusal(raw: str | bytes, exc: ProtocolError) -> None:
    assert exc.code in PARSER_CODES, exc.code
    assert isinstance(exc.message, str) and exc.message
    assert len(exc.message) <= MAX_MESSAGE_CHARS, len(exc.message)
    obj = decoded(raw)
    frame_id = obj.get("id") if isinstance(obj, dict) else None
    if isinstance(frame_id, str) and 0 < len(frame_id) <= MAX_ID_CHARS:
        assert exc.ref == frame_id
    else:
        assert exc.ref is None
    if obj is not _UNDECODABLE:
        for text in long_strings(obj):
            assert text not in exc.message, "the error message echoes client text"
    assert SPEC.errors("ErrorFrame", exc.to_frame()) == []


def schema_errors(frame_type: str, obj: Any) -> list[str]:
    return SPEC.errors(SPEC.client_frame_schema(frame_type), obj)


def check_accepted(obj: Any, frame: Any) -> None:
    """An accepted frame is the typed value of what was sent, and the document admits it."""
    assert isinstance(obj, dict)
    assert isinstance(frame, MODELS[obj["type"]])
    for key, value in obj.items():
        if key in type(frame).model_fields:
            assert getattr(frame, key) == value, key
    assert schema_errors(obj["type"], obj) == [], "the parser accepts what the document refuses"


def refusal_the_schema_cannot_express(obj: dict[str, Any], exc: ProtocolError) -> bool:
    """Rules JSON Schema cannot state (documented in descriptions instead)."""
    if exc.code == ErrorCode.TOO_LARGE:  # `input` over the deployment's limit
        return True
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and len(orjson.dumps(metadata)) > MAX_METADATA_BYTES:
        return True
    # JSON Schema's "integer" admits 1.0 (and orjson reads integers past 64 bits as floats);
    # the parser is strict: only JSON integers are integers.
    return any(
        isinstance(v, float) and v.is_integer() and f"'{k}'" in exc.message for k, v in obj.items()
    )


# --- properties ---------------------------------------------------------------------------


@fuzz
@given(json_values)
@example(None)
@example({"type": "hello"})
@example({"type": "run.start", "input": " \t\n"})
@example({"type": "ping", "id": ""})
@example({"type": "thread.subscribe", "thread_id": "t", "after_seq": True})
def test_any_json_value_is_a_frame_or_a_coded_refusal(value: Any) -> None:
    raw = json.dumps(value, allow_nan=True)
    outcome = parse_or_refusal(raw)
    if not isinstance(outcome, ProtocolError):
        check_accepted(value, outcome)


@fuzz
@given(st.text() | st.binary())
@example(b"\xff")
@example(b'{"type": "ping"}\xc3')
@example("{" * 2000)
@example("[" * 1025 + "]" * 1025)
@example('{"type": "ping", "id": "\\ud800"}')
@example("1e400")
@example(DEEP_METADATA)
def test_arbitrary_text_and_bytes_are_refused_with_bad_request(raw: str | bytes) -> None:
    outcome = parse_or_refusal(raw)
    if not isinstance(outcome, ProtocolError):
        check_accepted(orjson.loads(raw), outcome)


@fuzz
@given(valid_frames, st.booleans())
def test_valid_frames_parse_and_round_trip(obj: dict[str, Any], as_bytes: bool) -> None:
    raw = json.dumps(obj)
    frame = parse_client_frame(raw.encode() if as_bytes else raw)
    check_accepted(obj, frame)
    again = parse_client_frame(orjson.dumps(frame.model_dump(mode="json")))
    assert again == frame


@fuzz
@given(mutated_frames())
def test_mutated_frames_are_frames_or_coded_refusals(raw: str | bytes) -> None:
    outcome = parse_or_refusal(raw)
    obj = decoded(raw)
    if not isinstance(outcome, ProtocolError):
        check_accepted(obj, outcome)
    elif isinstance(obj, dict) and isinstance(obj.get("type"), str) and obj["type"] in MODELS:
        # The reverse: what the document admits, the parser accepts (with the stated
        # exceptions), so the document is not looser than the server either.
        if schema_errors(obj["type"], obj) == []:
            assert refusal_the_schema_cannot_express(obj, outcome), (obj, outcome.message)


@fuzz
@given(
    st.text(alphabet=string.printable + "é\u2028\x00", max_size=200) | json_values.map(json.dumps)
)
def test_peek_never_raises(raw: str) -> None:
    frame_type, ref = peek(raw)
    assert frame_type is None or isinstance(frame_type, str)
    assert ref is None or (isinstance(ref, str) and 0 < len(ref) <= MAX_ID_CHARS)


def test_the_input_limit_is_too_large_not_bad_request() -> None:
    """The one refusal that is not `bad_request`, pinned so the fuzz oracle stays honest."""
    raw = json.dumps({"type": "run.input", "id": "q", "thread_id": "t", "input": "x" * 11})
    try:
        parse_client_frame(raw, max_input_chars=10)
    except ProtocolError as exc:
        assert (exc.code, exc.ref) == (ErrorCode.TOO_LARGE, "q")
    else:
        raise AssertionError("an over-long input was accepted")
