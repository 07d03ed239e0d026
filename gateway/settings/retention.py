"""Settings of retention: how long finished runs' checkpoints and events are kept."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gateway.settings.group import SettingsGroup


class RetentionSettings(SettingsGroup):
    """How long the checkpoints and the event log of finished runs are kept, and how often the
    older ones are removed."""

    section_key: ClassVar[str] = "retention"
    section_title: ClassVar[str] = "retention"

    retention_s: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Seconds (≥ 0) to keep the checkpoints and the event log of runs after they end; `0` "
            "keeps them forever. Older ones are removed by the retention sweep: the thread's log "
            "loses its beginning up to the last event of those runs, and the thread gets a new "
            "epoch (clients with an older cursor get `reset`). Runs, approvals, the operation "
            "ledger and the conversation history are kept."
        ),
    )
    retention_sweep_s: float = Field(
        3600.0,
        gt=0.0,
        description=(
            "Seconds (> 0) between retention sweeps; the first one runs one interval after start-"
            "up. Only used when `GATEWAY_RETENTION_S` is above 0."
        ),
    )
