"""What a run's `run.started` says of the runs before it, read once for the frontend adapters,
whose conversations follow it as the agent's history does (docs/protocol.md §4
`run.regenerate`, `run.retry`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AnsweredAgain:
    """What a `run.started` says of the runs before it (docs/protocol.md §4): a regenerate's
    run replaces the input and answer of run `supersedes`; a retry's run answers the input of
    failed run `retries` again, going on from that run's last boundary (`from_boundary`) or
    from its input. The conversation a frontend shows follows both, as the agent's does."""

    supersedes: str | None = None
    retries: str | None = None
    from_boundary: bool = False

    @classmethod
    def of(cls, data: dict[str, Any]) -> AnsweredAgain:
        supersedes, retries = data.get("supersedes"), data.get("retries")
        return cls(
            supersedes=supersedes if isinstance(supersedes, str) else None,
            retries=retries if isinstance(retries, str) else None,
            from_boundary=data.get("checkpoint_version") is not None,
        )
