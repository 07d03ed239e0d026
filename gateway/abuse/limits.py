"""Abuse limits: the pure counting behind them, with an injectable monotonic clock.

Nothing here touches sockets or storage. A `Limits` is created once in the app lifespan and
reaches connections through `Services`; connections turn its answers into `rate_limited`
error frames or close codes (docs/protocol.md §7). The per-user counters live in this process;
with a shared bus, each process also counts what the others report (gateway/abuse/shared_usage.py):
run starts as they happen, open connections as their numbers change. So the per-user limits
hold across processes, give or take what starts in two processes within the bus's delivery
time of each other.

A limit of 0 turns that limit off.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.protocol.error_codes import rate_limited

if TYPE_CHECKING:
    from gateway.settings import Settings

Clock = Callable[[], float]

# A server ping earns the client one pong that costs nothing; a cap keeps a client that lets
# pings pile up from banking free frames for later.
MAX_PONG_CREDITS = 2


def retry_hint(seconds: float) -> float:
    """Seconds rounded *up* to 1/100 s: a client that waits exactly this long is admitted."""
    return math.ceil(max(seconds, 0.0) * 100) / 100


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`; starts full."""

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        # max(): a clock that steps back (a test, or a broken monotonic source) adds nothing.
        elapsed = max(now - self._at, 0.0)
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        self._at = now

    def take(self) -> float:
        """Take one token: 0.0 when taken, else the seconds until one will be there."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    def give_back(self) -> None:
        """Return a token taken for something that turned out to be free."""
        self._tokens = min(self._burst, self._tokens + 1.0)

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens


@dataclass(frozen=True)
class Refusal:
    """A frame the gate did not admit. `flooding`: the client ignores refusals; close it."""

    retry_after_s: float
    flooding: bool


class FrameGate:
    """Frames per second on one connection: a token bucket with a burst.

    Refused frames draw on a second bucket of the same size and rate. A client that keeps
    sending after being refused (more than twice the rate for long, or more than twice the
    burst at once) empties it and is told it is flooding.
    """

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self._frames = TokenBucket(rate, burst, clock)
        self._refusals = TokenBucket(rate, burst, clock)
        self._pong_credits = 0

    def admit(self) -> float:
        """0.0 when the frame may be handled; else seconds until one would be admitted."""
        return self._frames.take()

    def refuse(self, retry_after_s: float) -> Refusal:
        return Refusal(retry_hint(retry_after_s), flooding=self._refusals.take() > 0.0)

    def ping_sent(self) -> None:
        self._pong_credits = min(self._pong_credits + 1, MAX_PONG_CREDITS)

    def pong_is_free(self, *, admitted: bool) -> bool:
        """A pong answering one of our pings costs nothing; True when this one was free.

        `admitted`: the gate already counted it, so its token goes back.
        """
        if self._pong_credits == 0:
            return False
        self._pong_credits -= 1
        if admitted:
            self._frames.give_back()
        return True


class OpenGate:
    """The gate of a deployment without a frame rate limit."""

    def admit(self) -> float:
        return 0.0

    def refuse(self, retry_after_s: float) -> Refusal:  # pragma: no cover - never refuses
        return Refusal(retry_hint(retry_after_s), flooding=False)

    def ping_sent(self) -> None:
        return None

    def pong_is_free(self, *, admitted: bool) -> bool:
        return False


class SlidingWindow:
    """At most `limit` events per key in any `window_s` seconds (an exact log of times).

    Memory stays bounded: each key keeps at most `limit` times, and keys with no event in the
    last window are forgotten (`tracked`), oldest-used first, as part of every call.
    """

    def __init__(self, limit: int, window_s: float, clock: Clock) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("a sliding window needs limit >= 1 and window_s > 0")
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        # Ordered by last event, so idle keys collect at the front.
        self._events: OrderedDict[Hashable, deque[float]] = OrderedDict()

    def acquire(self, key: Hashable) -> float:
        """Record one event for `key`: 0.0 when allowed, else the seconds until it would be."""
        return self._add(key, refuse=True)

    def record(self, key: Hashable) -> None:
        """Count an event for `key` that happened elsewhere (it is not refused here)."""
        self._add(key, refuse=False)

    def _add(self, key: Hashable, *, refuse: bool) -> float:
        now = self._clock()
        self._forget_idle(now)
        times = self._events.get(key)
        if times is None:
            times = self._events[key] = deque(maxlen=self._limit)
        while times and times[0] <= now - self._window_s:
            times.popleft()
        if refuse and len(times) >= self._limit:
            return retry_hint(times[0] + self._window_s - now)
        times.append(now)
        self._events.move_to_end(key)
        return 0.0

    def _forget_idle(self, now: float) -> None:
        cutoff = now - self._window_s
        while self._events:
            key, times = next(iter(self._events.items()))
            if times and times[-1] > cutoff:
                return
            del self._events[key]

    @property
    def tracked(self) -> int:
        return len(self._events)


class ConnectionCounter:
    """Open connections per key; a key whose count drops to zero is forgotten.

    Besides its own, it holds what other processes last reported (`heard`), each report
    forgotten `REPORT_TTL_S` after it was made unless repeated: a process that died stops
    counting once its reports expire."""

    REPORT_TTL_S = 15.0

    def __init__(
        self,
        limit: int,
        clock: Clock = time.monotonic,
        on_change: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        self._limit = limit
        self._clock = clock
        self._on_change = on_change
        self._open: dict[Hashable, int] = {}
        # Per other process: its counts by key, and until when they hold.
        self._elsewhere: dict[str, tuple[dict[Hashable, int], float]] = {}

    def acquire(self, key: Hashable) -> ConnectionSlot | None:
        """A slot to release when the connection ends, or None when `key` is at the limit."""
        count = self._open.get(key, 0)
        if self._limit and count + self.count_elsewhere(key) >= self._limit:
            return None
        self._open[key] = count + 1
        if self._on_change is not None:
            self._on_change(key, count + 1)
        return ConnectionSlot(self, key)

    def _release(self, key: Hashable) -> None:
        count = self._open.get(key, 0) - 1
        if count > 0:
            self._open[key] = count
        else:
            self._open.pop(key, None)
        if self._on_change is not None:
            self._on_change(key, max(count, 0))

    def count(self, key: Hashable) -> int:
        return self._open.get(key, 0)

    def count_elsewhere(self, key: Hashable) -> int:
        now = self._clock()
        for source in [s for s, (_, until) in self._elsewhere.items() if until <= now]:
            del self._elsewhere[source]
        return sum(counts.get(key, 0) for counts, _ in self._elsewhere.values())

    def heard(self, source: str, counts: dict[Hashable, int], *, complete: bool) -> None:
        """Another process's open connections: all of them (`complete`), or changed keys."""
        known, _ = self._elsewhere.get(source, ({}, 0.0))
        merged = dict(counts) if complete else {**known, **counts}
        self._elsewhere[source] = (
            {key: n for key, n in merged.items() if n > 0},
            self._clock() + self.REPORT_TTL_S,
        )

    def counts(self) -> dict[Hashable, int]:
        """This process's open connections by key."""
        return dict(self._open)

    @property
    def tracked(self) -> int:
        return len(self._open)


