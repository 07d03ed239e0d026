"""The relay seam: what one gateway process tells the others that share its database.

The database is the source of truth; a relay only wakes readers, who then read from their
cursor (a thread's log) or from the tables (an inbox). So a message the relay drops or delays
can delay what a client sees, never lose it: the log watch (gateway/event_log/log_watch.py) reads
the heads of every watched thread at its interval as a safety net, and a relay that comes back
after an outage wakes every watcher once.

Messages (JSON objects, `kind` first):
- `wake`: `{"threads": {thread_id: head_seq}}`, after a commit grew those threads' logs;
- `inbox`: `{"tenant", "added": [approval_id], "removed": [approval_id]}`: approval ids only,
  so no tool arguments cross the relay; receivers read the rows;
- `threads`: `{"threads": [thread_id]}`: threads whose place in a thread list changed (a title,
  an archive or deletion, a run's status, pending approvals); receivers read the rows;
- `watch`: `{"threads": [thread_id], "gone": [thread_id]}`: the threads the sender has
  watchers on (repeated every few seconds, forgotten when not repeated) and those it no longer
  has: a run with `on_disconnect: "suspend"` is suspended only when no process has a watcher;
- `revoked`: `{"run_id"}`: the sender cancelled a run it does not stream and revoked its lease;
  the process streaming it stops at once (its writes are refused from then on anyway);
- `handover`: `{"run_ids": [run_id]}`: the sender is shutting down and left these runs
  (suspended at a turn boundary, or cut with their leases released): the others continue
  them at once rather than after the lease expiry or the sender's restart.

Backends, chosen by `GATEWAY_BUS_URL`: `memory://` (the default: one process, nothing to tell)
and `redis://host:port/db` (Redis pub/sub, for several processes; gateway/event_log/relay/redis.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.protocol.error_codes import CodedError

if TYPE_CHECKING:
    from gateway.observability.metrics import GatewayMetrics

# Handed every message another process published (never this process's own).
MessageHandler = Callable[[dict[str, Any]], None]
# Called when the relay is back after an outage: messages may have been missed meanwhile.
ReconnectHandler = Callable[[], None]


class RelayConfigError(CodedError, ValueError):
    """The bus URL cannot be used (unknown scheme, missing driver)."""


class Relay(ABC):
    @property
    def shared(self) -> bool:
        """Whether other processes hear this one (False for `memory://`)."""
        return True

    @abstractmethod
    async def start(self, on_message: MessageHandler, on_reconnect: ReconnectHandler) -> None: ...

    @abstractmethod
    def publish(self, message: dict[str, Any]) -> None:
        """Send `message` to the other processes, soon; never blocks, never raises (a message
        that cannot be sent is dropped: readers catch up from the database)."""

    @abstractmethod
    async def close(self) -> None: ...


class MemoryRelay(Relay):
    """One process: nobody else to tell."""

    @property
    def shared(self) -> bool:
        return False

    async def start(self, on_message: MessageHandler, on_reconnect: ReconnectHandler) -> None:
        return None

    def publish(self, message: dict[str, Any]) -> None:
        return None

    async def close(self) -> None:
        return None


def open_relay(
    url: str, *, prefix: str, instance_id: str, metrics: GatewayMetrics | None = None
) -> Relay:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        return MemoryRelay()
    if scheme in {"redis", "rediss", "unix"}:
        from gateway.event_log.relay.redis import RedisRelay

        return RedisRelay(url, prefix=prefix, instance_id=instance_id, metrics=metrics)
    raise RelayConfigError(f"unsupported bus URL scheme {scheme!r}: use memory:// or redis://")
