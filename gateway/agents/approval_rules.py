"""Rules that decide a tool's calls by themselves (docs/agents.md "Access and masking").

A graph may give a tool a rule: a Python function of the call's real (unmasked) arguments and
the run's caller that approves, rejects, or leaves the call to a person (None). The gateway asks
it before the run pauses (gateway/run_lifecycle/execution.py); what it decides is logged as
`approval.decided` with `reviewer: null` and the rule's name, audited and counted.

A rule that raises, or answers anything but "approve", "reject" or None, never approves: the
call waits for a person, and the failure is logged with the rule's name and the exception's type
and place, never its message or the arguments (either may hold what the graph masks).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.agents.run_caller import RunCaller

log = logging.getLogger(__name__)

Verdict = Literal["approve", "reject"]
# What a rule's evaluation came to, for the metrics: its verdict, "undecided" (a person
# decides) or "error" (it raised or answered nonsense; a person decides).
Outcome = Literal["approve", "reject", "undecided", "error"]


@dataclass(frozen=True)
class ApprovalRule:
    """`decide(arguments, caller)`: "approve", "reject", or None to leave the call to a person.
    It runs in the gateway's event loop before every pause: quick and without I/O."""

    name: str
    decide: Callable[[Mapping[str, Any], RunCaller], Verdict | None]
    # What the model is told when the rule rejects; None: a sentence naming the rule.
    rejection_message: str | None = None
    # Roles of the caller the rule reads: tokens may carry them, like the graph's reviewer roles.
    caller_roles: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an approval rule needs a name (it is logged with its decisions)")

    def reason_for(self, verdict: Verdict) -> str | None:
        """The decision's reason: for a rejection, exactly what the model sees."""
        if verdict == "approve":
            return None
        return self.rejection_message or f"Rejected by the rule {self.name!r}."


@dataclass(frozen=True)
class RuleDecision:
    rule: str
    decision: Verdict
    reason: str | None


def evaluate(
    rule: ApprovalRule, tool_name: str, arguments: Mapping[str, Any], caller: RunCaller
) -> tuple[RuleDecision | None, Outcome]:
    """Ask `rule` about one call. (None, outcome) leaves the call to a person."""
    try:
        verdict = rule.decide(arguments, caller)
    except Exception as exc:
        # Only where it raised: the message and the frames' locals may quote the arguments.
        where = traceback.extract_tb(exc.__traceback__)[-1:]
        place = f"{where[0].filename}:{where[0].lineno}" if where else "?"
        log.error(
            "approval rule %r for %r raised %s at %s; the call waits for a person",
            rule.name,
            tool_name,
            type(exc).__name__,
            place,
        )
        return None, "error"
    if verdict is None:
        return None, "undecided"
    if verdict not in ("approve", "reject"):
        log.error(
            "approval rule %r for %r answered a %s, not 'approve', 'reject' or None; "
            "the call waits for a person",
            rule.name,
            tool_name,
            type(verdict).__name__,
        )
        return None, "error"
    return RuleDecision(rule.name, verdict, rule.reason_for(verdict)), verdict
