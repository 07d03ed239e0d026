"""EventBus: wakes subscribers when a thread's log grows or a tenant's inbox changes.

Listeners are plain callbacks run on the event loop; they must not block (subscriptions hand
frames to bounded connection queues). What this process publishes also goes to the other
processes on the database through the relay (gateway/relay/): a thread's new head, approval ids
added to or removed from an inbox. What they publish arrives as bare wake-ups ("the log grew:
read it from your cursor") and as inbox changes whose views `on_remote_inbox` builds from the
tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gateway.eventlog_types import LoggedEvent
from gateway.relay import MemoryRelay, Relay

EventListener = Callable[[Sequence[LoggedEvent]], None]
InboxListener = Callable[[list[dict[str, Any]], list[str]], None]
# Told (thread_id, watchers) whenever the number of watchers of a thread changes.
WatchListener = Callable[[str, int], None]
# Told (tenant, added approval ids, removed approval ids) published by another process.
RemoteInboxListener = Callable[[str, list[str], list[str]], None]


class EventBus:
    def __init__(self, relay: Relay | None = None) -> None:
        self._relay = relay or MemoryRelay()
        self._remote_inbox: RemoteInboxListener | None = None
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

    async def start(self) -> None:
        await self._relay.start(self._on_relayed, self.wake_all)

    async def close(self) -> None:
        await self._relay.close()

    def publish(self, thread_id: str, events: Sequence[LoggedEvent]) -> None:
        """Hand committed events to the thread's listeners (and tell the other processes the
        thread's new head); an empty batch is a bare wake-up ("the log may have grown":
        listeners read it from the table)."""
        if events and self._relay.shared:
            self._relay.publish({"kind": "wake", "threads": {thread_id: events[-1].seq}})
        listeners = self._threads.get(thread_id)
        if not listeners:
            return
        if events:
            self._published[thread_id] = max(self._published.get(thread_id, 0), events[-1].seq)
        for listener in list(listeners):
            listener(events)

    def wake(self, thread_id: str, head: int) -> None:
        """Another process stored events of `thread_id` up to `head`: wake its listeners unless
        they were told of that much already."""
        if thread_id not in self._threads or head <= self._published.get(thread_id, 0):
            return
        self._published[thread_id] = head
        for listener in list(self._threads[thread_id]):
            listener(())

    def wake_all(self) -> None:
        """A bare wake-up for every watched thread (after the relay missed messages)."""
        for thread_id in list(self._threads):
            for listener in list(self._threads.get(thread_id, ())):
                listener(())

    def on_remote_inbox(self, listener: RemoteInboxListener) -> None:
        self._remote_inbox = listener

    def has_inbox_listeners(self, tenant: str) -> bool:
        return bool(self._inboxes.get(tenant))

    def _on_relayed(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "wake":
            for thread_id, head in message.get("threads", {}).items():
                self.wake(thread_id, int(head))
        elif kind == "inbox" and self._remote_inbox is not None:
            tenant = message.get("tenant")
            if isinstance(tenant, str) and self.has_inbox_listeners(tenant):
                self._remote_inbox(
                    tenant, list(message.get("added", [])), list(message.get("removed", []))
                )

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
        """Tell the tenant's inbox listeners here, and the other processes (by approval id)."""
        if (added or removed) and self._relay.shared:
            self._relay.publish(
                {
                    "kind": "inbox",
                    "tenant": tenant,
                    "added": [view["approval_id"] for view in added or []],
                    "removed": list(removed or []),
                }
            )
        self.deliver_inbox(tenant, added or [], removed or [])

    def deliver_inbox(self, tenant: str, added: list[dict[str, Any]], removed: list[str]) -> None:
        """Tell this process's inbox listeners only."""
        for listener in list(self._inboxes.get(tenant, ())):
            listener(added, removed)
