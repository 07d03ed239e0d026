"""EventBus: wakes subscribers when a thread's log grows or a tenant's inbox changes.

In-process only for now. Listeners are plain callbacks run on the event loop; they must not
block (subscriptions hand frames to bounded connection queues).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gateway.eventlog_types import LoggedEvent

EventListener = Callable[[Sequence[LoggedEvent]], None]
InboxListener = Callable[[list[dict[str, Any]], list[str]], None]
# Told (thread_id, watchers) whenever the number of watchers of a thread changes.
WatchListener = Callable[[str, int], None]


class EventBus:
    def __init__(self) -> None:
        self._threads: dict[str, set[EventListener]] = {}
        self._inboxes: dict[str, set[InboxListener]] = {}
        self._watch_listeners: list[WatchListener] = []
        # The newest seq published here per watched thread: the log watch wakes subscribers
        # only for growth beyond it (events another process wrote).
        self._published: dict[str, int] = {}

    def on_watchers_changed(self, listener: WatchListener) -> None:
        self._watch_listeners.append(listener)

    def _watchers_changed(self, thread_id: str) -> None:
        count = self.watchers(thread_id)
        for listener in self._watch_listeners:
            listener(thread_id, count)

    def subscribe(self, thread_id: str, listener: EventListener) -> Callable[[], None]:
        self._threads.setdefault(thread_id, set()).add(listener)
        self._watchers_changed(thread_id)

        def unsubscribe() -> None:
            listeners = self._threads.get(thread_id)
            if listeners is None or listener not in listeners:
                return
            listeners.discard(listener)
            if not listeners:
                del self._threads[thread_id]
                self._published.pop(thread_id, None)
            self._watchers_changed(thread_id)

        return unsubscribe

    def watchers(self, thread_id: str) -> int:
        return len(self._threads.get(thread_id, ()))

    def publish(self, thread_id: str, events: Sequence[LoggedEvent]) -> None:
        """Hand committed events to the thread's listeners; an empty batch is a bare wake-up
        ("the log may have grown": listeners read it from the table)."""
        listeners = self._threads.get(thread_id)
        if not listeners:
            return
        if events:
            self._published[thread_id] = max(self._published.get(thread_id, 0), events[-1].seq)
        for listener in list(listeners):
            listener(events)

    def published_head(self, thread_id: str) -> int:
        """The newest seq of `thread_id` published here while it had listeners (0: none)."""
        return self._published.get(thread_id, 0)

    def watched_threads(self) -> list[str]:
        return list(self._threads)

    def subscribe_inbox(self, tenant: str, listener: InboxListener) -> Callable[[], None]:
        self._inboxes.setdefault(tenant, set()).add(listener)

        def unsubscribe() -> None:
            listeners = self._inboxes.get(tenant)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._inboxes[tenant]

        return unsubscribe

    def publish_inbox(
        self,
        tenant: str,
        *,
        added: list[dict[str, Any]] | None = None,
        removed: list[str] | None = None,
    ) -> None:
        for listener in list(self._inboxes.get(tenant, ())):
            listener(added or [], removed or [])
