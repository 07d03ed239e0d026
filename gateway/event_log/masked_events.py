"""Telling, cheaply, which stored events had arguments masked (gateway/run_lifecycle/
sensitive_arguments.py masks them): a subscription sends those through its reader's reveal."""

from __future__ import annotations

from gateway.event_log.logged_event import LoggedEvent
from gateway.protocol.frames import EventType

# Inside a JSON string a quote is always escaped, so this can only be a key.
MASKED_KEY = '"masked":'


def needs_reveal(event: LoggedEvent) -> bool:
    """An `approval.requested` whose arguments were masked in the log.

    Cheap on purpose (it runs for every event sent to a reviewer): a type comparison, and a
    substring test only for the rare approval events.
    """
    return event.type == EventType.APPROVAL_REQUESTED and MASKED_KEY in event.frame
