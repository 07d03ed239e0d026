"""The Store contract (persistence/store.py), run against every backend.

Each test gets its own database (`database_url`: a SQLite file, or a PostgreSQL database created
for it and dropped afterwards) and checks one promise the gateway builds on: dense seq under
concurrent writers from two processes, fencing, whole rollbacks, one winner of a compare-and-swap,
replay pages, retention cuts, lease takeover, and no deadlock between processes that commit
batches over overlapping threads.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from persistence import uncounted_cancels
from persistence.approvals import (
    ApprovalRecord,
    ApprovalRepository,
    ApprovalStatus,
    PauseApprovals,
)
from persistence.audit import AuditEntry, AuditQuery, AuditRepository
from persistence.backends import open_store
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.clock import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.events import FEW_THREADS, NewEvent, WithEvents
from persistence.inputs import Disposition, InputRepository
from persistence.instances import Incarnation, InstanceClaims, InstanceInUse
from persistence.leases import FencedBy, Lease, LeaseLost, LeaseRepository
from persistence.retention import RetentionRepository
from persistence.run_status import IllegalRunTransition
from persistence.runs import RunRecord, RunRepository, RunStatus
from persistence.session_marks import SessionMarks
from persistence.sessions import GatewaySession
from persistence.store import DatabaseConfigError, Part, PartStored, Store
from persistence.tables import checkpoints, events, runs, threads
from persistence.threads import ThreadRepository
from persistence.uncounted_cancels import UncountedCancels
from tests.support.storage import (
    expire_lease,
    insert_running_run,
    migrated_store,
    observed,
    running_run,
)

pytestmark = pytest.mark.both_backends

ROOT = Path(__file__).resolve().parents[2]
TS = "2026-01-01T00:00:00.000Z"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    async with migrated_store(database_url) as store:
        yield store


def an_approval(
    approval_id: str,
    run_id: str,
    thread_id: str,
    *,
    version: int = 1,
    status: ApprovalStatus = ApprovalStatus.PENDING,
    tenant: str = "t",
    arguments: dict[str, Any] | None = None,
) -> ApprovalRecord:
    """An approval of the run's checkpoint `version`, for a call of its own."""
    return ApprovalRecord(
        approval_id=approval_id,
        run_id=run_id,
        thread_id=thread_id,
        tenant=tenant,
        checkpoint_version=version,
        call_id=f"call_{approval_id}",
        tool_name="charge",
        agent="assistant",
        arguments=arguments or {},
        arguments_digest="d",
        status=status,
        reviewer=None,
        reason=None,
        requested_at=utcnow().replace(microsecond=0),
        decided_at=None,
    )


def event(thread_id: str, n: int = 0, lease: object = None) -> NewEvent:
    return NewEvent(thread_id, None, "test.event", TS, f'{{"n":{n}}}', lease)  # type: ignore[arg-type]


async def new_threads(store: Store, count: int) -> list[str]:
    repo = ThreadRepository(store)
    return [(await repo.create(tenant="acme", owner="alice")).thread_id for _ in range(count)]


async def seqs(store: Store, thread_id: str) -> list[int]:
    query = select(events.c.seq).where(events.c.thread_id == thread_id).order_by(events.c.seq)
    return await store.read(lambda conn: list(conn.execute(query).scalars()))


async def head(store: Store, thread_id: str) -> int:
    query = select(threads.c.head_seq).where(threads.c.thread_id == thread_id)
    return await store.read(lambda conn: int(conn.execute(query).scalar_one()))


