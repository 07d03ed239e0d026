"""The resources one running gateway shares, created in the app lifespan and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.audit import AuditTrail
from gateway.auth import TokenVerifier
from gateway.bus import EventBus
from gateway.eventlog import EventLog
from gateway.limits import Limits
from gateway.metrics import GatewayMetrics
from gateway.registry import AgentRegistry
from gateway.settings import Settings
from gateway.storage_health import StorageHealth
from gateway.telemetry import Telemetry
from persistence.store import Store

if TYPE_CHECKING:
    from gateway.runs import RunManager


@dataclass
class Services:
    settings: Settings
    store: Store
    bus: EventBus
    log: EventLog
    registry: AgentRegistry
    runs: RunManager
    verifier: TokenVerifier
    limits: Limits
    audit: AuditTrail
    storage: StorageHealth
    server_name: str
    server_version: str
    metrics: GatewayMetrics | None = None
    telemetry: Telemetry = field(default_factory=lambda: Telemetry(None))
    # Open WebSocket connections, so shutdown can close them (`CloseCode.RESTART`).
    connections: set[Any] = field(default_factory=set)
