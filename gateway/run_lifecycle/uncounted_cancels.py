"""Counting the cancels of the operator's command line (docs/operations.md "Metrics").

`runs cancel` stores `run.cancelled` from a process of its own, which counts nothing, and
leaves the cancel in the `uncounted_cancels` table (persistence/uncounted_cancels.py). Every
gateway process that counts metrics claims what is there at start-up and at each lease scan
(gateway/run_lifecycle/recovery.py) and counts what it claimed: a claim deletes the rows it
takes, so each cancel is counted once, by one process, however many share the database. A
process without metrics claims nothing, leaving the cancels to one that counts them.
"""

from __future__ import annotations

from gateway.observability.metrics import GatewayMetrics
from persistence.store import Store
from persistence.uncounted_cancels import CLAIM_BATCH, UncountedCancels


async def count_uncounted_cancels(store: Store, metrics: GatewayMetrics | None) -> int:
    """Claim and count every cancel left uncounted; how many this process counted."""
    if metrics is None:
        return 0
    cancels = UncountedCancels(store)
    counted = 0
    while True:
        # Counted batch by batch: a claim that fails later loses none already claimed.
        agents = await cancels.claim()
        for agent in agents:
            metrics.cancelled_elsewhere(agent)
        counted += len(agents)
        if len(agents) < CLAIM_BATCH:
            return counted