def writer(database_url: str, batches: int, thread_ids: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.contract.writer", database_url, str(batches), *thread_ids],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


# -- the event log -----------------------------------------------------------------------


@pytest.mark.parametrize("thread_count", [1, FEW_THREADS + 3])
async def test_seq_stays_dense_with_two_writer_processes(
    store: Store, database_url: str, thread_count: int
) -> None:
    """Two processes and this one append to the same threads at once: every thread's seq is
    1..n with no gap and no repeat, and its head is n."""
    thread_ids = await new_threads(store, thread_count)
    batches = 60
    first = writer(database_url, batches, thread_ids)
    second = writer(database_url, batches, thread_ids[::-1])
    for n in range(batches):
        await store.append([event(t, n) for t in thread_ids])
        await asyncio.sleep(0)
    assert finish(first).strip() == f"done {batches * thread_count}"
    assert finish(second).strip() == f"done {batches * thread_count}"
    for thread_id in thread_ids:
        assert await seqs(store, thread_id) == list(range(1, 3 * batches + 1))
        assert await head(store, thread_id) == 3 * batches


async def test_processes_committing_over_overlapping_threads_do_not_deadlock(
    store: Store, database_url: str
) -> None:
    """Batches over the same many threads, named in opposite orders by two processes: heads
    are bumped in one stable order, so neither waits for the other forever (PostgreSQL would
    abort one of them with a deadlock error)."""
    thread_ids = await new_threads(store, 12)
    processes = [writer(database_url, 80, thread_ids), writer(database_url, 80, thread_ids[::-1])]
    outputs = [finish(p) for p in processes]
    assert outputs == ["done 960\n", "done 960\n"]
    for thread_id in thread_ids:
        assert await seqs(store, thread_id) == list(range(1, 161))


async def test_replay_reads_pages_in_order(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    for start in range(0, 1200, 300):
        await store.append([event(thread_id, n) for n in range(start, start + 300)])
    seen: list[int] = []
    after = 0
    while page := await store.read_events(thread_id, after_seq=after, limit=500):
        assert len(page) <= 500
        seen.extend(record.seq for record in page)
        after = page[-1].seq
    assert seen == list(range(1, 1201))
    last = await store.read_events(thread_id, after_seq=1195, limit=500)
    assert [(r.seq, r.data) for r in last] == [(s, f'{{"n":{s - 1}}}') for s in range(1196, 1201)]


async def test_a_batch_naming_a_missing_thread_stores_nothing(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    with pytest.raises(LookupError):
        await store.append([event(thread_id), event("t_missing")])
    with pytest.raises(LookupError):  # a batch on that one thread alone
        await store.append([event("t_missing"), event("t_missing", 1)])
    assert await seqs(store, thread_id) == []
    assert await head(store, thread_id) == 0


# -- fencing, atomic commits, compare-and-swap ---------------------------------------------


async def taken_over(store: Store, run_id: str) -> tuple[str, Lease, Lease]:
    """A running run on a new thread whose lease gw-a held, then gw-b took over once it
    expired (gw-a stalled): the thread, gw-a's lost lease and gw-b's."""
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, run_id, thread_id)
    leases = LeaseRepository(store)
    old = await leases.acquire(run_id, "gw-a", ttl_s=30)
    assert old is not None
    await expire_lease(store, run_id)
    new = await leases.acquire(run_id, "gw-b", ttl_s=30)
    assert new is not None
    return thread_id, old, new


async def test_fencing_refuses_a_lost_lease(store: Store) -> None:
    thread_id, old, new = await taken_over(store, "r_fenced")
    leases = LeaseRepository(store)
    assert new.token > old.token
    records, lost = await store.append(
        [event(thread_id, 1, old), event(thread_id, 2, new), event(thread_id, 3)]
    )
    assert lost == {old}
    assert [r.data for r in records] == ['{"n":2}', '{"n":3}']
    with pytest.raises(LeaseLost):
        await store.commit([event(thread_id, 4, old)], None)
    assert await seqs(store, thread_id) == [1, 2]
    assert await leases.renew_all([old, new], ttl_s=30) == {new}


async def test_an_atomic_commit_rolls_back_whole(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_atomic", thread_id)

    def change_then_fail(conn: object) -> None:
        RunRepository.transition_in(
            conn,  # type: ignore[arg-type]
            "r_atomic",
            RunStatus.COMPLETED,
            expected=(RunStatus.RUNNING,),
        )
        raise RuntimeError("the work fails after its first write")

    with pytest.raises(RuntimeError):
        await store.commit([event(thread_id)], change_then_fail)
    run = await RunRepository(store).get("r_atomic")
    assert run is not None and run.status is RunStatus.RUNNING
    assert await seqs(store, thread_id) == []
    assert await head(store, thread_id) == 0
    # An integrity error rolls back the same way and reaches the caller as itself.
    with pytest.raises(IntegrityError):
        await store.commit([event(thread_id)], lambda conn: insert_duplicate_run(conn, thread_id))
    assert await seqs(store, thread_id) == []
    # And the store goes on working.
    _, stored = await store.commit([event(thread_id)], None)
    assert [r.seq for r in stored] == [1]


async def test_an_atomic_commits_work_may_add_events_after_its_own(store: Store) -> None:
    """Work returning `WithEvents` decides in its transaction to store more events: they
    follow the commit's own, and its result is the commit's. Alone or as one part of a
    grouped transaction alike. Events so added that carry a lease are refused, nothing
    stored (the work fences what it writes itself)."""
    (thread_id,) = await new_threads(store, 1)

    def adding(count: int, lease: object = None) -> Callable[[Connection], WithEvents]:
        def work(conn: Connection) -> WithEvents:
            return WithEvents("added", [event(thread_id, 10 + n, lease) for n in range(count)])

        return work

    result, stored = await store.commit([event(thread_id, 1)], adding(2))
    assert result == "added"
    assert [(r.seq, r.data) for r in stored] == [(1, '{"n":1}'), (2, '{"n":10}'), (3, '{"n":11}')]
    outcomes = await store.commit_parts(
        [
            Part([event(thread_id, 2)], adding(1), None, atomic=True),
            Part([event(thread_id, 3)], None, None, atomic=False),
        ]
    )
    first, second = outcomes
    assert isinstance(first, PartStored) and isinstance(second, PartStored)
    assert first.result == "added"
    assert [r.data for r in first.records] == ['{"n":2}', '{"n":10}']
    assert [r.seq for r in second.records] == [6]
    lease = Lease("r_any", "gw-a", 1)
    with pytest.raises(ValueError, match="carry no lease"):
        await store.commit([event(thread_id, 4)], adding(1, lease))
    assert await seqs(store, thread_id) == [1, 2, 3, 4, 5, 6]


def insert_duplicate_run(conn: object, thread_id: str) -> None:
    values = {
        "run_id": "r_atomic",
        "thread_id": thread_id,
        "tenant": "acme",
        "owner": "alice",
        "status": "completed",
        "agent": "assistant",
        "graph_version": "1",
        "on_disconnect": "continue",
        "input": "again",
        "created_at": utcnow(),
        "updated_at": utcnow(),
    }
    conn.execute(runs.insert().values(**values))  # type: ignore[attr-defined]


async def test_compare_and_swap_picks_one_winner(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_cas", thread_id)
    repo = RunRepository(store)
    outcomes = await asyncio.gather(
        *(
            repo.transition("r_cas", RunStatus.WAITING_FOR_REVIEW, expected=(RunStatus.RUNNING,))
            for _ in range(12)
        )
    )
    assert outcomes.count(True) == 1
    run = await repo.get("r_cas")
    assert run is not None and run.status is RunStatus.WAITING_FOR_REVIEW


async def test_a_swap_returning_the_run_gives_the_row_as_it_left_it(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_swap", thread_id)

    def swap(conn: Connection) -> object:
        return RunRepository.transition_returning_in(
            conn, "r_swap", RunStatus.WAITING_FOR_REVIEW, expected=(RunStatus.RUNNING,)
        )

    moved = await store.write(swap)
    assert moved == await RunRepository(store).get("r_swap")
    assert moved is not None and moved.status is RunStatus.WAITING_FOR_REVIEW
    assert await store.write(swap) is None  # lost: the run is no longer running


async def test_an_approval_is_read_with_its_run_and_thread_in_one_statement(
    store: Store,
) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_ap", thread_id)
    pending = an_approval("ap_1", "r_ap", thread_id, tenant="acme", arguments={"amount": 5})
    await store.write(lambda conn: ApprovalRepository.insert_in(conn, [pending]))
    with observed(store) as seen:
        found = await store.read(
            partial(ApprovalRepository.with_run_and_thread_in, approval_id="ap_1")
        )
    # SQLite's per-connection settings aside.
    assert len([s for s in seen if not s.startswith("PRAGMA")]) == 1
    assert found == (
        await ApprovalRepository(store).get("ap_1"),
        await RunRepository(store).get("r_ap"),
        await ThreadRepository(store).get(thread_id),
    )
    assert found[0] is not None and found[0].arguments == {"amount": 5}
    missing = await store.read(
        partial(ApprovalRepository.with_run_and_thread_in, approval_id="ap_none")
    )
    assert missing == (None, None, None)
    await store.write(
        lambda conn: conn.execute(
            threads.update().where(threads.c.thread_id == thread_id).values(deleted_at=utcnow())
        )
    )
    approval, run, thread = await store.read(
        partial(ApprovalRepository.with_run_and_thread_in, approval_id="ap_1")
    )
    assert approval is not None and run is not None and thread is None  # a deleted thread


async def test_one_active_run_per_thread(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_first", thread_id)
    with pytest.raises(IntegrityError):
        await insert_running_run(store, "r_second", thread_id)


# -- leases ----------------------------------------------------------------------------


async def test_lease_takeover(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_lease", thread_id)
    leases = LeaseRepository(store)
    held = await leases.acquire("r_lease", "gw-a", ttl_s=0.5)
    assert held is not None
    assert await leases.acquire("r_lease", "gw-b", ttl_s=30) is None
    # The same owner name alone takes nothing: a live process may hold it.
    assert await leases.acquire("r_lease", "gw-a", ttl_s=0.5) is None
    # The id's current incarnation (a restarted process that claimed the id once the one
    # before it went silent) takes it back at once; any other incarnation waits.
    restarted, other = Incarnation.new("gw-a"), Incarnation.new("gw-a")
    await InstanceClaims(store).claim(restarted)
    assert await leases.acquire("r_lease", "gw-a", ttl_s=0.5, incarnation=other.token) is None
    again = await leases.acquire("r_lease", "gw-a", ttl_s=0.5, incarnation=restarted.token)
    assert again is not None and again.token == held.token + 1
    assert not await leases.renew(held, ttl_s=0.5)
    await asyncio.sleep(0.7)
    taken = await leases.acquire("r_lease", "gw-b", ttl_s=30)
    assert taken is not None and taken.owner == "gw-b" and taken.token == again.token + 1
    assert not await leases.renew(again, ttl_s=30)
    assert await leases.renew(taken, ttl_s=30)


async def test_a_continuation_takes_the_lease_and_the_status_in_one_statement(
    store: Store,
) -> None:
    """`take_lease_moving_in` takes the lease where `acquire_in` would and swaps the status
    where `transition_returning_in` would, both or neither: a live holder elsewhere, or a
    run not in an expected status, leaves the run as it was."""
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_take", thread_id)
    leases = LeaseRepository(store)
    held = await leases.acquire("r_take", "gw-a", ttl_s=30)
    assert held is not None

    async def take(owner: str, expected: RunStatus) -> tuple[Lease, RunRecord] | None:
        return await store.write(
            partial(
                RunRepository.take_lease_moving_in,
                run_id="r_take",
                to=RunStatus.WAITING_FOR_REVIEW,
                expected=(expected,),
                owner=owner,
                ttl_s=30,
                incarnation=None,
            )
        )

    with observed(store) as statements:
        assert await take("gw-b", RunStatus.RUNNING) is None  # gw-a's lease is live
    assert len([s for s in statements if "runs" in s]) == 1
    await expire_lease(store, "r_take")
    assert await take("gw-b", RunStatus.RESUMING) is None  # the run is running
    run = await RunRepository(store).get("r_take")
    assert run is not None and run.status is RunStatus.RUNNING
    taken = await take("gw-b", RunStatus.RUNNING)
    assert taken is not None
    lease, moved = taken
    # The refused takes changed no token.
    assert lease == Lease("r_take", "gw-b", held.token + 1)
    assert moved.status is RunStatus.WAITING_FOR_REVIEW and moved.run_id == "r_take"
    assert await leases.renew_all([held, lease], ttl_s=30) == {lease}


async def test_a_claim_takes_the_continuation_in_one_statement_and_trims_what_follows(
    store: Store,
) -> None:
    """`take_lease_moving_in` `through` a status makes two swaps in one, each checked as a
    move of its own (a paused run never moves to `running` directly), pinned to the
    checkpoint version; with `trim_session_after`, the run's session loses its messages after
    the mark, only if the take is made (PostgreSQL: in the same statement)."""
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_claim", thread_id)
    assert await store.write(
        partial(
            RunRepository.transition_in,
            run_id="r_claim",
            to=RunStatus.WAITING_FOR_REVIEW,
            expected=(RunStatus.RUNNING,),
        )
    )
    session = GatewaySession(thread_id, store=store)
    await session.add_items([{"role": "user", "content": "kept"}])
    mark = await SessionMarks(store).head(thread_id)
    await session.add_items([{"role": "assistant", "content": "after the mark"}])

    async def contents() -> list[str]:
        return [item["content"] for item in await session.get_items()]

    def claim(
        version: int, through: RunStatus | None = RunStatus.RESUMING
    ) -> partial[tuple[Lease, RunRecord] | None]:
        return partial(
            RunRepository.take_lease_moving_in,
            run_id="r_claim",
            to=RunStatus.RUNNING,
            expected=(RunStatus.WAITING_FOR_REVIEW,),
            through=through,
            checkpoint_version=version,
            trim_session_after=mark,
            owner="gw-a",
            ttl_s=30,
            incarnation=None,
        )

    with pytest.raises(IllegalRunTransition):
        await store.write(claim(0, through=None))
    assert await store.write(claim(1)) is None  # the run is at version 0
    assert await contents() == ["kept", "after the mark"]
    with observed(store) as statements:
        taken = await store.write(claim(0))
    assert taken is not None
    lease, moved = taken
    assert moved.status is RunStatus.RUNNING and lease.owner == "gw-a"
    changes = [s for s in statements if "runs" in s or "agent_messages" in s]
    assert len(changes) == (1 if store.backend == "postgresql" else 2)
    assert await contents() == ["kept"]
    assert await store.write(claim(0)) is None  # claimed once


async def test_a_pauses_approvals_come_with_the_runs_pending_ones_of_other_checkpoints(
    store: Store,
) -> None:
    """`of_pause_in`: the approvals of one checkpoint, decided or not, the ids of the run's
    approvals still pending at any other, and whether the run has input staged (other runs'
    input, queued input and consumed input are not), in one read."""
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_pause", thread_id)

    async def read(version: int) -> PauseApprovals:
        with observed(store) as statements:
            read = await store.read(
                partial(
                    ApprovalRepository.of_pause_in,
                    run_id="r_pause",
                    checkpoint_version=version,
                    thread_id=thread_id,
                )
            )
        assert len([s for s in statements if s.startswith("SELECT")]) == 1
        return read

    async def stage(run_id: str | None, disposition: Disposition) -> None:
        await store.write(
            partial(
                InputRepository.insert_in,
                thread_id=thread_id,
                run_id=run_id,
                text="more",
                disposition=disposition,
            )
        )

    assert await read(2) == PauseApprovals([], [], False)

    def approval(approval_id: str, version: int, status: ApprovalStatus) -> ApprovalRecord:
        return an_approval(approval_id, "r_pause", thread_id, version=version, status=status)

    made = [
        approval("ap_1", 1, ApprovalStatus.SUPERSEDED),
        approval("ap_2", 1, ApprovalStatus.PENDING),
        approval("ap_3", 2, ApprovalStatus.APPROVED),
        approval("ap_4", 2, ApprovalStatus.PENDING),
        approval("ap_5", 3, ApprovalStatus.PENDING),
    ]
    await store.write(lambda conn: ApprovalRepository.insert_in(conn, made))
    pause, elsewhere, staged = await read(2)
    assert [a.approval_id for a in pause] == ["ap_3", "ap_4"]
    assert elsewhere == ["ap_2", "ap_5"] and not staged
    assert pause == await ApprovalRepository(store).for_checkpoint("r_pause", 2)
    await stage("r_other", Disposition.STAGED)
    await stage(None, Disposition.QUEUED)
    assert not (await read(2)).staged_input
    await stage("r_pause", Disposition.STAGED)
    assert (await read(2)).staged_input
    (staged_input,) = await InputRepository(store).open(
        thread_id=thread_id, disposition=Disposition.STAGED, run_id="r_pause"
    )
    await store.write(partial(InputRepository.consume_in, input_ids=[staged_input.input_id]))
    assert not (await read(2)).staged_input
    assert (await read(7)).approvals == []


async def test_a_decision_and_its_audit_entry_are_recorded_together_or_not_at_all(
    store: Store,
) -> None:
    """`decide_in` with `audit` records the entry exactly when it records the decision (on
    PostgreSQL in the decision's own statement): a second decision of the same approval, or
    one at another checkpoint version, records neither."""
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_audit", thread_id)
    pending = an_approval("ap_audit", "r_audit", thread_id)
    await store.write(lambda conn: ApprovalRepository.insert_in(conn, [pending]))

    async def decide(version: int, reviewer: str) -> bool:
        entry = AuditEntry(action="approval.decide", outcome="approve", tenant="t", actor=reviewer)
        return await store.write(
            partial(
                ApprovalRepository.decide_in,
                approval_id="ap_audit",
                status=ApprovalStatus.APPROVED,
                reviewer=reviewer,
                reason=None,
                checkpoint_version=version,
                decided_at=utcnow(),
                audit=entry,
            )
        )

    async def actors() -> list[str | None]:
        page, _ = await AuditRepository(store).list_entries(AuditQuery(tenant="t"))
        return [entry.actor for entry in page]

    assert not await decide(2, "bob")
    with observed(store) as statements:
        assert await decide(1, "carol")
    writes = [s for s in statements if s.startswith(("UPDATE", "INSERT", "WITH"))]
    assert len(writes) == (1 if store.backend == "postgresql" else 2)
    assert not await decide(1, "dave")
    assert await actors() == ["carol"]
    approval = await ApprovalRepository(store).get("ap_audit")
    assert approval is not None and approval.reviewer == "carol"


async def test_an_instance_id_has_one_live_incarnation(store: Store) -> None:
    claims = InstanceClaims(store)
    first, second = Incarnation.new("gw-x"), Incarnation.new("gw-x")
    waited: list[float] = []

    async def watch(seconds: float) -> None:
        waited.append(seconds)
        assert await claims.beat(first)  # the first process is alive: it beats meanwhile

    assert await claims.claim(first) is None
    with pytest.raises(InstanceInUse, match="GATEWAY_INSTANCE_ID"):
        await claims.claim(second, silent_s=5.0, sleep=watch)
    assert waited and 0 < waited[0] <= 5.0
    current = await claims.current("gw-x")
    assert current is not None and current.token == first.token

    # Silent (it died without giving the id up): the next incarnation takes the id over, and
    # the first one's beat then tells it so.
    async def silent(seconds: float) -> None:
        waited.append(seconds)

    replaced = await claims.claim(second, silent_s=0.05, sleep=silent)
    assert replaced is not None and replaced.token == first.token
    assert not await claims.beat(first)
    assert await claims.beat(second)
    # Given up by a graceful stop: the next one claims it without watching.
    await claims.release(first)  # not its claim any more: changes nothing
    assert (await claims.current("gw-x")).token == second.token
    await claims.release(second)
    waited.clear()
    assert await claims.claim(first, sleep=silent) is None and not waited


# -- uncounted cancels ---------------------------------------------------------------------


async def record_cancels(store: Store, count: int) -> list[str]:
    """`count` uncounted cancels, each of an agent of its own (so a claim's agents tell which
    rows it took); their agents."""
    agents = [f"agent-{n:03}" for n in range(count)]

    def record(conn: Connection) -> None:
        for n, agent in enumerate(agents):
            uncounted_cancels.record_in(conn, f"r_cancel_{n:03}", agent)

    await store.write(record)
    return agents


async def test_a_claim_takes_each_uncounted_cancel_once(store: Store) -> None:
    agents = await record_cancels(store, 3)
    cancels = UncountedCancels(store)
    assert await cancels.waiting() == 3
    first = await cancels.claim(limit=2)
    rest = await cancels.claim()
    assert len(first) == 2 and sorted(first + rest) == agents
    assert await cancels.claim() == [] and await cancels.waiting() == 0


async def test_concurrent_claims_from_two_stores_never_share_a_cancel(
    store: Store, database_url: str
) -> None:
    """Two stores (as two processes would have: pools of their own) claim small batches at
    once until none is left: every cancel is claimed, and by one claim only."""
    agents = await record_cancels(store, 60)
    async with migrated_store(database_url) as other:

        async def drain(on: Store) -> list[str]:
            claimed: list[str] = []
            while batch := await UncountedCancels(on).claim(limit=3):
                claimed += batch
                await asyncio.sleep(0)
            return claimed

        claims = await asyncio.gather(*(drain(s) for s in (store, other, store, other)))
    taken = [agent for claimed in claims for agent in claimed]
    assert sorted(taken) == agents  # none lost, none twice
    assert await UncountedCancels(store).waiting() == 0


# -- retention -------------------------------------------------------------------------


async def test_retention_cuts_the_prefix_of_ended_runs(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    before = await ThreadRepository(store).get(thread_id)
    assert before is not None
    await insert_running_run(store, "r_old", thread_id)
    await store.append(
        [NewEvent(thread_id, "r_old", "test.event", TS, f'{{"n":{n}}}') for n in range(5)]
    )
    await RunRepository(store).transition(
        "r_old", RunStatus.COMPLETED, expected=(RunStatus.RUNNING,)
    )
    await insert_running_run(store, "r_live", thread_id)
    await store.append(
        [NewEvent(thread_id, "r_live", "test.event", TS, f'{{"n":{n}}}') for n in range(5, 8)]
    )
    result = await RetentionRepository(store).sweep(utcnow() + timedelta(seconds=1))
    assert (result.runs, result.threads, result.events) == (1, 1, 5)
    assert await seqs(store, thread_id) == [6, 7, 8]
    after = await ThreadRepository(store).get(thread_id)
    assert after is not None and after.truncated_seq == 5 and after.epoch != before.epoch
    again = await RetentionRepository(store).sweep(utcnow() + timedelta(seconds=1))
    assert (again.runs, again.events) == (0, 0)


# -- errors ----------------------------------------------------------------------------


async def test_an_unreachable_database_is_unavailable(database_url: str) -> None:
    """A store on a database that is not there answers `StorageUnavailable` (retry later)."""
    if database_url.startswith("sqlite"):
        url = "sqlite:////proc/no-such-dir/gateway.db"
        with pytest.raises((StorageUnavailable, OSError)):
            store = open_store(url)
            try:
                await store.ping()
            finally:
                await store.close()
        return
    store = open_store("postgresql://postgres@127.0.0.1:1/nothing")
    try:
        with pytest.raises(StorageUnavailable):
            await store.ping()
    finally:
        await store.close()


async def test_unknown_backends_are_refused() -> None:
    with pytest.raises(DatabaseConfigError):
        open_store("mysql://root@127.0.0.1/test")
    with pytest.raises(DatabaseConfigError):
        open_store("sqlite:///:memory:")


async def test_counts_agree(store: Store) -> None:
    """Reads see every committed write at once (no stale snapshot across calls)."""
    thread_ids = await new_threads(store, 3)
    for thread_id in thread_ids:
        await store.append([event(thread_id, n) for n in range(4)])
    query = select(func.count()).select_from(events)
    assert await store.read(lambda conn: conn.execute(query).scalar_one()) == 12


async def test_a_run_inserted_leased_holds_its_first_lease(store: Store) -> None:
    """As inserting the run and taking its lease would leave it: token 1, held by its owner
    (the fence lets its events in), refused to another process until it expires."""
    (thread_id,) = await new_threads(store, 1)
    record = running_run("r_leased", thread_id)
    lease = await store.write(
        lambda conn: RunRepository.insert_leased_in(conn, record, "gw-a", ttl_s=30)
    )
    assert lease == Lease("r_leased", "gw-a", 1)
    leased = await RunRepository(store).get_leased("r_leased")
    assert leased is not None and leased.run == record
    assert leased.lease is not None and leased.lease.owner == "gw-a"
    records, lost = await store.append([event(thread_id, 1, lease)])
    assert len(records) == 1 and not lost
    assert await LeaseRepository(store).acquire("r_leased", "gw-b", ttl_s=30) is None
    await expire_lease(store, "r_leased")
    taken = await LeaseRepository(store).acquire("r_leased", "gw-b", ttl_s=30)
    assert taken == Lease("r_leased", "gw-b", 2)


def checkpoint_of(run_id: str, version: int, reason: str = "turn") -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        version=version,
        state=f'{{"v":{version}}}',
        sdk_schema_version="1.0",
        graph_name="g",
        graph_version="1",
        reason=reason,
        session_mark=0,
        created_at=utcnow(),
    )


async def stored_checkpoints(store: Store, run_id: str) -> list[tuple[int, str, int]]:
    query = (
        select(checkpoints.c.version, checkpoints.c.reason, checkpoints.c.session_mark)
        .where(checkpoints.c.run_id == run_id)
        .order_by(checkpoints.c.version)
    )
    return await store.read(lambda conn: [tuple(row) for row in conn.execute(query)])


async def test_a_checkpoint_advances_the_run_prunes_older_ones_and_marks_the_history(
    store: Store,
) -> None:
    """A checkpoint moves the run's version (and status) from the one before, replaces the
    older versions, and takes the history's head read in its own transaction. On PostgreSQL
    that is one statement."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    await insert_running_run(store, "r_cp", thread_id)
    history = GatewaySession(thread_id, store=store)
    await history.add_items([{"role": "user", "content": "one"}])
    first = await store.write(
        lambda conn: CheckpointRepository.save_in(
            conn,
            checkpoint_of("r_cp", 1),
            status=RunStatus.RUNNING,
            expected=(RunStatus.RUNNING,),
            session_of=thread_id,
        )
    )
    await history.add_items([{"role": "assistant", "content": "two"}])
    head = await SessionMarks(store).head(thread_id)
    with observed(store) as statements:
        paused = await store.write(
            lambda conn: CheckpointRepository.save_in(
                conn,
                checkpoint_of("r_cp", 2, "approval"),
                status=RunStatus.WAITING_FOR_REVIEW,
                expected=(RunStatus.RUNNING,),
                session_of=thread_id,
            )
        )
    assert 0 < first.session_mark < head == paused.session_mark
    assert await stored_checkpoints(store, "r_cp") == [(2, "approval", head)]
    run = await RunRepository(store).get("r_cp")
    assert run is not None and run.status is RunStatus.WAITING_FOR_REVIEW
    assert run.checkpoint_version == 2
    if store.backend == "postgresql":
        assert len(statements) == 1 and "INSERT INTO checkpoints" in statements[0]


async def test_a_run_ends_with_its_final_state_in_one_step(store: Store) -> None:
    """The final status (and error) and the final state go together; a failed run keeps the
    boundary before it (a retry's), with the mark the record carries when no session is
    named. On PostgreSQL that is one statement."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    await insert_running_run(store, "r_end", thread_id)
    turn = checkpoint_of("r_end", 1)
    await store.write(
        lambda conn: CheckpointRepository.save_in(
            conn, turn, status=RunStatus.RUNNING, expected=(RunStatus.RUNNING,)
        )
    )
    final = replace(checkpoint_of("r_end", 2, "error"), session_mark=7)
    error = {"code": "model_error", "message": "the model failed"}
    with observed(store) as statements:
        await store.write(
            lambda conn: CheckpointRepository.add_final_in(
                conn, final, status=RunStatus.FAILED, error=error, keep_previous=True
            )
        )
    assert await stored_checkpoints(store, "r_end") == [(1, "turn", 0), (2, "error", 7)]
    run = await RunRepository(store).get("r_end")
    assert run is not None and run.status is RunStatus.FAILED and run.error == error
    assert run.checkpoint_version == 2
    if store.backend == "postgresql":
        assert len(statements) == 1
    # Ended, it takes no other final state.
    with pytest.raises(StaleWrite):
        await store.write(
            lambda conn: CheckpointRepository.add_final_in(
                conn, checkpoint_of("r_end", 3, "completed"), status=RunStatus.COMPLETED
            )
        )
    assert [v for v, _, _ in await stored_checkpoints(store, "r_end")] == [1, 2]


async def test_a_checkpoint_fenced_by_the_lease_refuses_a_lost_one_and_frees_a_held_one(
    store: Store,
) -> None:
    """Given the run's lease, a checkpoint's move is its own fence: after a takeover it is
    `LeaseLost` and nothing changes, even where the run is also stale (the fence comes
    first, as a read before the move would have found); held, it moves the run and, when it
    releases, frees the lease in the same step. An atomic commit of the run's events that
    does it (`FencedBy`) skips its own fencing read: on PostgreSQL a pause is then its move
    and its events, two statements."""
    thread_id, old, new = await taken_over(store, "r_fm")
    leases = LeaseRepository(store)
    for checkpoint in (checkpoint_of("r_fm", 1), checkpoint_of("r_fm", 5)):
        with pytest.raises(LeaseLost):
            await store.write(
                lambda conn, c=checkpoint: CheckpointRepository.save_in(
                    conn, c, status=RunStatus.RUNNING, expected=(RunStatus.RUNNING,), lease=old
                )
            )
    with pytest.raises(LeaseLost):
        await store.write(
            lambda conn: CheckpointRepository.add_final_in(
                conn, checkpoint_of("r_fm", 1, "completed"), status=RunStatus.COMPLETED, lease=old
            )
        )
    assert await stored_checkpoints(store, "r_fm") == []
    # Held, but stale: `StaleWrite`, and the lease stays.
    with pytest.raises(StaleWrite):
        await store.write(
            lambda conn: CheckpointRepository.save_in(
                conn,
                checkpoint_of("r_fm", 5),
                status=RunStatus.RUNNING,
                expected=(RunStatus.RUNNING,),
                lease=new,
                release=True,
            )
        )
    await store.write(
        lambda conn: CheckpointRepository.save_in(
            conn,
            checkpoint_of("r_fm", 1),
            status=RunStatus.RUNNING,
            expected=(RunStatus.RUNNING,),
            lease=new,
        )
    )
    assert await leases.renew_all([old, new], ttl_s=30) == {new}

    def pause(conn: Connection) -> CheckpointRecord:
        return CheckpointRepository.save_in(
            conn,
            checkpoint_of("r_fm", 2, "approval"),
            status=RunStatus.WAITING_FOR_REVIEW,
            expected=(RunStatus.RUNNING,),
            lease=new,
            release=True,
        )

    with observed(store) as statements:
        stored, records = await store.commit([event(thread_id, 1, new)], FencedBy(new, pause))
    assert stored.version == 2 and [r.seq for r in records] == [1]
    if store.backend == "postgresql":
        assert len(statements) == 2, statements
    run = await RunRepository(store).get("r_fm")
    assert run is not None and run.status is RunStatus.WAITING_FOR_REVIEW
    # Freed: another process takes it at once, and the old holder's next write is refused.
    assert await leases.acquire("r_fm", "gw-c", ttl_s=30) is not None
    with pytest.raises(LeaseLost):
        await store.commit([event(thread_id, 2, new)], None)
    assert await seqs(store, thread_id) == [1]


async def test_a_stale_checkpoint_stores_nothing(store: Store) -> None:
    """Not at the version before it, or not in an expected status: `StaleWrite`, and neither
    the run, the checkpoints nor the history's mark change."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    await insert_running_run(store, "r_stale", thread_id)
    await store.write(
        lambda conn: CheckpointRepository.save_in(
            conn,
            checkpoint_of("r_stale", 1),
            status=RunStatus.RUNNING,
            expected=(RunStatus.RUNNING,),
        )
    )
    for checkpoint, status, expected in (
        # Version 1 is stored already.
        (checkpoint_of("r_stale", 1), RunStatus.WAITING_FOR_REVIEW, RunStatus.RUNNING),
        # The run is running, not resuming.
        (checkpoint_of("r_stale", 2), RunStatus.RUNNING, RunStatus.RESUMING),
    ):
        with pytest.raises(StaleWrite):
            await store.write(
                lambda conn, c=checkpoint, s=status, e=expected: CheckpointRepository.save_in(
                    conn, c, status=s, expected=(e,), session_of=c.run_id
                )
            )
    assert await stored_checkpoints(store, "r_stale") == [(1, "turn", 0)]
    run = await RunRepository(store).get("r_stale")
    assert run is not None and run.status is RunStatus.RUNNING and run.checkpoint_version == 1
