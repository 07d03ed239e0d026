"""A bounded, seeded kill -9 soak: many SIGKILLs at random points of many concurrent runs.

Several lanes drive runs at the same time, each from its own client connection (and its own
reviewer connection): approval runs on the `effects` agent (one approval-gated `charge` through
the operation ledger per run), long demo stories and multi-turn demo status runs (several runs
share a lane's demo thread). A killer task SIGKILLs the gateway at random moments — after a random
delay, after a random number of received events, when a given event type arrives, or right
after a decision — and restarts it on the same SQLite file. A second soak runs three gateways
on one PostgreSQL database and one Redis and kills one of them, chosen at random, each time
(restarting it under its instance id while the others serve). Every lane then reconnects (to a
gateway that is up),
re-subscribes with `after_seq` = the last seq it saw, re-sends decisions for approvals still
pending (GET /v1/approvals) and carries on until its run ends.

At the end: every run completed; the log of every thread is dense and holds every frame any client
received, unchanged; each lane received each of its threads' seqs exactly once across all its
reconnects; each approved `charge` has exactly one ledger row and ran at most once (and exactly
once unless a kill fell between the side effect and its ledger record, which the ledger reports
as `reconcile` by design); no thread has two `tool.output` events for one call_id.

The randomness is seeded (timing is not; GATEWAY_TEST_SEED=random draws another seed, printed
first, and GATEWAY_TEST_SEED=<n> replays it), the number of kills, runs and steps is bounded and
every wait has a timeout, so the test always stops by itself.

Part of the default run (about 2 and 1 min). On its own, with a summary line of what happened:
`python3 dev.py test tests/crash/test_soak.py -s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from persistence.ledger import OperationStatus
from tests.support.client import Client, ProtocolFailure
from tests.support.crash import (
    AGENTS_ARGS,
    TERMINAL,
    TIMEOUT,
    after_frame,
    assert_dense,
    charges,
    http,
    read_log,
    request_or_closed,
    token,
    ws_url,
)
from tests.support.gateway import GatewayProcess, spawn_gateway
from tests.support.postgres import postgres_database
from tests.support.redis import bus_prefix, require_redis
from tests.support.seeds import replay_hint, run_seed
from tests.support.storage import rows

SEED = run_seed()  # fixed unless GATEWAY_TEST_SEED says otherwise (tests/support/seeds.py)
CRASHES = 30
LANES = 5
MAX_RUNS_PER_LANE = 10
SOAK_DEADLINE_S = 300.0  # a hard stop for the whole kill phase; a healthy soak needs ~2.5 min
TRIGGER_CAP_S = 4.0  # a kill that waits for something that does not come fires anyway
DEMO_DELAY_MS = "8"  # a story (200+ words) then streams for a couple of seconds
# The per-test limit (pyproject.toml timeout) is below what a soak may take: its kill phase
# alone may run until SOAK_DEADLINE_S, then every lane settles and the logs are checked.
pytestmark = pytest.mark.timeout(2 * SOAK_DEADLINE_S)

STORY = "tell me a story"
STATUS = "status of 1, 2, 3, 4 and 5"
KINDS = ("effects", "story", "status")
KILL_ON_EVENTS = (
    "run.started",
    "message.started",
    "message.delta",
    "message.completed",
    "tool.called",
    "tool.output",
    "approval.requested",
    "run.paused",
    "approval.decided",
    "run.resumed",
    "run.recovered",
    "run.completed",
)
# Errors a client sees when the gateway dies under it (or is not up yet).
CRASH_ERRORS = (
    ConnectionError,
    OSError,
    TimeoutError,
    EOFError,
    websockets.exceptions.WebSocketException,
    httpx.HTTPError,
)


class Harness:
    """The gateway processes of the moment (one per slot, each with its generation), and the
    kill switch. One slot: a gateway killed and restarted on the same database. Several: as
    many processes on one database and one bus, one of them killed (and restarted under its
    slot's instance id) at a time, while clients use any that is up."""

    def __init__(self, workdir: Path, env: dict[str, str], slots: int = 1) -> None:
        self.workdir = workdir
        self.env = env
        self.gws: list[GatewayProcess | None] = [None] * slots
        self.generations = [0] * slots
        self.up = [False] * slots
        self.spawned: list[GatewayProcess] = []
        self.clients: list[Client] = []  # every live connection's user client (kill triggers)
        self.decisions = 0
        self.kills: list[str] = []
        self.stop_crashing = False
        self.restart_s: list[float] = []
        self.restarts: list[asyncio.Task[None]] = []
        self.spawning = 0

    @property
    def slots(self) -> int:
        return len(self.gws)

    def _spawn(self, slot: int) -> GatewayProcess:
        # Recorded from the spawning thread itself: if the soak is torn down meanwhile, the
        # thread still finishes and the process must not outlive the test.
        self.spawning += 1
        try:
            # One instance id per slot for every incarnation: a restarted gateway takes over
            # the runs of its dead predecessor at once instead of waiting for their leases.
            env = {**self.env, "GATEWAY_INSTANCE_ID": f"soak-gateway-{slot}"}
            gw = spawn_gateway(self.workdir, env=env, args=AGENTS_ARGS)
            self.spawned.append(gw)
            return gw
        finally:
            self.spawning -= 1

    async def start(self, slot: int) -> None:
        began = time.monotonic()
        gw = await asyncio.to_thread(self._spawn, slot)
        self.restart_s.append(time.monotonic() - began)
        self.gws[slot] = gw
        self.generations[slot] += 1
        self.up[slot] = True

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(slot) for slot in range(self.slots)))

    async def crash(self, slot: int, why: str) -> None:
        gw = self.gws[slot]
        assert gw is not None
        self.up[slot] = False  # first: every error from here on is the crash's doing
        gw.kill()
        where = f" (gateway {slot})" if self.slots > 1 else ""
        self.kills.append(f"{time.monotonic():.3f} {time.strftime('%H:%M:%S')} {why}{where}")
        if self.slots == 1:
            await self.start(slot)
        else:
            # The others serve meanwhile: the next kill need not wait for this restart.
            self.restarts.append(asyncio.create_task(self.start(slot)))

    async def victim(self, rng: random.Random) -> int:
        """The slot to kill next: the only one, or one of those up while another is up too
        (clients always have a gateway to go to)."""
        if self.slots == 1:
            return 0
        deadline = time.monotonic() + TIMEOUT
        while len(up := [slot for slot in range(self.slots) if self.up[slot]]) < 2:
            assert time.monotonic() < deadline, "the gateways did not come back"
            await asyncio.sleep(0.02)
        return rng.choice(up)

    def live(self, slot: int, generation: int) -> bool:
        return self.up[slot] and self.generations[slot] == generation

    async def pick(self, rng: random.Random) -> int:
        """A slot whose gateway is up, once one is."""
        deadline = time.monotonic() + TIMEOUT
        while not (up := [slot for slot in range(self.slots) if self.up[slot]]):
            assert time.monotonic() < deadline, "no gateway came back"
            await asyncio.sleep(0.02)
        return up[0] if len(up) == 1 else rng.choice(up)

    async def serving(self, slot: int, generation: int) -> None:
        """Until a gateway other than `slot`'s dead `generation` is up to connect to."""
        deadline = time.monotonic() + TIMEOUT
        while not any(
            self.up[other] and (other != slot or self.generations[other] > generation)
            for other in range(self.slots)
        ):
            assert time.monotonic() < deadline, "no gateway came back"
            await asyncio.sleep(0.02)

    @property
    def gw(self) -> GatewayProcess | None:
        """A gateway that is up, if any."""
        return next((gw for gw, up in zip(self.gws, self.up, strict=True) if up), None)

    async def received(
        self, predicate: Callable[[dict[str, Any]], bool], count: int, cap: float
    ) -> bool:
        """Wait until this generation's clients received `count` more events matching."""
        seen = {id(c): len(c.events) for c in self.clients}
        hits = 0
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline:
            for client in list(self.clients):
                start = seen.get(id(client), 0)
                new = client.events[start:]
                seen[id(client)] = start + len(new)
                hits += sum(1 for event in new if predicate(event))
                if hits >= count:
                    return True
            await asyncio.sleep(0.003)
        return False

    async def decided(self, cap: float) -> bool:
        base = self.decisions
        deadline = time.monotonic() + cap
        while self.decisions == base:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.003)
        return True

    def log_tail(self, chars: int = 6000) -> str:
        return "\n".join(
            f"--- gateway {slot} ---\n{gw.log()[-chars:]}"
            for slot, gw in enumerate(self.gws)
            if gw is not None
        )


