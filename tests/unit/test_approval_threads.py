"""The threads of approvals a process requested (gateway/run_lifecycle/context.py
`RunContext.requested`): remembered for its decisions, the newest `KNOWN_APPROVALS` of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.event_log.bus import EventBus
from gateway.run_lifecycle import context
from gateway.run_lifecycle.context import RunContext
from tests.support.storage import migrated_store


async def test_the_newest_approvals_threads_are_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context, "KNOWN_APPROVALS", 3)
    async with migrated_store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        wiring: Any = None  # what a RunContext hands on, unused by what is tested here
        ctx = RunContext(
            store=store,
            log=wiring,
            bus=EventBus(),
            registry=wiring,
            segments=wiring,
            instance_id="gw-1",
            lease_ttl_s=15.0,
        )
        ctx.requested([{"approval_id": f"ap_{n}", "thread_id": f"t_{n % 2}"} for n in range(4)])
        assert ctx.approval_thread("ap_0") is None  # the oldest, pushed out
        assert [ctx.approval_thread(f"ap_{n}") for n in (1, 2, 3)] == ["t_1", "t_0", "t_1"]
        assert ctx.approval_thread("ap_unknown") is None
