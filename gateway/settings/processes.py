"""Settings of several gateway processes on one database: instance ids, run leases, workers and
the bus that wakes them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, field_validator

from gateway.settings.group import SettingsGroup


class ProcessSettings(SettingsGroup):
    """How gateway processes that share a database tell each other apart, take over each other's
    runs and wake each other, and how `serve --workers` starts several on one port."""

    section_key: ClassVar[str] = "processes"
    section_title: ClassVar[str] = "several processes"

    instance_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            "This process's name in run leases (1-64 characters). Every process running on the same"
            " database at the same time needs its own id: a process started under an id another "
            "live process holds is refused (the id is claimed in the database and the claim "
            "renewed every second). A process that starts again under the same id takes over the"
            " runs its previous incarnation left active at once, without waiting for their leases"
            " to expire."
        ),
    )
    lease_ttl_s: float = Field(
        15.0,
        ge=1.0,
        le=3600.0,
        description=(
            "Lifetime of a run lease in seconds (1-3600). A streaming run's lease is renewed every "
            "third of it, and every process looks for expired leases every `GATEWAY_LEASE_SCAN_S`, "
            "so the runs of a process that died are taken over by another process within this value"
            " plus the scan interval (1.5 times this value by default); a process started again "
            "under the dead one's instance id takes them over at once."
        ),
    )
    lease_scan_s: float | None = Field(
        None,
        ge=0.1,
        le=3600.0,
        description=(
            "How often each process looks for runs whose lease expired (0.1-3600 s). Shorter: a "
            "dead process's runs go on elsewhere sooner, for one more read of the `runs` table per "
            "scan and process."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Gateway processes serving the port (1-64). Above 1, `serve` runs a supervisor that "
            "binds the port, migrates the schema once, and starts that many worker processes on it "
            "(on Linux each on a socket of its own in the port's SO_REUSEPORT group, so the kernel "
            "spreads connections over them), each with the instance id "
            "`<GATEWAY_INSTANCE_ID or host name:port>/<n>`; a worker that dies is started again "
            "under its id and takes its runs over at once; SIGTERM stops them all gracefully. In "
            "development mode the workers share one signing secret. Set `GATEWAY_BUS_URL` to Redis "
            "with several workers, or events cross between them at the log watch's pace. See "
            'docs/operations.md "Several processes on one machine".'
        ),
    )
    log_watch_interval_s: float = Field(
        0.5,
        ge=0.0,
        le=60.0,
        description=(
            "Seconds (0-60) between polls of the log heads of the threads this process has "
            "subscribers on, so that events written by other processes on the same database reach "
            "them. `0` turns polling off, which is fine for a single process per database."
        ),
    )
    bus_url: str = Field(
        "memory://",
        description=(
            "How gateway processes on one database wake each other: `memory://` (one process: "
            "nothing to tell) or a Redis URL (`redis://host:6379/0`, `rediss://…` for TLS; needs "
            "`pip install 'agents-ws-gateway[redis]'`). With Redis, a commit on one process reaches"
            " subscribers and inbox readers on every other at once; the log watch stays as the "
            "safety net while Redis is down."
        ),
    )
    bus_prefix: str = Field(
        "agents-gateway",
        min_length=1,
        max_length=128,
        description=(
            "Prefix of the Redis channel (`<prefix>:bus`): gateways with the same database and "
            "prefix hear each other; give each deployment sharing a Redis its own."
        ),
    )
    listen_fd: int | None = Field(
        None,
        ge=0,
        description=(
            "Set by the `serve --workers` supervisor for each worker: the listening socket it "
            "inherited. Not for setting by hand."
        ),
    )
    ready_fd: int | None = Field(
        None,
        ge=0,
        description=(
            "Set by the `serve --workers` supervisor for each worker it starts with the gateway "
            "(not for one it starts again): the pipe the worker writes to once it serves, which "
            "the supervisor waits for before it says the gateway runs. Not for setting by hand."
        ),
    )
    supervisor_pid: int | None = Field(
        None,
        ge=1,
        description=(
            "Set by the `serve --workers` supervisor for each worker: its own pid, so that a worker"
            " stops when the supervisor is gone. Not for setting by hand."
        ),
    )
    dev_secret: SecretStr | None = Field(
        None,
        description=(
            "Set by the `serve --workers` supervisor for each worker in development mode: the "
            "signing secret they share. Not for setting by hand."
        ),
    )

    @field_validator("bus_url")
    @classmethod
    def _known_bus(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in {"memory", "redis", "rediss", "unix"}:
            raise ValueError("must be memory:// or a Redis URL such as redis://127.0.0.1:6379/0")
        return value
