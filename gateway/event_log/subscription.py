"""One connection's subscription to one thread's log: replay from a cursor, then follow live.

The subscription registers with the bus *before* reading the table, and tracks the last seq it
delivered. Live events that continue exactly from that seq are forwarded directly; anything else
(a gap, or events arriving while the replay runs) just wakes the pump, which reads the table
from the cursor. So every seq after the cursor is delivered exactly once, in order, whatever
interleaving the writer and the replay have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.masked_events import needs_reveal
from gateway.event_log.writer import EventLog
from gateway.observability.metrics import GatewayMetrics
from gateway.protocol.error_codes import CodedError
from persistence.threads import ThreadRecord

REPLAY_PAGE = 500
# A replay page is held until the connection has taken all of it (and the next page is read
# meanwhile: two at most), so its size is bounded in bytes too: each page asks for as many
# events as fit this budget at the previous page's average event size. The first asks for few,
# as the size of the thread's events is not known yet; a page of 500 events of 60 KB each held
# 30 MB for a client that never read.
REPLAY_PAGE_BYTES = 512 * 1024
FIRST_REPLAY_PAGE = 16


class ReplayCut(CodedError):
    """Events after the subscription's cursor are gone from the log: retention cut it while
    the subscription replayed it. The subscriber starts again (a fresh subscription from its
    cursor is told `reset`, docs/protocol.md §4); carrying on would skip the cut events."""


class Subscription:
    def __init__(
        self,
        *,
        thread_id: str,
        after_seq: int,
        bus: EventBus,
        log: EventLog,
        send_replay: Callable[[str], asyncio.Future[None] | object],
        send_live: Callable[[str, float], bool],
        reveal: Callable[[LoggedEvent], Awaitable[str]] | None = None,
        metrics: GatewayMetrics | None = None,
        omit: frozenset[str] = frozenset(),
    ) -> None:
        """`send_replay` may wait for queue space; `send_live` must not (False = no room).
        `send_live` also gets the time (`time.perf_counter`) its event was committed, as the
        event log publishes it, with metrics on (else 0.0).

        `reveal` gives the frame to send for a stored event whose sensitive arguments are
        masked (the connection knows whether its caller may see them). It may read storage,
        so such events, which are rare, are always sent by the pump, never from the bus
        callback; every other event takes the usual path unchanged.

        A live batch that does not fit is not dropped and does not close the connection:
        the subscription falls back to reading the table from its cursor, paced by the
        connection (`send_replay`), which closes a consumer that stops reading altogether.

        `omit`: event types this subscription leaves out (the client asked, docs/protocol.md
        §3 `omit`). The cursor moves past them; the next frame sent after some were left out
        carries `prev_seq`, the seq of the frame sent before it, so the client can tell
        omitted events from lost ones.
        """
        self.thread_id = thread_id
        self.last_seq = after_seq
        # Where it started: the first event read may lie past it (retention cut the log there
        # before: a caller that follows from an old cursor has been told, or built its view
        # from what the log holds); a gap after that is a cut made while it replayed.
        self._start_seq = after_seq
        self._omit = omit
        # The seq of the last event sent (or the cursor): `last_seq` but for omitted events.
        self._sent_seq = after_seq
        self._bus = bus
        self._log = log
        self._send_replay = send_replay
        self._send_live = send_live
        self._reveal = reveal
        self._live = False
        self._wakeup = asyncio.Event()
        self._unsubscribe = bus.subscribe(thread_id, self._on_events)
        self._task: asyncio.Task[None] | None = None
        self._metrics = metrics
        if metrics is not None:
            metrics.subscriptions.inc()

    def start(self, initial: Sequence[LoggedEvent] = (), *, caught_up: bool = False) -> None:
        """Start following the log. `initial`: stored events the caller already has (a run
        start's own commit), sent at once as a read of the log would, so the first frames go
        out without waiting for one; the pump then reads from wherever they ended, unless
        `caught_up` says they are all the log has and all of them were sent: the subscription
        is live at once, and reads the log only when a commit it was told of leaves a gap."""
        sent_all = True
        for event in initial:
            if event.seq != self.last_seq + 1 or (self._reveal is not None and needs_reveal(event)):
                sent_all = False
                break
            if self._omit and event.type in self._omit:
                self.last_seq = event.seq
                continue
            frame = (
                event.frame if self._sent_seq == self.last_seq else self._after_omitted(event.frame)
            )
            if not self._send_live(frame, 0.0):
                sent_all = False
                break
            self.last_seq = self._sent_seq = event.seq
        self._live = caught_up and sent_all and bool(initial)
        if self._live:
            self._bus.committed_here(initial)
        self._task = asyncio.create_task(
            self._pump(live=self._live), name=f"subscription-{self.thread_id}"
        )

    def close(self) -> None:
        if self._metrics is not None:
            # Once, however often it is closed.
            self._metrics.subscriptions.dec()
            self._metrics = None
        self._unsubscribe()
        if self._task is not None:
            self._task.cancel()

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def _on_events(self, events: Sequence[LoggedEvent], committed: float) -> None:
        if not events or not self._live or events[0].seq > self.last_seq + 1:
            self._wakeup.set()
            return
        # Measured only with metrics on.
        committed = committed if self._metrics is not None else 0.0
        for event in events:
            if event.seq <= self.last_seq:
                continue
            if event.seq != self.last_seq + 1 or (self._reveal is not None and needs_reveal(event)):
                self._live = False
                self._wakeup.set()
                return
            if self._omit and event.type in self._omit:
                self.last_seq = event.seq
                continue
            frame = (
                event.frame if self._sent_seq == self.last_seq else self._after_omitted(event.frame)
            )
            if not self._send_live(frame, committed):
                self._live = False
                self._wakeup.set()
                return
            self.last_seq = self._sent_seq = event.seq

    async def _pump(self, *, live: bool = False) -> None:
        if live:
            await self._wakeup.wait()
            self._live = False
        while True:
            # Cleared before reading: an event published while the read is in flight sets it
            # again, so going live below cannot miss it.
            self._wakeup.clear()
            limit = FIRST_REPLAY_PAGE
            page = await self._log.read(self.thread_id, after_seq=self.last_seq, limit=limit)
            while True:
                following = None
                try:
                    if len(page) == limit:
                        # The next page is asked for before this one is sent: on PostgreSQL
                        # the server reads it while the loop frames this one (one turn of the
                        # loop lets the read send its query), instead of the replay waiting a
                        # round trip a page. At most two pages are held.
                        limit = next_page_limit(page)
                        following = asyncio.ensure_future(
                            self._log.read(self.thread_id, after_seq=page[-1].seq, limit=limit)
                        )
                        await asyncio.sleep(0)
                    await self._send_page(page)
                except BaseException:
                    if following is not None:
                        following.cancel()
                        await asyncio.gather(following, return_exceptions=True)
                    raise
                if following is None:
                    break
                page = await following
            self._live = True
            await self._wakeup.wait()
            self._live = False

    async def _send_page(self, page: Sequence[LoggedEvent]) -> None:
        for event in page:
            # The log's seqs are dense: past the first event read, a gap is a cut.
            if event.seq != self.last_seq + 1 and self.last_seq != self._start_seq:
                raise ReplayCut(
                    f"the log of thread {self.thread_id} was cut after seq {self.last_seq} "
                    "while it was replayed"
                )
            if self._omit and event.type in self._omit:
                self.last_seq = event.seq
                continue
            frame = event.frame
            if self._reveal is not None and needs_reveal(event):
                frame = await self._reveal(event)
            if self._sent_seq != self.last_seq:
                frame = self._after_omitted(frame)
            result = self._send_replay(frame)
            if asyncio.isfuture(result) or asyncio.iscoroutine(result):
                await result
            self.last_seq = self._sent_seq = event.seq

    def _after_omitted(self, frame: str) -> str:
        """`frame`, the first sent after omitted events, with `prev_seq`: the seq of the frame
        sent before it. (Checked by the callers, `_sent_seq != last_seq`: one comparison per
        event on the hot path, and no call.)"""
        # The frame is a JSON object: the field goes before its closing brace.
        return f'{frame[:-1]},"prev_seq":{self._sent_seq}}}'


def next_page_limit(page: Sequence[LoggedEvent]) -> int:
    """How many events the next replay page may ask for, after a full `page`."""
    average = max(1, sum(len(event.frame) for event in page) // len(page))
    return max(1, min(REPLAY_PAGE, REPLAY_PAGE_BYTES // average))


def resume_point(thread: ThreadRecord, after_seq: int, epoch: str | None) -> tuple[int, bool]:
    """Where a subscription from `after_seq` (in `epoch`, when the client knows it) starts,
    and whether the client must drop its view first (`reset`, docs/protocol.md §4). One rule
    for every transport that follows a thread: the WebSocket and the SSE feed."""
    reset = (
        (epoch is not None and epoch != thread.epoch)
        or after_seq > thread.head_seq
        # Retention removed events the client has not seen: it must rebuild its view.
        or after_seq < thread.truncated_seq
    )
    return (0 if reset else after_seq), reset
