"""Instance claims: at most one live process per instance id.

Run leases name their holder by instance id (`GATEWAY_INSTANCE_ID`), and a process started under
an id takes the runs leased to that id at once, without waiting for the leases to expire: they
belonged to its previous incarnation, which died. That is only sound while no other live process
has the same id, and a second copy started by mistake (the same settings, the same default id)
would otherwise take over the first one's live runs. So each process claims its id at start-up
with an incarnation, a random token of its own, and beats (renews the claim) every `BEAT_S`
while it runs:

- no claim, or a claim whose beat is `SILENT_S` old: the process that held it stopped; the new
  incarnation takes the id, and with it the runs still leased to that id;
- a claim beating: another live process has the id; start-up is refused (`InstanceInUse`).
  A claim beaten less than `SILENT_S` ago is watched until it is that old, so a process that
  has just died is told apart from one that lives.

Only the id's current incarnation takes the id's leases before they expire (persistence/leases.py
checks it in the same statement), so a process that lost its claim (stalled for longer than
`SILENT_S` while another took the id) can never take a run from the one that replaced it.
A process that stops gracefully gives its claim up, so the next one starts at once.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import and_, bindparam, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.protocol.error_codes import CodedError
from persistence.clock import as_utc, utcnow
from persistence.prepared import Prepared
from persistence.tables import instances

if TYPE_CHECKING:
    from persistence.store import Store

# How often a process renews its claim, and how long a claim goes without a beat before it
# counts as its process's: three beats missed (a loop stalled that long is not serving either).
BEAT_S = 1.0
SILENT_S = 3.0


class InstanceInUse(CodedError, RuntimeError):
    """Another live process runs under this instance id."""

    def __init__(self, instance_id: str, started_at: datetime) -> None:
        super().__init__(
            f"another gateway process is running with instance id {instance_id!r} on this "
            f"database (started {started_at:%Y-%m-%d %H:%M:%S} UTC, still renewing its claim); "
            "each process needs its own GATEWAY_INSTANCE_ID (--instance-id), and its own port "
            "on one host"
        )
        self.instance_id = instance_id


@dataclass(frozen=True)
class Incarnation:
    """One process's claim on an instance id: the id and the process's own random token."""

    instance_id: str
    token: str

    @classmethod
    def new(cls, instance_id: str) -> Incarnation:
        return cls(instance_id, secrets.token_hex(8))


@dataclass(frozen=True)
class Claim:
    """An instance id's claim as its row holds it."""

    token: str
    started_at: datetime
    beat_at: datetime


class InstanceClaims:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def claim(
        self,
        incarnation: Incarnation,
        *,
        silent_s: float = SILENT_S,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> Claim | None:
        """Take the instance id for `incarnation`; returns the claim it replaced (a process
        that stopped without giving it up), None when there was none. Raises `InstanceInUse`
        while another process beats on it."""
        while True:
            found = await self._store.read(partial(_claim_of, instance_id=incarnation.instance_id))
            if found is None:
                try:
                    await self._store.write(partial(_insert, incarnation=incarnation))
                except IntegrityError:
                    continue  # another process claimed it meanwhile: look again
                return None
            if found.token == incarnation.token:
                return None
            quiet_for = (utcnow() - found.beat_at).total_seconds()
            if quiet_for < silent_s:
                # Beaten lately: watch it until it is `silent_s` old, by this process's clock.
                await sleep(silent_s - max(quiet_for, 0.0))
                again = await self._store.read(
                    partial(_claim_of, instance_id=incarnation.instance_id)
                )
                if again is not None and again != found:
                    raise InstanceInUse(incarnation.instance_id, again.started_at)
                if again is None:
                    continue
            taken = await self._store.write(partial(_replace, incarnation=incarnation, old=found))
            if taken:
                return found
            # Changed between the read and the swap: another process's claim; look again.

    async def beat(self, incarnation: Incarnation) -> bool:
        """Renew the claim; False when it is no longer this incarnation's (another process
        took the id after this one went silent)."""
        return bool(await self._store.write(partial(_beat, incarnation=incarnation)))

    async def release(self, incarnation: Incarnation) -> None:
        """Give the id up (a graceful stop): the next process under it starts at once."""
        await self._store.write(partial(_release, incarnation=incarnation))

    async def current(self, instance_id: str) -> Claim | None:
        return await self._store.read(partial(_claim_of, instance_id=instance_id))


_SELECT = Prepared(
    select(instances.c.incarnation, instances.c.started_at, instances.c.beat_at).where(
        instances.c.instance_id == bindparam("b_instance")
    )
)
_BEAT = Prepared(
    update(instances)
    .where(
        instances.c.instance_id == bindparam("b_instance"),
        instances.c.incarnation == bindparam("b_token"),
    )
    .values(beat_at=bindparam("b_now"))
)


def _claim_of(conn: Connection, instance_id: str) -> Claim | None:
    rows = _SELECT.rows(conn, {"b_instance": instance_id})
    if not rows:
        return None
    token, started_at, beat_at = rows[0]
    return Claim(token, as_utc(started_at) or utcnow(), as_utc(beat_at) or utcnow())


def _insert(conn: Connection, incarnation: Incarnation) -> None:
    now = utcnow()
    conn.execute(
        insert(instances).values(
            instance_id=incarnation.instance_id,
            incarnation=incarnation.token,
            started_at=now,
            beat_at=now,
        )
    )


def _replace(conn: Connection, incarnation: Incarnation, old: Claim) -> bool:
    """Compare-and-swap: the claim becomes `incarnation`'s only if it is still `old`."""
    now = utcnow()
    result = conn.execute(
        update(instances)
        .where(
            and_(
                instances.c.instance_id == incarnation.instance_id,
                instances.c.incarnation == old.token,
                instances.c.beat_at == old.beat_at,
            )
        )
        .values(incarnation=incarnation.token, started_at=now, beat_at=now)
    )
    return result.rowcount == 1


def _beat(conn: Connection, incarnation: Incarnation) -> int:
    return _BEAT.rowcount(
        conn,
        {"b_instance": incarnation.instance_id, "b_token": incarnation.token, "b_now": utcnow()},
    )


def _release(conn: Connection, incarnation: Incarnation) -> None:
    conn.execute(
        delete(instances).where(
            instances.c.instance_id == incarnation.instance_id,
            instances.c.incarnation == incarnation.token,
        )
    )


def silence(claim: Claim) -> timedelta:
    """How long ago the claim was last renewed."""
    return utcnow() - claim.beat_at
