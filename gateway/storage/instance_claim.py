"""This process's claim on its instance id, held for as long as it serves
(persistence/instances.py says why and how)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from gateway.observability.log_fields import unbound_context
from persistence.errors import StorageUnavailable
from persistence.instances import BEAT_S, Claim, Incarnation, InstanceClaims, InstanceInUse, silence
from persistence.store import Store

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def claimed_instance(store: Store, instance_id: str) -> AsyncIterator[Incarnation]:
    """Claim `instance_id` (raises `InstanceInUse` while another live process has it), renew
    the claim every `BEAT_S` in the background, and give it up on the way out.

    A database that cannot be written at start-up (the gateway then starts and reports it,
    docs/operations.md "Storage health") leaves the id unclaimed: the claim is made in the
    background once writes work, and until then this process takes no run left under the id
    before its lease expires."""
    claims = InstanceClaims(store)
    incarnation = Incarnation.new(instance_id)
    held = False
    try:
        replaced = await claims.claim(incarnation)
        held = True
    except StorageUnavailable as exc:
        log.warning("instance id %r not claimed yet (%s); trying again", instance_id, exc)
    except BaseException:
        # Cancelled (or failed) after its row was written: not left claimed. Only this
        # incarnation's row is ever removed.
        with contextlib.suppress(Exception):
            await claims.release(incarnation)
        raise
    if held:
        _taken_over(instance_id, replaced)
    beating = asyncio.create_task(
        _beat(claims, incarnation, held), name="instance-claim", context=unbound_context()
    )
    try:
        yield incarnation
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        try:
            await claims.release(incarnation)
        except Exception as exc:  # the next process then waits a few seconds, no more
            log.warning("could not give up instance id %r: %s", instance_id, exc)


def _taken_over(instance_id: str, replaced: Claim | None) -> None:
    if replaced is not None:
        log.info(
            "instance id %r: its previous process stopped without a graceful shutdown (silent "
            "for %.1f s); this one takes over the runs it left",
            instance_id,
            silence(replaced).total_seconds(),
        )


async def _beat(claims: InstanceClaims, incarnation: Incarnation, held: bool) -> None:
    while True:
        await asyncio.sleep(BEAT_S)
        try:
            if not held:
                _taken_over(incarnation.instance_id, await claims.claim(incarnation))
                held = True
                log.info("instance id %r claimed", incarnation.instance_id)
                continue
            still = await claims.beat(incarnation)
        except StorageUnavailable:
            continue  # the next beat tries again; leases stay fenced meanwhile
        except InstanceInUse as exc:
            log.error("%s; this process takes no run under it over early", exc)
            return
        except Exception:
            log.error("renewing the instance claim failed", exc_info=True)
            continue
        if not still:
            log.error(
                "instance id %r was taken by another process after this one went silent: "
                "this process takes no runs over from it; stop one of the two (each needs "
                "its own GATEWAY_INSTANCE_ID)",
                incarnation.instance_id,
            )
            return
