"""The loop trace's per-request windows (bench/loop_trace_summary.py) on a hand-made trace."""

from __future__ import annotations

import pytest

from bench.loop_trace_summary import windows

DECIDE = '{"type": "approval.decide", "id": "b1", "approval_id": "ap_1"}'


def trace(start: float) -> list[tuple[object, ...]]:
    """One decision at `start` (seconds): answered at +2 ms, `run.resumed` written at +3 ms."""
    return [
        ("cb", start - 0.0005, start + 0.0005, "task run_asgi"),  # the frame arrives inside it
        ("recv", start, DECIDE),
        ("cb", start + 0.001, start + 0.0015, "task EventLog._writer"),
        ("write", start + 0.0015, b'\x81~{"type":"event","event":"approval.decided"}'),
        ("write", start + 0.002, b'\x81~{"type":"ack","ref":"b1"}'),
        ("cb", start + 0.0025, start + 0.0035, "task Continuer.continue_when_decided"),
        ("write", start + 0.003, b'\x81~{"type":"event","seq":9,"event":"run.resumed"}'),
    ]


def test_each_request_is_followed_to_its_ack_and_event() -> None:
    records = trace(10.0) + trace(20.0) + [("recv", 30.0, '{"type":"ping"}')]
    found = windows(records, "approval.decide", "run.resumed")
    assert len(found) == 2
    for window in found:
        assert window.to_ack == pytest.approx(0.002)
        assert window.to_until == pytest.approx(0.003)
        # Only the parts of callbacks inside the window count: 0.5 + 0.5 + 0.5 ms.
        assert window.busy == pytest.approx(0.0015)
        assert window.callbacks["task run_asgi"] == pytest.approx(0.0005)
        assert window.callbacks["task Continuer.continue_when_decided"] == pytest.approx(0.0005)
        assert window.counts["task EventLog._writer"] == 1


def test_a_request_never_answered_is_left_out() -> None:
    records = trace(10.0)[:3]
    assert windows(records, "approval.decide", "run.resumed") == []
