"""The counting behind the abuse limits (gateway/abuse/limits.py), on a clock the test moves."""

from __future__ import annotations

import pytest

from gateway.__main__ import parser, settings_from
from gateway.abuse.limits import (
    ConnectionCounter,
    FrameGate,
    Limits,
    LimitSettings,
    OpenGate,
    SlidingWindow,
    TokenBucket,
    retry_hint,
)
from gateway.settings import load_settings
from tests.support.gateway import test_settings as settings_for


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- token bucket --------------------------------------------------------------------------------


def test_bucket_allows_a_burst_then_refuses_until_it_refills() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)  # one token takes 1/rate seconds
    clock.advance(0.25)
    assert bucket.take() == pytest.approx(0.25)
    clock.advance(0.25)
    assert bucket.take() == 0.0
    assert bucket.take() > 0.0


def test_bucket_never_holds_more_than_its_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=2, clock=clock)
    clock.advance(3600)
    assert bucket.tokens == 2.0
    assert [bucket.take() == 0.0 for _ in range(3)] == [True, True, False]


def test_bucket_ignores_a_clock_that_steps_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    assert bucket.take() == 0.0
    clock.advance(-50)
    assert bucket.take() == pytest.approx(1.0)
    clock.advance(1.0)
    assert bucket.take() == 0.0


def test_bucket_give_back_is_capped_at_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    bucket.give_back()
    assert bucket.tokens == 1.0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_bucket_rejects_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst, clock=FakeClock())


def test_retry_hint_rounds_up() -> None:
    assert retry_hint(0.001) == 0.01
    assert retry_hint(0.5) == 0.5
    assert retry_hint(-1) == 0.0


# -- frame gate ----------------------------------------------------------------------------------


def test_gate_refusals_then_flooding() -> None:
    clock = FakeClock()
    gate = FrameGate(rate=1.0, burst=2, clock=clock)
    assert gate.admit() == 0.0 and gate.admit() == 0.0
    wait = gate.admit()
    assert wait == pytest.approx(1.0)
    # Refusals draw on a bucket of the same size: two are tolerated, the third is a flood.
    first, second, third = (gate.refuse(wait) for _ in range(3))
    assert first == second
    assert not first.flooding and first.retry_after_s == 1.0
    assert third.flooding


def test_gate_forgives_refusals_at_its_rate() -> None:
    clock = FakeClock()
    gate = FrameGate(rate=1.0, burst=2, clock=clock)
    for _ in range(20):  # twice the rate, for a while: refused now and then, never a flood
        if gate.admit():
            assert not gate.refuse(1.0).flooding
        clock.advance(0.5)


def test_pong_answering_a_ping_is_free() -> None:
    clock = FakeClock()
    gate = FrameGate(rate=1.0, burst=1, clock=clock)
    assert not gate.pong_is_free(admitted=True)  # no ping sent: a pong is ordinary traffic
    gate.ping_sent()
    assert gate.admit() == 0.0
    assert gate.pong_is_free(admitted=True)  # its token is given back...
    assert gate.admit() == 0.0  # ...so the next frame is admitted
    gate.ping_sent()
    assert gate.admit() > 0.0
    assert gate.pong_is_free(admitted=False)  # refused by the bucket, but it was owed
    assert not gate.pong_is_free(admitted=False)


def test_pong_credits_are_capped() -> None:
    gate = FrameGate(rate=1.0, burst=1, clock=FakeClock())
    for _ in range(10):
        gate.ping_sent()
    assert [gate.pong_is_free(admitted=False) for _ in range(3)] == [True, True, False]


def test_open_gate_admits_everything() -> None:
    gate = OpenGate()
    assert all(gate.admit() == 0.0 for _ in range(10_000))
    gate.ping_sent()
    assert not gate.pong_is_free(admitted=True)


# -- sliding window ------------------------------------------------------------------------------


def test_window_counts_per_key_and_hints_when_the_oldest_expires() -> None:
    clock = FakeClock()
    window = SlidingWindow(limit=2, window_s=60, clock=clock)
    assert window.acquire("a") == 0.0
    clock.advance(10)
    assert window.acquire("a") == 0.0
    assert window.acquire("b") == 0.0  # another key has its own budget
    clock.advance(5)
    assert window.acquire("a") == 45.0  # the first event leaves the window 60 s after it
    clock.advance(45)
    assert window.acquire("a") == 0.0
    assert window.acquire("a") == 10.0


def test_refused_attempts_do_not_count() -> None:
    clock = FakeClock()
    window = SlidingWindow(limit=1, window_s=10, clock=clock)
    assert window.acquire("a") == 0.0
    for _ in range(5):
        clock.advance(1)
        assert window.acquire("a") > 0.0
    clock.advance(5)
    assert window.acquire("a") == 0.0


def test_window_forgets_idle_keys() -> None:
    clock = FakeClock()
    window = SlidingWindow(limit=3, window_s=60, clock=clock)
    for user in range(1000):
        window.acquire(user)
        clock.advance(0.01)
    assert window.tracked == 1000
    clock.advance(30)
    window.acquire("late")
    assert window.tracked == 1001  # all still inside the window
    clock.advance(31)
    window.acquire("later")
    # Only keys with an event in the last 60 s are left.
    assert window.tracked == 2


def test_window_memory_is_bounded_under_a_steady_stream_of_new_users() -> None:
    clock = FakeClock()
    window = SlidingWindow(limit=5, window_s=60, clock=clock)
    for user in range(100_000):
        window.acquire(user)
        clock.advance(1.0)  # one new user a second: at most ~60 inside any window
    assert window.tracked <= 61


# -- connection counter --------------------------------------------------------------------------


