"""The operator's filters (gateway/operator/filters.py) and its durations as people read them."""

from __future__ import annotations

import pytest

from gateway.operator.filters import FilterError, parse_duration, parse_states
from gateway.operator.output import human_duration
from persistence.runs import ACTIVE, RunStatus


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        (" 2H ", 7200.0),
        ("0s", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10x", "ten minutes", "10m junk", "-5", "1h-5m"])
def test_what_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(FilterError):
        parse_duration(text)


def test_states_by_name_list_or_alias() -> None:
    assert parse_states([]) == frozenset()
    assert parse_states(["running"]) == {RunStatus.RUNNING}
    assert parse_states(["completed,failed", "Cancelled"]) == {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    }
    assert parse_states(["active"]) == ACTIVE
    with pytest.raises(FilterError, match=r"unknown run state 'stuck'.*waiting_for_review"):
        parse_states(["running,stuck"])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.9, "45s"), (725, "12m05s"), (10920, "3h02m"), (187200, "2d04h")],
)
def test_human_durations(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text
