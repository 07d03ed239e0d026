"""What starting a run answers: the run, its first commit and where its log begins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.event_log.logged_event import LoggedEvent
from persistence.threads import ThreadRecord


@dataclass(frozen=True)
class Started:
    thread_id: str
    run_id: str
    first_seq: int  # seq of the run's `run.started` event
    # The thread as of the run's first commit (its `head_seq` is `run.started`'s seq) and the
    # events of that commit: a connection subscribes its caller without reading either again.
    thread: ThreadRecord
    events: list[LoggedEvent]
    # The run whose answer this one replaces (regenerate), if any.
    supersedes: str | None = None
    # The failed run this one retries from its last checkpoint (retry), if any.
    retries: str | None = None
    # That run's checkpoint the retry goes on from; None: from its input.
    checkpoint_version: int | None = None
    # When the run's first commit created the thread: the bus's publication count right
    # after it. While the count is unchanged, `events` are all the thread has (nothing was
    # stored here since, and no other process knows the thread yet), so a subscription made
    # then needs no read of the log to catch up.
    quiet_since: int | None = None

    def answer(self) -> dict[str, Any]:
        """What the request that started the run is answered with (its `ack`, its HTTP body)."""
        fields: dict[str, Any] = {"thread_id": self.thread_id, "run_id": self.run_id}
        if self.supersedes is not None:
            fields["supersedes"] = self.supersedes
        if self.retries is not None:
            fields["retries"] = self.retries
            fields["checkpoint_version"] = self.checkpoint_version
        return fields
