"""EventBus: wakes subscribers when a thread's log grows or a tenant's inbox changes.

Listeners are plain callbacks run on the event loop; they must not block (subscriptions hand
frames to bounded connection queues). What this process publishes also goes to the other
processes on the database through the relay (gateway/event_log/relay/): a thread's new head,
approval ids added to or removed from an inbox. What they publish arrives as bare wake-ups ("the log
grew: read it from your cursor") and as inbox changes whose views `on_remote_inbox` builds from the
tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.relay import MemoryRelay, Relay

# Told a thread's committed events and when they were committed (`time.perf_counter`; 0.0
# for a bare wake-up, which carries none).
EventListener = Callable[[Sequence[LoggedEvent], float], None]
InboxListener = Callable[[list[dict[str, Any]], list[str]], None]
# Told (thread_id, watchers) whenever the number of watchers of a thread changes.
WatchListener = Callable[[str, int], None]
# Told (tenant, added approval ids, removed approval ids) published by another process.
RemoteInboxListener = Callable[[str, list[str], list[str]], None]
# Told a message of a kind registered with `on_message`, as another process published it.
MessageListener = Callable[[dict[str, Any]], None]
# Told the ids of threads whose place in a thread list changed (title, archive, deletion, a run's
# status, pending approvals), here or in another process; None when changes may have been
# missed (the relay was down), so every list should be read again.
ThreadsListener = Callable[[Sequence[str] | None], None]

# The events that change what a thread list shows of a thread: its newest run's status and its
# pending approvals. Deltas and tool calls do not, so they wake no list.
LISTED_EVENTS = frozenset(
    {
        "run.started",
        "run.paused",
        "run.resumed",
        "run.recovered",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "approval.requested",
        "approval.decided",
    }
)

# How often a process repeats, over a shared relay, which threads it has watchers on. The
# others forget a process's watchers once they have not heard of them for `WATCH_EXPIRY_S`
# (it died, or lost the relay): a run is then suspended on their side as if nobody watched.
WATCH_REFRESH_S = 5.0
WATCH_EXPIRY_S = 3 * WATCH_REFRESH_S
# Thread ids per `watch` message.
WATCH_CHUNK = 500


class EventBus:
    def __init__(self, relay: Relay | None = None) -> None:
        self._relay = relay or MemoryRelay()
        self._remote_inbox: RemoteInboxListener | None = None
        # Threads other processes have watchers on: thread -> {process: when that expires}.
        self._watched_elsewhere: dict[str, dict[str, float]] = {}
        self._refresh: asyncio.Task[None] | None = None
        # Handlers of message kinds other parts of the gateway exchange over the relay.
        self._handlers: dict[str, MessageListener] = {}
        self._threads: dict[str, set[EventListener]] = {}
        self._inboxes: dict[str, set[InboxListener]] = {}
        self._thread_lists: set[ThreadsListener] = set()
        self._watch_listeners: list[WatchListener] = []
        # The newest seq committed and published here per watched thread: the log watch
        # wakes subscribers only for growth beyond it (events another process wrote).
        self._published: dict[str, int] = {}
        # How many commits' events this process has published, on any thread: unchanged
        # between two moments, nothing was stored here in between (`RunManager` start).
        self.publications = 0

    def on_watchers_changed(self, listener: WatchListener) -> None:
        self._watch_listeners.append(listener)

    def _watchers_changed(self, thread_id: str) -> None:
        count = self.watchers(thread_id)
        for listener in self._watch_listeners:
            listener(thread_id, count)

    def subscribe(self, thread_id: str, listener: EventListener) -> Callable[[], None]:
        listeners = self._threads.setdefault(thread_id, set())
        if not listeners:
            self._tell_watching([thread_id])
        listeners.add(listener)
        self._watchers_changed(thread_id)

        def unsubscribe() -> None:
            listeners = self._threads.get(thread_id)
            if listeners is None or listener not in listeners:
                return
            listeners.discard(listener)
            if not listeners:
                del self._threads[thread_id]
                self._published.pop(thread_id, None)
                self._tell_watching([], gone=[thread_id])
            self._watchers_changed(thread_id)

        return unsubscribe

    def watchers(self, thread_id: str) -> int:
        """Watchers of the thread on this process."""
        return len(self._threads.get(thread_id, ()))

    def watched(self, thread_id: str) -> bool:
        """Whether the thread has a watcher on this process or, as far as the relay has said
        lately, on another one."""
        if self.watchers(thread_id):
            return True
        elsewhere = self._watched_elsewhere.get(thread_id)
        if not elsewhere:
            return False
        now = time.monotonic()
        for process in [p for p, until in elsewhere.items() if until <= now]:
            del elsewhere[process]
        if not elsewhere:
            del self._watched_elsewhere[thread_id]
        return bool(elsewhere)

    async def start(self) -> None:
        await self._relay.start(self._on_relayed, self._relay_back)
        if self._relay.shared:
            self._refresh = asyncio.create_task(self._refresh_watching(), name="watch-refresh")

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        await self._relay.close()

    def _relay_back(self) -> None:
        """The relay is back after an outage: messages may have been missed both ways."""
        self.wake_all()
        self._deliver_threads(None)
        self._tell_watching(list(self._threads))

    async def _refresh_watching(self) -> None:
        while True:
            await asyncio.sleep(WATCH_REFRESH_S)
            self._tell_watching(list(self._threads))

    def _tell_watching(self, threads: list[str], gone: Sequence[str] = ()) -> None:
        if not self._relay.shared:
            return
        if gone:
            self._relay.publish({"kind": "watch", "threads": [], "gone": list(gone)})
        for start in range(0, len(threads), WATCH_CHUNK):
            chunk = threads[start : start + WATCH_CHUNK]
            self._relay.publish({"kind": "watch", "threads": chunk, "gone": []})

    def publish(self, thread_id: str, events: Sequence[LoggedEvent], committed: float) -> None:
        """Hand events committed at `committed` to the thread's listeners (and tell the other
        processes the thread's new head); an empty batch is a bare wake-up ("the log may have
        grown": listeners read it from the table)."""
        self.publications += 1
        if events and self._relay.shared:
            self._relay.publish({"kind": "wake", "threads": {thread_id: events[-1].seq}})
        if any(event.type in LISTED_EVENTS for event in events):
            self.threads_changed([thread_id])
        listeners = self._threads.get(thread_id)
        if not listeners:
            return
        if events:
            self._published[thread_id] = max(self._published.get(thread_id, 0), events[-1].seq)
        for listener in list(listeners):
            listener(events, committed)

    def committed_here(self, events: Sequence[LoggedEvent]) -> None:
        """These events were committed by this process, and its listeners hear of them from
        it: from the event log on the loop's next turn (streamed events are published then),
        or from the subscription they were handed to (a run start's own commit). The log
        watch's and the relay's wake-ups up to their seqs then wake nobody; a poll would
        otherwise find this process's own commit before its events are published, and send
        every subscription of the batch's threads to read the table for nothing."""
        published = self._published
        for event in events:
            thread_id = event.thread_id
            if thread_id in self._threads and event.seq > published.get(thread_id, 0):
                published[thread_id] = event.seq

    def wake(self, thread_id: str, head: int) -> None:
        """Another process stored events of `thread_id` up to `head`: wake its listeners unless
        they were told of that much already."""
        if thread_id not in self._threads or head <= self._published.get(thread_id, 0):
            return
        self._published[thread_id] = head
        for listener in list(self._threads[thread_id]):
            listener((), 0.0)

    def wake_all(self) -> None:
        """A bare wake-up for every watched thread (after the relay missed messages)."""
        for thread_id in list(self._threads):
            for listener in list(self._threads.get(thread_id, ())):
                listener((), 0.0)

    def on_remote_inbox(self, listener: RemoteInboxListener) -> None:
        self._remote_inbox = listener

    def has_inbox_listeners(self, tenant: str) -> bool:
        return bool(self._inboxes.get(tenant))

    @property
    def shared(self) -> bool:
        """Whether other processes hear this one (a relay other than `memory://`)."""
        return self._relay.shared

    def on_message(self, kind: str, handler: MessageListener) -> None:
        """Messages of `kind` from other processes (with `from`, the sender's instance id)."""
        self._handlers[kind] = handler

    def tell(self, message: dict[str, Any]) -> None:
        """Send `message` (with its `kind`) to the other processes, if any hear this one."""
        if self._relay.shared:
            self._relay.publish(message)

    def _on_relayed(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "wake":
            for thread_id, head in message.get("threads", {}).items():
                self.wake(thread_id, int(head))
        elif kind == "watch":
            self._heard_watching(message)
        elif kind == "threads":
            self._deliver_threads([str(thread_id) for thread_id in message.get("threads", [])])
        elif isinstance(kind, str) and kind in self._handlers:
            self._handlers[kind](message)
        elif kind == "inbox" and self._remote_inbox is not None:
            tenant = message.get("tenant")
            if isinstance(tenant, str) and self.has_inbox_listeners(tenant):
                self._remote_inbox(
                    tenant, list(message.get("added", [])), list(message.get("removed", []))
                )

    def _heard_watching(self, message: dict[str, Any]) -> None:
        process = message.get("from")
        if not isinstance(process, str):
            return
        until = time.monotonic() + WATCH_EXPIRY_S
        for thread_id in message.get("threads", []):
            self._watched_elsewhere.setdefault(str(thread_id), {})[process] = until
        for thread_id in message.get("gone", []):
            elsewhere = self._watched_elsewhere.get(str(thread_id))
            if elsewhere is not None:
                elsewhere.pop(process, None)
                if not elsewhere:
                    del self._watched_elsewhere[str(thread_id)]

    def subscribe_thread_changes(self, listener: ThreadsListener) -> Callable[[], None]:
        self._thread_lists.add(listener)
        return lambda: self._thread_lists.discard(listener)

    def threads_changed(self, thread_ids: Sequence[str]) -> None:
        """Tell the thread lists here and in the other processes that these threads changed."""
        if self._relay.shared:
            self._relay.publish({"kind": "threads", "threads": list(thread_ids)})
        self._deliver_threads(thread_ids)

    def _deliver_threads(self, thread_ids: Sequence[str] | None) -> None:
        for listener in list(self._thread_lists):
            listener(thread_ids)

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
