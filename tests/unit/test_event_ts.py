"""Event timestamps: millisecond UTC, the same text from the clock as from a `datetime`."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gateway.event_log.writer import event_ts

TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_the_clock_and_a_datetime_give_the_same_text() -> None:
    before = event_ts(datetime.now(UTC))
    now = event_ts()
    after = event_ts(datetime.now(UTC))
    assert TS.match(now)
    assert before <= now <= after  # fixed width: text order is time order


def test_a_given_moment_is_truncated_to_the_millisecond() -> None:
    assert event_ts(datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)) == "2026-01-02T03:04:05.678Z"
    assert event_ts(datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=UTC)) == "2026-01-02T03:04:05.000Z"
