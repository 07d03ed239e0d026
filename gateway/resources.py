"""The resources one running gateway shares, created in the app lifespan and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.abuse.limits import Limits
from gateway.agents.registry import AgentRegistry
from gateway.auth.access import TokenVerifier
from gateway.auth.audit_trail import AuditTrail
from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.tracing import Telemetry
from gateway.settings import Settings
from gateway.storage.health import StorageHealth
from persistence.store import Store

if TYPE_CHECKING:
    from gateway.run_lifecycle.manager import RunManager


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