@dataclass
class Run:
    lane: int
    number: int
    kind: str
    text: str
    agent: str | None
    thread_id: str | None = None
    run_id: str | None = None
    start_sent: bool = False
    outcome: str | None = None
    interruptions: int = 0
    note: str = ""


@dataclass
class Lane:
    index: int
    harness: Harness
    rng: random.Random
    runs: list[Run] = field(default_factory=list)
    user_clients: list[Client] = field(default_factory=list)  # in connection order
    reviewers: list[Client] = field(default_factory=list)
    user: Client | None = None
    reviewer: Client | None = None
    slot: int = 0  # the gateway this lane's clients are connected to, and its generation
    generation: int = 0
    demo_thread: str | None = None  # story and status runs of a lane share one thread
    decided: set[str] = field(default_factory=set)
    conflicts: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)  # printed when the soak fails

    def note(self, what: str) -> None:
        self.trace.append(f"{time.monotonic():.3f} s{self.slot}g{self.generation} {what}")

    # -- what this lane saw ---------------------------------------------------------------

    def received(self, thread_id: str) -> list[dict[str, Any]]:
        """Every event of the thread this lane received, across reconnects, in arrival order."""
        return [e for c in self.user_clients for e in c.events if e["thread_id"] == thread_id]

    def last_seq(self, thread_id: str) -> int:
        events = self.received(thread_id)
        return events[-1]["seq"] if events else 0

    def threads(self) -> list[str]:
        return list(dict.fromkeys(r.thread_id for r in self.runs if r.thread_id))

    # -- driving runs ---------------------------------------------------------------------

    async def main(self) -> None:
        while len(self.runs) < MAX_RUNS_PER_LANE:
            if self.runs and self.harness.stop_crashing:
                return
            number = len(self.runs)
            if number == 0:
                kind = KINDS[self.index % len(KINDS)]
            else:
                kind = self.rng.choice(("effects", "effects", "story", "status"))
            text = {
                "effects": f"charge lane {self.index} run {number}",
                "story": f"{STORY} for lane {self.index} run {number}",
                "status": STATUS,
            }[kind]
            run = Run(self.index, number, kind, text, "effects" if kind == "effects" else None)
            self.runs.append(run)
            await self.finish(run)

    async def finish(self, run: Run) -> None:
        for _ in range(CRASHES + 10):
            try:
                await self.advance(run)
                return
            except CRASH_ERRORS as exc:
                self.note(f"run {run.number}: {type(exc).__name__} {exc}")
                if self.harness.live(self.slot, self.generation):
                    # Not a crash: the gateway is up and this connection is current.
                    raise AssertionError(
                        f"lane {self.index} run {run.number} ({run.kind}, {run.run_id}): "
                        f"{type(exc).__name__}: {exc} while gateway {self.slot} generation "
                        f"{self.generation} was up (see its log)"
                    ) from exc
            run.interruptions += 1
            await self.drop_clients()
            await self.harness.serving(self.slot, self.generation)
        raise AssertionError(f"run {run} did not get through {CRASHES + 10} attempts")

    async def drop_clients(self) -> None:
        for client in (self.user, self.reviewer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 5)
        self.user = self.reviewer = None

    async def advance(self, run: Run) -> None:
        if self.user is None or not self.harness.live(self.slot, self.generation):
            await self.reconnect(run)
        user = self.user
        assert user is not None
        if run.thread_id is None:
            if run.kind != "effects" and self.demo_thread is not None:
                run.thread_id = self.demo_thread
            else:
                # A fresh thread per approval run: the `effects` graph reads the whole history.
                created = await request_or_closed(user, "thread.create")
                run.thread_id = created["thread_id"]
                if run.kind != "effects":
                    self.demo_thread = run.thread_id
        if run.run_id is None and run.start_sent:
            # The ack of run.start was lost in a crash: the run exists iff its run.started is
            # in the log, which `reconnect` has replayed up to the head.
            known = {r.run_id for r in self.runs if r.run_id}
            adopted = [
                e["run_id"]
                for e in self.received(run.thread_id)
                if e["event"] == "run.started" and e["run_id"] not in known
            ]
            assert len(adopted) <= 1, adopted
            if adopted:
                run.run_id = adopted[0]
                run.note += " adopted"
        if run.run_id is None:
            run.start_sent = True
            fields: dict[str, Any] = {"thread_id": run.thread_id, "input": run.text}
            if run.agent:
                fields["agent"] = run.agent
            ack = await request_or_closed(user, "run.start", **fields)
            assert ack["thread_id"] == run.thread_id, ack
            run.run_id = ack["run_id"]
        if run.kind == "effects":
            await self.redecide(run)

        run_id = run.run_id

        def wanted(frame: dict[str, Any]) -> bool:
            if frame.get("type") != "event" or frame["run_id"] != run_id:
                return False
            if frame["event"] in TERMINAL:
                return True
            return (
                frame["event"] == "approval.requested"
                and frame["data"]["approval_id"] not in self.decided
            )

        # The end may have arrived on an earlier connection (or in this one's replay) just
        # before a crash cut the steps above short.
        ended = [
            e
            for e in self.received(run.thread_id)
            if e["run_id"] == run_id and e["event"] in TERMINAL
        ]
        self.note(f"waiting for run {run.number} {run_id} (ended: {bool(ended)})")
        while True:
            frame = ended[0] if ended else await user.wait_for(wanted, TIMEOUT)
            if frame["event"] in TERMINAL:
                run.outcome = frame["event"]
                if run.outcome != "run.completed":
                    run.note += f" {frame['data']}\n{self.harness.log_tail()}"
                return
            await self.decide(frame["data"]["approval_id"])

    async def reconnect(self, run: Run) -> None:
        harness = self.harness
        self.slot = await harness.pick(self.rng)
        self.generation = harness.generations[self.slot]
        gw = harness.gws[self.slot]
        assert gw is not None
        self.user = self.reviewer = None
        user = await Client.connect(ws_url(gw), token(f"user{self.index}", "user"))
        self.user_clients.append(user)
        harness.clients.append(user)
        reviewer = await Client.connect(ws_url(gw), token(f"reviewer{self.index}", "reviewer"))
        self.reviewers.append(reviewer)
        self.user, self.reviewer = user, reviewer
        self.note("connected")
        for thread_id in dict.fromkeys(t for t in (self.demo_thread, run.thread_id) if t):
            await self.follow(thread_id)

    async def follow(self, thread_id: str) -> None:
        """Subscribe after the last seq this lane saw and wait until caught up with the head."""
        user = self.user
        assert user is not None
        after = self.last_seq(thread_id)
        mark = len(user.frames)
        await request_or_closed(user, "thread.subscribe", thread_id=thread_id, after_seq=after)
        subscribed = await user.wait_for(
            after_frame(
                mark,
                lambda f: f.get("type") == "subscribed" and f.get("thread_id") == thread_id,
            ),
            TIMEOUT,
        )
        assert subscribed["reset"] is False, (subscribed, after)
        head = subscribed["head_seq"]
        self.note(f"subscribed {thread_id} after {after} head {head}")
        assert head >= after, (subscribed, after)
        if head > after:
            await user.wait_for(
                lambda f: (
                    f.get("type") == "event" and f["thread_id"] == thread_id and f["seq"] >= head
                ),
                TIMEOUT,
            )
        self.note(f"caught up {thread_id}")

    async def redecide(self, run: Run) -> None:
        """Decide this run's approvals still pending (a decision may have died with the gateway)."""
        gw = self.harness.gws[self.slot]
        assert gw is not None
        async with http(gw, f"reviewer{self.index}", "reviewer") as client:
            response = await client.get("/v1/approvals")
        assert response.status_code == 200, response.text
        for approval in response.json()["approvals"]:
            if approval["run_id"] == run.run_id:
                await self.decide(approval["approval_id"])

    async def decide(self, approval_id: str) -> None:
        if approval_id in self.decided:
            return
        assert self.reviewer is not None
        try:
            ack = await request_or_closed(
                self.reviewer, "approval.decide", approval_id=approval_id, decision="approve"
            )
            assert ack["approval"]["status"] == "approved", ack
        except ProtocolFailure as exc:
            if exc.code != "conflict":
                raise
            # Our own decision whose ack died with the previous gateway; checked at the end.
            self.conflicts.append(f"{approval_id}: {exc}")
        self.decided.add(approval_id)
        self.harness.decisions += 1


