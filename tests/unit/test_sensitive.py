"""Masking of sensitive tool arguments (pure functions of
gateway/run_lifecycle/sensitive_arguments.py)."""

from __future__ import annotations

import orjson

from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.masked_events import needs_reveal
from gateway.run_lifecycle.sensitive_arguments import (
    MASK,
    MASK_ALL,
    masked_call_data,
    revealed_frame,
)

SENSITIVE = {"pay": frozenset({"card"}), "lookup": frozenset({"*"})}


def test_only_named_arguments_of_named_tools_are_masked() -> None:
    data = {"tool_name": "pay", "arguments": {"card": "4111", "amount": 5}}
    masked = masked_call_data(data, "pay", SENSITIVE)
    assert masked["arguments"] == {"card": MASK, "amount": 5}
    assert masked["masked"] == ["card"]
    assert data["arguments"] == {"card": "4111", "amount": 5}  # the input is not touched
    other = {"tool_name": "refund", "arguments": {"card": "4111"}}
    assert masked_call_data(other, "refund", SENSITIVE) is other


def test_star_masks_everything_and_raw_arguments_are_masked_whole() -> None:
    everything = masked_call_data({"arguments": {"b": 1, "a": 2}}, "lookup", SENSITIVE)
    assert everything["arguments"] == {"b": MASK, "a": MASK}
    assert everything["masked"] == ["a", "b"]
    raw = masked_call_data({"arguments": {"_raw": "card=4111"}}, "pay", SENSITIVE)
    assert raw["arguments"] == {"_raw": MASK}
    assert masked_call_data({"arguments": {"x": 1}}, "any", MASK_ALL)["arguments"] == {"x": MASK}


def test_nothing_to_mask_leaves_no_masked_field() -> None:
    data = {"arguments": {"amount": 5}}
    assert masked_call_data(data, "pay", SENSITIVE) is data


def event(type_: str, data: dict[str, object]) -> LoggedEvent:
    frame = (
        '{"type":"event","thread_id":"t_1","seq":3,"run_id":"r_1","event":"'
        + type_
        + '","ts":"2026-11-29T12:00:00.000Z","data":'
        + orjson.dumps(data).decode()
        + "}"
    )
    return LoggedEvent("t_1", 3, "r_1", type_, "2026-11-29T12:00:00.000Z", frame)


def test_only_masked_approval_requests_need_a_reveal() -> None:
    masked = event("approval.requested", {"arguments": {"card": MASK}, "masked": ["card"]})
    assert needs_reveal(masked)
    assert not needs_reveal(event("approval.requested", {"arguments": {"card": "4111"}}))
    # A quoted "masked" inside a value is escaped in JSON, so it cannot look like the key.
    assert not needs_reveal(event("approval.requested", {"arguments": {"n": '"masked":'}}))
    assert not needs_reveal(event("tool.called", {"arguments": {"c": MASK}, "masked": ["c"]}))
    revealed = orjson.loads(revealed_frame(masked.frame, {"card": "4111"}))
    assert revealed["data"] == {"arguments": {"card": "4111"}}
    assert revealed["seq"] == 3