class ConnectionSlot:
    """One counted connection. `release` is idempotent, so every exit path may call it."""

    def __init__(self, counter: ConnectionCounter, key: Hashable) -> None:
        self._counter = counter
        self._key = key
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._counter._release(self._key)


@dataclass(frozen=True)
class LimitSettings:
    """The numbers; 0 turns a limit off."""

    frames_per_s: float = 0.0
    frame_burst: int = 1
    runs_per_minute: int = 0
    connections_per_user: int = 0
    subscriptions_per_connection: int = 0
    pending_inputs_per_thread: int = 0


class Limits:
    """All abuse limits of one gateway process. Users are keyed by (tenant, user)."""

    RUN_WINDOW_S = 60.0

    def __init__(self, settings: LimitSettings, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._run_starts = (
            SlidingWindow(settings.runs_per_minute, self.RUN_WINDOW_S, clock)
            if settings.runs_per_minute
            else None
        )
        # Told of each run start admitted here and each change of a user's open connections
        # here (gateway/abuse/shared_usage.py reports them to the other processes).
        self.on_run_started: Callable[[Hashable], None] | None = None
        self.on_connections_changed: Callable[[Hashable, int], None] | None = None
        # Told of each refusal, by limit kind (the metrics count them).
        self.on_refused: Callable[[str], None] | None = None
        self.connections = ConnectionCounter(
            settings.connections_per_user, clock, on_change=self._connections_changed
        )

    def _connections_changed(self, key: Hashable, count: int) -> None:
        if self.on_connections_changed is not None:
            self.on_connections_changed(key, count)

    def run_started_elsewhere(self, tenant: str, user: str) -> None:
        if self._run_starts is not None:
            self._run_starts.record((tenant, user))

    @classmethod
    def from_settings(cls, settings: Settings, clock: Clock = time.monotonic) -> Limits:
        return cls(
            LimitSettings(
                frames_per_s=settings.frames_per_s,
                frame_burst=settings.frame_burst,
                runs_per_minute=settings.runs_per_minute,
                connections_per_user=settings.max_connections_per_user,
                subscriptions_per_connection=settings.max_subscriptions,
                pending_inputs_per_thread=settings.max_pending_inputs,
            ),
            clock,
        )

    def frame_gate(self) -> FrameGate | OpenGate:
        """A new connection's own frame budget."""
        if self.settings.frames_per_s <= 0:
            return OpenGate()
        return FrameGate(self.settings.frames_per_s, self.settings.frame_burst, self._clock)

    def start_run(self, tenant: str, user: str) -> float:
        """Count one run start: 0.0 when allowed, else seconds until one would be."""
        if self._run_starts is None:
            return 0.0
        wait_s = self._run_starts.acquire((tenant, user))
        if not wait_s and self.on_run_started is not None:
            self.on_run_started((tenant, user))
        return wait_s

    def open_connection(self, tenant: str, user: str) -> ConnectionSlot:
        """Hold one of the user's open-connection slots (a WebSocket or an SSE feed), or raise
        `rate_limited`. The caller releases the slot when the connection ends."""
        slot = self.connections.acquire((tenant, user))
        if slot is None:
            self.refused("connections")
            limit = self.settings.connections_per_user
            raise rate_limited(f"this user already has {limit} open connections; close one first")
        return slot

    def admit_run_start(self, tenant: str, user: str) -> None:
        """Count one run start, or raise `rate_limited` (every transport's one rule)."""
        wait_s = self.start_run(tenant, user)
        if wait_s:
            self.refused("run_starts")
            limit = self.settings.runs_per_minute
            raise rate_limited(
                f"at most {limit} runs may be started per minute", retry_after_s=wait_s
            )

    def refused(self, kind: str) -> None:
        """A request this kind of limit refused (`frames`, `subscriptions`, `connections`,
        `run_starts`, `pending_inputs`)."""
        if self.on_refused is not None:
            self.on_refused(kind)

    def subscription_allowed(self, current: int) -> bool:
        limit = self.settings.subscriptions_per_connection
        return not limit or current < limit

    @property
    def pending_inputs_per_thread(self) -> int:
        return self.settings.pending_inputs_per_thread

    @property
    def tracked_users(self) -> int:
        """Users the per-user counters hold state for (for tests and metrics)."""
        runs = self._run_starts.tracked if self._run_starts is not None else 0
        return runs + self.connections.tracked
