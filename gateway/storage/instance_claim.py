"""This process's claim on its instance id, held for as long as it serves
(persistence/instances.py says why and how)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from persistence.errors import StorageUnavailable
from persistence.instances import BEAT_S, Incarnation, InstanceClaims, silence
from persistence.store import Store

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def claimed_instance(store: Store, instance_id: str) -> AsyncIterator[Incarnation]:
    """Claim `instance_id` (raises `InstanceInUse` while another live process has it), renew
    the claim every `BEAT_S` in the background, and give it up on the way out."""
    claims = InstanceClaims(store)
    incarnation = Incarnation.new(instance_id)
    try:
        replaced = await claims.claim(incarnation)
    except BaseException:
        # Cancelled (or failed) after its row was written: not left claimed. Only this
        # incarnation's row is ever removed.
        with contextlib.suppress(Exception):
            await claims.release(incarnation)
        raise
    if replaced is not None:
        log.info(
            "instance id %r: its previous process stopped without a graceful shutdown (silent "
            "for %.1f s); this one takes over the runs it left",
            instance_id,
            silence(replaced).total_seconds(),
        )
    beating = asyncio.create_task(_beat(claims, incarnation), name="instance-claim")
    try:
        yield incarnation
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        try:
            await claims.release(incarnation)
        except Exception as exc:  # the next process then waits a few seconds, no more
            log.warning("could not give up instance id %r: %s", instance_id, exc)


async def _beat(claims: InstanceClaims, incarnation: Incarnation) -> None:
    while True:
        await asyncio.sleep(BEAT_S)
        try:
            held = await claims.beat(incarnation)
        except StorageUnavailable:
            continue  # the next beat tries again; leases stay fenced meanwhile
        except Exception:
            log.error("renewing the instance claim failed", exc_info=True)
            continue
        if not held:
            log.error(
                "instance id %r was taken by another process after this one went silent: "
                "this process takes no runs over from it; stop one of the two (each needs "
                "its own GATEWAY_INSTANCE_ID)",
                incarnation.instance_id,
            )
            return