async def killer(harness: Harness, rng: random.Random, idle: Callable[[], bool]) -> None:
    for number in range(CRASHES):
        if idle():
            break
        kind = rng.choices(("delay", "events", "event", "decision"), weights=(3, 3, 3, 2))[0]
        if kind == "delay":
            # Some kills land during recovery and reconnection, right after a restart.
            delay = rng.uniform(0.0, 0.5) if rng.random() < 0.3 else rng.uniform(0.5, 2.5)
            await asyncio.sleep(delay)
            why = f"after {delay:.2f}s"
        elif kind == "events":
            count = rng.randint(1, 150)
            hit = await harness.received(lambda e: True, count, TRIGGER_CAP_S)
            why = f"after {count} events" + ("" if hit else " (cap)")
        elif kind == "event":
            name = rng.choice(KILL_ON_EVENTS)
            hit = await harness.received(lambda e, name=name: e["event"] == name, 1, TRIGGER_CAP_S)
            why = f"on {name}" + ("" if hit else " (cap)")
        else:
            hit = await harness.decided(TRIGGER_CAP_S)
            delay = rng.choice((0.0, 0.0, rng.uniform(0.0, 0.05), rng.uniform(0.05, 0.3)))
            await asyncio.sleep(delay)
            why = f"{delay:.3f}s after a decision" + ("" if hit else " (cap)")
        await harness.crash(await harness.victim(rng), f"#{number + 1} {why}")
    harness.stop_crashing = True


