"""Run leases: which gateway process executes a run, with a fencing token.

A process acquires a run's lease before streaming it and renews it while it does. Every log
append and checkpoint for the run carries the (owner, token) it was granted; the event log's
fencing read (`held_of_in`) and a checkpoint's move given the lease make the write fail once
another process has taken the lease over, so a process that lost its lease (paused for too
long, partitioned) can never write into a run someone else now executes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import and_, bindparam, or_, select, tuple_, update
from sqlalchemy.engine import Connection

from gateway.protocol.error_codes import CodedError
from persistence.clock import as_utc, utcnow
from persistence.prepared import Prepared, PreparedIn
from persistence.slices import slices
from persistence.tables import instances, runs

if TYPE_CHECKING:
    from persistence.store import Store

T = TypeVar("T")

# Leases renewed or checked per statement: well within every backend's limit on bound
# parameters.
RENEW_CHUNK = 400


class LeaseLost(CodedError, RuntimeError):
    """This process no longer holds the run's lease; it must stop writing for the run."""


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    token: int


@dataclass(frozen=True)
class FencedBy(Generic[T]):
    """A write that is fenced by `lease` itself: it raises `LeaseLost` when `lease` is no
    longer its run's current lease, and otherwise locks the run's row until the commit (a
    checkpoint's move given the lease does both). An atomic commit of the run's events
    (`persistence/events.py` `commit_in`) then skips its own fencing read of that lease: on
    PostgreSQL a round trip fewer, each a turn of a busy loop for the event log's writer."""

    lease: Lease
    work: Callable[[Connection], T]

    def __call__(self, conn: Connection) -> T:
        return self.work(conn)


def fenced(lease: Lease | None, work: Callable[[Connection], T]) -> Callable[[Connection], T]:
    """`work`, which is fenced by `lease` itself (`FencedBy`); as it is without a lease."""
    return work if lease is None else FencedBy(lease, work)


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a run's lease, as its row says: a process streams the run while the lease
    is live; an expired one belongs to a process that stopped (the lease scan takes it)."""

    owner: str
    expires_at: datetime

    def live(self, now: datetime) -> bool:
        return self.expires_at > now

    @classmethod
    def of(cls, owner: str | None, expires_at: datetime | None) -> LeaseHolder | None:
        """From a `runs` row's `lease_owner` and `lease_expires_at`; None for a free lease."""
        moment = as_utc(expires_at)
        return None if owner is None or moment is None else cls(owner, moment)


# The current lease of each run, locked against a takeover until the transaction ends
# (FOR SHARE on PostgreSQL; SQLite's writer already holds the database's write lock). In run id
# order, so concurrent fencing transactions lock the rows in one order.
_CURRENT = PreparedIn(
    "b_run",
    lambda one_of: (
        select(runs.c.run_id, runs.c.lease_owner, runs.c.lease_token)
        .where(one_of.of(runs.c.run_id))
        .order_by(runs.c.run_id)
        .with_for_update(read=True)
    ),
)
_CURRENT_OF_ONE = Prepared(
    select(runs.c.lease_owner, runs.c.lease_token)
    .where(runs.c.run_id == bindparam("b_run"))
    .with_for_update(read=True)
)


def held_of_in(conn: Connection, leases: Sequence[Lease]) -> set[Lease]:
    """Inside a write transaction: which of `leases` are still their run's current lease.
    One read for all of them, and no other writer can change them before this commits."""
    held: set[Lease] = set()
    if len(leases) == 1:
        # The usual case (one run's events): without the IN list SQLAlchemy renders anew at
        # every execution.
        (lease,) = leases
        current = _CURRENT_OF_ONE.rows(conn, {"b_run": lease.run_id})
        return {lease} if current and current[0] == (lease.owner, lease.token) else held
    ordered = sorted(leases, key=lambda lease: lease.run_id)
    rows = _CURRENT.rows(conn, [lease.run_id for lease in ordered])
    by_run = {run_id: (owner, token) for run_id, owner, token in rows}
    held.update(
        lease for lease in ordered if by_run.get(lease.run_id) == (lease.owner, lease.token)
    )
    return held


def lost_in(conn: Connection, leases: set[Lease]) -> set[Lease]:
    """Inside a write transaction: which of `leases` are no longer their run's current lease."""
    return leases - held_of_in(conn, list(leases)) if leases else set()


class LeaseRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def acquire(
        self, run_id: str, owner: str, ttl_s: float, incarnation: str | None = None
    ) -> Lease | None:
        """Take the lease if it is free, expired, or held by an earlier incarnation of `owner`.

        Owner ids are stable per gateway instance (GATEWAY_INSTANCE_ID). A lease already held
        by `owner` is taken at once, rather than after its expiry, only by the id's current
        incarnation (`incarnation`, the token of this process's claim on the id,
        persistence/instances.py): a process claims the id only once the one before it went
        silent, so such a lease belongs to a process that died. Without an incarnation, or
        with one that lost its claim, it waits for the expiry like any other process.
        """
        return await self._store.write(
            partial(
                self.acquire_in, run_id=run_id, owner=owner, ttl_s=ttl_s, incarnation=incarnation
            )
        )

    @staticmethod
    def acquire_in(
        conn: Connection, run_id: str, owner: str, ttl_s: float, incarnation: str | None = None
    ) -> Lease | None:
        taken = _ACQUIRE.rows(conn, taking_params(run_id, owner, ttl_s, incarnation))
        return Lease(run_id, owner, int(taken[0][0])) if taken else None

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        return lease in await self.renew_all([lease], ttl_s)

    async def renew_all(self, leases: Sequence[Lease], ttl_s: float) -> set[Lease]:
        return await self._store.write(partial(self.renew_all_in, leases=leases, ttl_s=ttl_s))

    @staticmethod
    def renew_all_in(conn: Connection, leases: Sequence[Lease], ttl_s: float) -> set[Lease]:
        """Extend every lease of `leases` that still holds; returns those (the rest are lost).
        In run id order, like every statement that locks run rows."""
        expires = utcnow() + timedelta(seconds=ttl_s)
        held: set[Lease] = set()
        ordered = sorted(leases, key=lambda lease: lease.run_id)
        for chunk in slices(ordered, RENEW_CHUNK):
            for owner, pairs in _by_owner(chunk).items():
                rows = conn.execute(
                    _RENEW, {"b_owner": owner, "b_pairs": pairs, "b_expires": expires}
                )
                held.update(Lease(run_id, owner, int(token)) for run_id, token in rows)
        return held

    @staticmethod
    def release_in(conn: Connection, lease: Lease) -> None:
        _RELEASE.rowcount(conn, {"b_run": lease.run_id, "b_token": lease.token})

    @staticmethod
    def release_owned_in(conn: Connection, owner: str, run_ids: Sequence[str]) -> None:
        """Inside a write transaction: free the leases `owner` still holds on these runs (a
        process shutting down, whose streams have stopped), so another takes them at once."""
        _RELEASE_OWNED.many(conn, [{"b_run": run_id, "b_owner": owner} for run_id in run_ids])

    @staticmethod
    def live_holder_in(conn: Connection, run_id: str) -> LeaseHolder | None:
        """Inside a write transaction: the process streaming the run, if its lease is live;
        the row stays locked until the transaction ends, so nobody takes the lease meanwhile."""
        rows = _HOLDER.rows(conn, {"b_run": run_id})
        holder = LeaseHolder.of(*rows[0]) if rows else None
        return holder if holder is not None and holder.live(utcnow()) else None

    @staticmethod
    def revoke_in(conn: Connection, run_id: str) -> None:
        """Inside a write transaction: take the run's lease from whoever holds it (a new token,
        no owner), so a holder on another process fails its next fenced write (`LeaseLost`)
        and stops; used when the run ends without its holder (a cancel from elsewhere)."""
        _REVOKE.rowcount(conn, {"b_run": run_id})


# Whether the lease may be taken: free, expired, or held by an earlier incarnation of the same
# owner while the caller is the owner's current incarnation (see `acquire`).
TAKEABLE = or_(
    runs.c.lease_owner.is_(None),
    runs.c.lease_expires_at < bindparam("b_now"),
    and_(
        runs.c.lease_owner == bindparam("b_owner"),
        select(instances.c.instance_id)
        .where(
            instances.c.instance_id == bindparam("b_owner"),
            instances.c.incarnation == bindparam("b_incarnation"),
        )
        .exists(),
    ),
)
# What taking it writes: the holder, its expiry and the next token.
TAKEN: Mapping[str, Any] = MappingProxyType(
    {
        "lease_owner": bindparam("b_owner"),
        "lease_expires_at": bindparam("b_expires"),
        "lease_token": runs.c.lease_token + 1,
    }
)
_ACQUIRE = Prepared(
    update(runs)
    .where(runs.c.run_id == bindparam("b_run"), TAKEABLE)
    .values(**TAKEN)
    .returning(runs.c.lease_token)
)


def taking_params(
    run_id: str, owner: str, ttl_s: float, incarnation: str | None
) -> dict[str, object]:
    """The parameters of `TAKEABLE` and `TAKEN` (and the run's, `b_run`)."""
    now = utcnow()
    return {
        "b_run": run_id,
        "b_owner": owner,
        "b_incarnation": incarnation,
        "b_now": now,
        "b_expires": now + timedelta(seconds=ttl_s),
    }


_RENEW = (
    update(runs)
    .where(
        runs.c.lease_owner == bindparam("b_owner"),
        tuple_(runs.c.run_id, runs.c.lease_token).in_(bindparam("b_pairs", expanding=True)),
    )
    .values(lease_expires_at=bindparam("b_expires"))
    .returning(runs.c.run_id, runs.c.lease_token)
)
_RELEASE = Prepared(
    update(runs)
    .where(runs.c.run_id == bindparam("b_run"), runs.c.lease_token == bindparam("b_token"))
    .values(lease_owner=None, lease_expires_at=None)
)


_RELEASE_OWNED = Prepared(
    update(runs)
    .where(runs.c.run_id == bindparam("b_run"), runs.c.lease_owner == bindparam("b_owner"))
    .values(lease_owner=None, lease_expires_at=None)
)
_HOLDER = Prepared(
    select(runs.c.lease_owner, runs.c.lease_expires_at)
    .where(runs.c.run_id == bindparam("b_run"))
    .with_for_update()
)
_REVOKE = Prepared(
    update(runs)
    .where(runs.c.run_id == bindparam("b_run"))
    .values(lease_owner=None, lease_expires_at=None, lease_token=runs.c.lease_token + 1)
)


def _by_owner(leases: Sequence[Lease]) -> dict[str, list[tuple[str, int]]]:
    pairs: dict[str, list[tuple[str, int]]] = {}
    for lease in leases:
        pairs.setdefault(lease.owner, []).append((lease.run_id, lease.token))
    return pairs
