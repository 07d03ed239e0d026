"""Run leases: which gateway process executes a run, with a fencing token.

A process acquires a run's lease before streaming it and renews it while it does. Every log
append and checkpoint for the run carries the (owner, token) it was granted; `fence_in` makes the
write fail once another process has taken the lease over, so a process that lost its lease
(paused for too long, partitioned) can never write into a run someone else now executes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction, utcnow
from persistence.direct import Direct
from persistence.slices import slices
from persistence.tables import runs

# Leases renewed per statement: well within every backend's limit on bound parameters.
RENEW_CHUNK = 400


class LeaseLost(RuntimeError):
    """This process no longer holds the run's lease; it must stop writing for the run."""


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    token: int


class LeaseRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def acquire(self, run_id: str, owner: str, ttl_s: float) -> Lease | None:
        """Take the lease if it is free, expired, or held by an earlier incarnation of `owner`.

        Owner ids are stable per gateway instance (GATEWAY_INSTANCE_ID), and one instance id
        runs one process at a time, so a lease already held by `owner` at acquisition time
        belongs to a process that died: it can be taken at once rather than after its expiry.
        """
        async with transaction(self._engine) as conn:
            return await self.acquire_in(conn, run_id, owner, ttl_s)

    @staticmethod
    async def acquire_in(
        conn: AsyncConnection, run_id: str, owner: str, ttl_s: float
    ) -> Lease | None:
        now = utcnow()
        token = (
            await conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == run_id,
                    or_(
                        runs.c.lease_owner.is_(None),
                        runs.c.lease_owner == owner,
                        runs.c.lease_expires_at < now,
                    ),
                )
                .values(
                    lease_owner=owner,
                    lease_expires_at=now + timedelta(seconds=ttl_s),
                    lease_token=runs.c.lease_token + 1,
                )
                .returning(runs.c.lease_token)
            )
        ).scalar_one_or_none()
        return None if token is None else Lease(run_id, owner, int(token))

    @staticmethod
    def acquire_direct(db: Direct, run_id: str, owner: str, ttl_s: float) -> Lease | None:
        """`acquire_in` on the direct path: the same conditional update."""
        now = utcnow()
        rows = db.execute(
            "UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_token = lease_token + 1"
            " WHERE run_id = ? AND (lease_owner IS NULL OR lease_owner = ?"
            " OR lease_expires_at < ?) RETURNING lease_token",
            (
                owner,
                db.value(runs.c.lease_expires_at, now + timedelta(seconds=ttl_s)),
                run_id,
                owner,
                db.value(runs.c.lease_expires_at, now),
            ),
        ).fetchall()
        return Lease(run_id, owner, int(rows[0][0])) if rows else None

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        async with transaction(self._engine) as conn:
            return lease in await self.renew_all_in(conn, [lease], ttl_s)

    @staticmethod
    async def renew_all_in(
        conn: AsyncConnection, leases: Sequence[Lease], ttl_s: float
    ) -> set[Lease]:
        """Extend every lease of `leases` that still holds; returns those (the rest are lost)."""
        expires = utcnow() + timedelta(seconds=ttl_s)
        held: set[Lease] = set()
        for chunk in slices(leases, RENEW_CHUNK):
            for owner, pairs in _by_owner(chunk).items():
                rows = await conn.execute(
                    update(runs)
                    .where(
                        runs.c.lease_owner == owner,
                        tuple_(runs.c.run_id, runs.c.lease_token).in_(pairs),
                    )
                    .values(lease_expires_at=expires)
                    .returning(runs.c.run_id, runs.c.lease_token)
                )
                held.update(Lease(run_id, owner, int(token)) for run_id, token in rows.all())
        return held

    @staticmethod
    def renew_all_direct(db: Direct, leases: Sequence[Lease], ttl_s: float) -> set[Lease]:
        """`renew_all_in` on the direct path: the same rows, one statement per owner and chunk."""
        expires = db.value(runs.c.lease_expires_at, utcnow() + timedelta(seconds=ttl_s))
        held: set[Lease] = set()
        for chunk in slices(leases, RENEW_CHUNK):
            for owner, pairs in _by_owner(chunk).items():
                values = ", ".join("(?, ?)" for _ in pairs)
                rows = db.execute(
                    "UPDATE runs SET lease_expires_at = ? WHERE lease_owner = ?"
                    f" AND (run_id, lease_token) IN (VALUES {values})"
                    " RETURNING run_id, lease_token",
                    (expires, owner, *(value for pair in pairs for value in pair)),
                ).fetchall()
                held.update(Lease(run_id, owner, int(token)) for run_id, token in rows)
        return held

    @staticmethod
    async def fence_in(conn: AsyncConnection, lease: Lease) -> None:
        """Inside a write transaction: fail unless `lease` is still the run's current lease.

        An UPDATE rather than a SELECT, so the row is locked until commit on every backend.
        """
        result = await conn.execute(
            update(runs)
            .where(
                runs.c.run_id == lease.run_id,
                runs.c.lease_owner == lease.owner,
                runs.c.lease_token == lease.token,
            )
            .values(lease_owner=lease.owner)
        )
        if result.rowcount != 1:
            raise LeaseLost(lease.run_id)

    @staticmethod
    def fence_direct(db: Direct, lease: Lease) -> None:
        """`fence_in` on the direct path."""
        if not holds(db.conn, lease):
            raise LeaseLost(lease.run_id)

    @staticmethod
    async def release_in(conn: AsyncConnection, lease: Lease) -> None:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == lease.run_id, runs.c.lease_token == lease.token)
            .values(lease_owner=None, lease_expires_at=None)
        )

    @staticmethod
    def release_direct(db: Direct, lease: Lease) -> None:
        db.execute(
            "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL"
            " WHERE run_id = ? AND lease_token = ?",
            (lease.run_id, lease.token),
        )


def holds(conn: sqlite3.Connection, lease: Lease) -> bool:
    """Inside a direct-path write transaction: is `lease` still the run's current lease?"""
    return lease in held_of(conn, [lease])


def held_of(conn: sqlite3.Connection, leases: Sequence[Lease]) -> set[Lease]:
    """Inside a direct-path write transaction: which of `leases` are still their run's current
    lease. One read for all of them: `BEGIN IMMEDIATE` already holds SQLite's write lock, so
    no other writer can change a lease before this transaction commits."""
    held: set[Lease] = set()
    for chunk in slices(leases, RENEW_CHUNK):
        marks = ", ".join("?" for _ in chunk)
        current = {
            run_id: (owner, token)
            for run_id, owner, token in conn.execute(
                f"SELECT run_id, lease_owner, lease_token FROM runs WHERE run_id IN ({marks})",
                [lease.run_id for lease in chunk],
            ).fetchall()
        }
        held.update(
            lease for lease in chunk if current.get(lease.run_id) == (lease.owner, lease.token)
        )
    return held


def _by_owner(leases: Sequence[Lease]) -> dict[str, list[tuple[str, int]]]:
    pairs: dict[str, list[tuple[str, int]]] = {}
    for lease in leases:
        pairs.setdefault(lease.owner, []).append((lease.run_id, lease.token))
    return pairs