def check_thread(lane: Lane, thread_id: str, events: list[dict[str, Any]], head: int) -> None:
    assert_dense(events)
    assert head == len(events), (thread_id, head, len(events))

    # Every frame the lane received, across all its reconnects: each seq exactly once, in
    # order, and identical to what the log holds now.
    received = lane.received(thread_id)
    seqs = [e["seq"] for e in received]
    if seqs != list(range(1, head + 1)):
        at = next((i for i, seq in enumerate(seqs) if seq != i + 1), len(seqs))
        raise AssertionError(
            f"lane {lane.index} thread {thread_id}: received {len(seqs)} events for head "
            f"{head}; first gap/repeat at position {at}: {seqs[max(0, at - 3) : at + 3]}"
        )
    for frame in received:
        assert frame == events[frame["seq"] - 1], (frame, events[frame["seq"] - 1])

    names = [e["event"] for e in events]
    assert "run.failed" not in names and "run.cancelled" not in names, names

    outputs = Counter(e["data"]["call_id"] for e in events if e["event"] == "tool.output")
    assert all(n == 1 for n in outputs.values()), f"{thread_id}: tool.output repeated {outputs}"

    # A started message ends exactly once: completed, or aborted (crash, pause).
    ends: Counter[str] = Counter()
    started: list[str] = []
    for e in events:
        if e["event"] == "message.started":
            started.append(e["data"]["message_id"])
        elif e["event"] in ("message.completed", "message.aborted"):
            ends[e["data"]["message_id"]] += 1
    assert len(started) == len(set(started)), started
    assert {m: ends[m] for m in started} == dict.fromkeys(started, 1), (thread_id, ends)
    assert set(ends) <= set(started), (thread_id, ends)

    # One run.started and one terminal event per run, the terminal one last.
    by_run: dict[str, list[str]] = {}
    for e in events:
        by_run.setdefault(e["run_id"], []).append(e["event"])
    for run_id, run_names in by_run.items():
        assert run_names[0] == "run.started", (run_id, run_names)
        assert run_names.count("run.started") == 1, (run_id, run_names)
        assert run_names[-1] == "run.completed", (run_id, run_names)
        assert sum(n in TERMINAL for n in run_names) == 1, (run_id, run_names)