def test_connections_are_counted_and_released_once() -> None:
    counter = ConnectionCounter(limit=2)
    first = counter.acquire("a")
    second = counter.acquire("a")
    assert first is not None and second is not None
    assert counter.acquire("a") is None
    assert counter.acquire("b") is not None
    first.release()
    first.release()  # idempotent: a second release must not free someone else's slot
    assert counter.count("a") == 1
    third = counter.acquire("a")
    assert third is not None
    assert counter.acquire("a") is None
    second.release()
    third.release()
    assert counter.count("a") == 0


def test_connection_counter_forgets_users_without_connections() -> None:
    counter = ConnectionCounter(limit=1)
    slots = [counter.acquire(user) for user in range(500)]
    assert counter.tracked == 500
    for slot in slots:
        assert slot is not None
        slot.release()
    assert counter.tracked == 0


def test_unlimited_connection_counter() -> None:
    counter = ConnectionCounter(limit=0)
    assert all(counter.acquire("a") is not None for _ in range(1000))


# -- Limits --------------------------------------------------------------------------------------


def test_limits_key_users_by_tenant() -> None:
    clock = FakeClock()
    limits = Limits(LimitSettings(runs_per_minute=1), clock)
    assert limits.start_run("acme", "alice") == 0.0
    assert limits.start_run("other", "alice") == 0.0
    assert limits.start_run("acme", "alice") == 60.0
    clock.advance(60)
    assert limits.start_run("acme", "alice") == 0.0
    assert limits.tracked_users == 1


def test_zero_turns_every_limit_off() -> None:
    limits = Limits(LimitSettings())
    assert isinstance(limits.frame_gate(), OpenGate)
    assert all(limits.start_run("t", "u") == 0.0 for _ in range(1000))
    assert limits.subscription_allowed(10**6)
    assert limits.connections.acquire("x") is not None
    assert limits.pending_inputs_per_thread == 0


def test_subscription_allowance() -> None:
    limits = Limits(LimitSettings(subscriptions_per_connection=2))
    assert limits.subscription_allowed(1)
    assert not limits.subscription_allowed(2)


def test_limits_from_settings(tmp_path) -> None:
    settings = settings_for(
        tmp_path / "db.sqlite",
        frames_per_s=3,
        frame_burst=4,
        runs_per_minute=5,
        max_connections_per_user=6,
        max_subscriptions=7,
        max_pending_inputs=8,
    )
    limits = Limits.from_settings(settings)
    assert limits.settings == LimitSettings(3.0, 4, 5, 6, 7, 8)
    assert isinstance(limits.frame_gate(), FrameGate)


def test_every_limit_has_a_cli_flag(tmp_path) -> None:
    args = parser().parse_args(
        [
            "serve",
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
            "--frames-per-s",
            "2.5",
            "--frame-burst",
            "9",
            "--runs-per-minute",
            "4",
            "--max-connections-per-user",
            "3",
            "--max-subscriptions",
            "7",
            "--max-pending-inputs",
            "0",
            "--max-input-chars",
            "50",
        ]
    )
    settings = settings_from(args)
    assert (
        settings.frames_per_s,
        settings.frame_burst,
        settings.runs_per_minute,
        settings.max_connections_per_user,
        settings.max_subscriptions,
        settings.max_pending_inputs,
        settings.max_input_chars,
    ) == (2.5, 9, 4, 3, 7, 0, 50)


def test_production_defaults_are_on(monkeypatch) -> None:
    for name in (
        "FRAMES_PER_S",
        "FRAME_BURST",
        "RUNS_PER_MINUTE",
        "MAX_CONNECTIONS_PER_USER",
        "MAX_SUBSCRIPTIONS",
        "MAX_PENDING_INPUTS",
    ):
        monkeypatch.delenv(f"GATEWAY_{name}", raising=False)
    limits = Limits.from_settings(load_settings())
    assert limits.settings == LimitSettings(20.0, 100, 30, 20, 100, 10)


# -- usage reported by other processes ------------------------------------------------------------


def test_connections_reported_elsewhere_count_until_their_reports_stop() -> None:
    clock = FakeClock()
    changes: list[tuple[object, int]] = []
    counter = ConnectionCounter(2, clock, on_change=lambda key, n: changes.append((key, n)))
    alice = ("acme", "alice")
    counter.heard("gw-b", {alice: 1}, complete=True)
    slot = counter.acquire(alice)
    assert slot is not None and counter.acquire(alice) is None  # one here, one on gw-b
    assert changes == [(alice, 1)]
    # A partial report changes only the keys it names; a complete one replaces them all.
    counter.heard("gw-b", {("acme", "bob"): 1}, complete=False)
    assert counter.count_elsewhere(alice) == 1
    counter.heard("gw-b", {}, complete=True)
    assert counter.count_elsewhere(alice) == 0
    counter.heard("gw-c", {alice: 1}, complete=True)
    clock.advance(ConnectionCounter.REPORT_TTL_S)  # gw-c stopped reporting: it is gone
    assert counter.count_elsewhere(alice) == 0
    assert counter.acquire(alice) is not None
    slot.release()
    assert changes == [(alice, 1), (alice, 2), (alice, 1)]


def test_runs_started_elsewhere_fill_the_window_here() -> None:
    clock = FakeClock()
    limits = Limits(LimitSettings(runs_per_minute=2), clock)
    started: list[object] = []
    limits.on_run_started = started.append
    limits.run_started_elsewhere("acme", "alice")
    assert limits.start_run("acme", "alice") == 0.0
    assert limits.start_run("acme", "alice") == pytest.approx(60.0)
    assert started == [("acme", "alice")]  # only what this process admitted is reported
    clock.advance(60.0)
    assert limits.start_run("acme", "alice") == 0.0
