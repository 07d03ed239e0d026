"""A run's lifecycle status and the moves between statuses (docs/protocol.md §1).

Every status change is a compare-and-swap from a set of expected statuses
(`RunRepository.transition_in`, `CheckpointRepository.save_in`); both check each move against
`MOVES` before writing, so a move the lifecycle does not allow fails loudly instead of
silently winning or losing the swap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from gateway.protocol.error_codes import CodedError


class RunStatus(StrEnum):
    RUNNING = "running"
    WAITING_FOR_REVIEW = "waiting_for_review"
    RESUMING = "resuming"
    SUSPENDED = "suspended"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
ACTIVE = frozenset(RunStatus) - TERMINAL

# A new run is stored as running (`RunManager.start_run`).
INITIAL = RunStatus.RUNNING

# Statuses in which a process streams the run: it may pause there, be taken over by recovery,
# or end.
_EXECUTING = frozenset({RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.RECOVERING})
_PAUSED = frozenset({RunStatus.WAITING_FOR_REVIEW, RunStatus.SUSPENDED})

# The legal moves: from each status, the statuses it may change to. A status absent from its
# own set may not be rewritten in place.
MOVES: Mapping[RunStatus, frozenset[RunStatus]] = {
    # Running stays running while a turn checkpoint advances the version.
    RunStatus.RUNNING: _PAUSED | {RunStatus.RUNNING, RunStatus.RECOVERING} | TERMINAL,
    # A continuation that fails to start puts the run back where it paused.
    RunStatus.RESUMING: _PAUSED | {RunStatus.RUNNING, RunStatus.RECOVERING} | TERMINAL,
    # A recovering run whose process died in turn is taken over again.
    RunStatus.RECOVERING: _PAUSED | {RunStatus.RUNNING, RunStatus.RECOVERING} | TERMINAL,
    # A paused run continues through resuming, or is cancelled (an end is accepted from any
    # active status: the ending transaction swaps from all of them).
    RunStatus.WAITING_FOR_REVIEW: frozenset({RunStatus.RESUMING}) | TERMINAL,
    RunStatus.SUSPENDED: frozenset({RunStatus.RESUMING}) | TERMINAL,
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


class IllegalRunTransition(CodedError, ValueError):
    """A status change the run lifecycle does not allow: a bug in the caller, not a race."""

    def __init__(self, source: RunStatus, target: RunStatus) -> None:
        allowed = ", ".join(sorted(MOVES[source])) or "nothing"
        super().__init__(
            f"a run may not move from {source.value} to {target.value} "
            f"(from {source.value} it may move to: {allowed})"
        )
        self.source = source
        self.target = target


def moves_into(target: RunStatus) -> frozenset[RunStatus]:
    """The statuses from which a run may move to `target`: a swap's expected statuses."""
    return frozenset(source for source, targets in MOVES.items() if target in targets)


def check_moves(sources: Iterable[RunStatus], target: RunStatus) -> None:
    """Raise `IllegalRunTransition` unless every move from `sources` to `target` is legal."""
    for source in sources:
        if target not in MOVES[source]:
            raise IllegalRunTransition(source, target)