async def test_soak_kill9_random_points(tmp_path: Path) -> None:
    """One gateway on a SQLite file, killed and restarted."""
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    await soak(tmp_path, database, slots=1)


async def test_soak_kill9_across_three_processes(tmp_path: Path) -> None:
    """Three gateways on one PostgreSQL database and one Redis; each kill takes down one of
    them, chosen at random, and clients use whichever are up."""
    async with postgres_database() as database:
        await soak(
            tmp_path,
            database,
            slots=3,
            env={"GATEWAY_BUS_URL": require_redis(), "GATEWAY_BUS_PREFIX": bus_prefix()},
        )


async def soak(
    tmp_path: Path, database: str, *, slots: int, env: dict[str, str] | None = None
) -> None:
    # Printed first, so a soak that fails says which seed to replay it with.
    print(f"\n[soak] {replay_hint()}")
    rng = random.Random(SEED)
    effects = tmp_path / "effects.jsonl"
    gateway_env = {
        "TEST_EFFECTS_FILE": str(effects),
        "GATEWAY_DEMO_DELAY_MS": DEMO_DELAY_MS,
        "GATEWAY_DATABASE_URL": database,
        **(env or {}),
    }
    harness = Harness(tmp_path, gateway_env, slots)
    lanes = [Lane(i, harness, random.Random(rng.random())) for i in range(LANES)]
    began = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    try:
        await harness.start_all()
        tasks = [asyncio.create_task(lane.main(), name=f"lane-{lane.index}") for lane in lanes]
        lanes_done = list(tasks)
        tasks.append(
            asyncio.create_task(
                killer(
                    harness, random.Random(rng.random()), lambda: all(t.done() for t in lanes_done)
                ),
                name="killer",
            )
        )
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), SOAK_DEADLINE_S)
        except BaseException:
            await report_failure(harness, lanes, began)
            raise
        soak_s = time.monotonic() - began
        (tmp_path / "soak-trace.txt").write_text(
            "\n".join(
                [
                    *harness.kills,
                    *(f"lane {lane.index}: {line}" for lane in lanes for line in lane.trace),
                ]
            )
        )
        gw = harness.gw
        assert gw is not None

        # -- every run completed ----------------------------------------------------------
        runs = [run for lane in lanes for run in lane.runs]
        unfinished = [r for r in runs if r.outcome != "run.completed"]
        assert not unfinished, unfinished
        async with http(gw, "auditor", "viewer") as auditor:
            for run in runs:
                view = (await auditor.get(f"/v1/runs/{run.run_id}")).json()["run"]
                assert view["status"] == "completed", (run, view)
            pending = (await http_get_approvals(gw)).json()["approvals"]
        assert pending == [], pending

        # -- logs against what the clients received ---------------------------------------
        logs: dict[str, list[dict[str, Any]]] = {}
        for lane in lanes:
            for thread_id in lane.threads():
                events, head = await read_log(gw, thread_id, page=97)
                check_thread(lane, thread_id, events, head)
                logs[thread_id] = events
        all_events = [e for events in logs.values() for e in events]

        # -- approvals and the operation ledger -------------------------------------------
        requested: dict[str, tuple[str, str]] = {}
        decisions: dict[str, list[str]] = {}
        for e in all_events:
            if e["event"] == "approval.requested":
                assert e["data"]["approval_id"] not in requested, e
                requested[e["data"]["approval_id"]] = (e["run_id"], e["data"]["call_id"])
            elif e["event"] == "approval.decided":
                decisions.setdefault(e["data"]["approval_id"], []).append(e["data"]["decision"])
        assert decisions == {a: ["approve"] for a in requested}, (requested, decisions)
        effect_runs = {r.run_id for r in runs if r.kind == "effects"}
        per_run = Counter(run_id for run_id, _ in requested.values())
        assert per_run == dict.fromkeys(effect_runs, 1), per_run
        approved_calls = set(requested.values())

        ledger = await rows(
            database, "SELECT scope, call_id, status FROM operations WHERE tool_name = ?", "charge"
        )
        charged = [
            {"scope": scope, "call_id": call, "status": status} for scope, call, status in ledger
        ]
        assert {(row["scope"], row["call_id"]) for row in charged} == approved_calls, charged
        assert len(charged) == len(approved_calls), charged
        statuses = Counter(row["status"] for row in charged)
        done_, reconcile_ = OperationStatus.DONE.value, OperationStatus.NEEDS_RECONCILIATION.value
        assert set(statuses) <= {done_, reconcile_}, statuses
        done, reconcile = statuses[done_], statuses[reconcile_]
        executed = charges(effects)
        # Each execution has its ledger record and none ran twice: a `done` row ran exactly
        # once; a row a kill left `started` (side effect maybe made, result not recorded) is
        # never re-run but reported for reconciliation.
        assert done <= executed <= done + reconcile, (executed, statuses)
        outputs_by_call = Counter(
            (e["run_id"], e["data"]["call_id"]) for e in all_events if e["event"] == "tool.output"
        )
        assert all(outputs_by_call[call] == 1 for call in approved_calls), outputs_by_call

        kinds = Counter(r.kind for r in runs)
        print(
            f"\n[soak] seed={SEED} gateways={slots} crashes={len(harness.kills)} runs={len(runs)} "
            f"(effects={kinds['effects']} story={kinds['story']} status={kinds['status']}) "
            f"threads={len(logs)} events={len(all_events)} "
            f"effects={executed} ledger_done={done} needs_reconciliation={reconcile} "
            f"interrupted_runs={sum(1 for r in runs if r.interruptions)} "
            f"adopted_starts={sum(1 for r in runs if 'adopted' in r.note)} "
            f"decide_conflicts={sum(len(lane.conflicts) for lane in lanes)} "
            f"restart_avg={sum(harness.restart_s) / len(harness.restart_s):.1f}s "
            f"soak={soak_s:.0f}s total={time.monotonic() - began:.0f}s"
        )
    finally:
        for task in tasks:
            task.cancel()
        for task in [*tasks, *harness.restarts]:
            with contextlib.suppress(BaseException):
                await task
        for lane in lanes:
            for client in (*lane.user_clients, *lane.reviewers):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 5)
        for _ in range(int(TIMEOUT * 10)):  # a restart still in flight in its thread
            if not harness.spawning:
                break
            await asyncio.sleep(0.1)
        for gw in harness.spawned:
            gw.kill()


async def http_get_approvals(gw: GatewayProcess) -> httpx.Response:
    async with http(gw, "auditor", "reviewer") as reviewer:
        return await reviewer.get("/v1/approvals")


async def report_failure(harness: Harness, lanes: list[Lane], began: float) -> None:
    """What a failed soak leaves for whoever debugs it (shown by pytest on failure)."""
    print(f"\n[soak] failed after {time.monotonic() - began:.0f}s; kills: {harness.kills}")
    gw = harness.gw
    for lane in lanes:
        for line in lane.trace[-40:]:
            print(f"[soak] lane {lane.index}: {line}")
        for run in lane.runs:
            print(f"[soak] {run}")
            if run.outcome is not None or run.run_id is None or gw is None:
                continue
            with contextlib.suppress(Exception):
                async with http(gw, "auditor", "viewer") as auditor:
                    view = (await auditor.get(f"/v1/runs/{run.run_id}")).json()
                print(f"[soak]   run view: {view}")
                events, _ = await read_log(gw, run.thread_id or "")
                for event in events[-12:]:
                    print(f"[soak]   {event['seq']} {event['event']} {event['data']}")
    print(f"--- gateway log ---\n{harness.log_tail()}")
