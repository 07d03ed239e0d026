"""The operator's filters: run states and durations ("10m", "1h30m") as typed values, refused
with a sentence that says what would have been accepted."""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.protocol.error_codes import CodedError, ErrorCode
from persistence.run_status import RunStatus
from persistence.runs import ACTIVE

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
# A name for every status a run can still leave: what "stuck" is looked for among.
ACTIVE_ALIAS = "active"


class FilterError(CodedError, ValueError):
    """A filter the command line cannot use; the message says why."""

    CODE = ErrorCode.BAD_REQUEST


def parse_duration(text: str) -> float:
    """Seconds in `text`: a number of seconds, or parts such as `90s`, `10m`, `1h30m`, `2d`."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _PART.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise FilterError(
                f"not a duration: {text!r} (use seconds, or e.g. 90s, 10m, 1h30m, 2d)"
            ) from None
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if seconds < 0:
        raise FilterError(f"a duration cannot be negative: {text!r}")
    return seconds


def parse_states(values: Iterable[str]) -> frozenset[RunStatus]:
    """Run statuses named by `values`, each one a status or a comma-separated list of them;
    `active` names every status a run can still leave."""
    states: set[RunStatus] = set()
    for value in values:
        for name in filter(None, (part.strip().lower() for part in value.split(","))):
            if name == ACTIVE_ALIAS:
                states.update(ACTIVE)
                continue
            try:
                states.add(RunStatus(name))
            except ValueError:
                known = ", ".join([*(s.value for s in RunStatus), ACTIVE_ALIAS])
                raise FilterError(f"unknown run state {name!r} (one of: {known})") from None
    return frozenset(states)
