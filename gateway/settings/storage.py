"""Settings of the store: its database, its migrations, and its health."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from gateway.settings.group import SettingsGroup
from persistence.schema import DEFAULT_DATABASE_URL


class StorageSettings(SettingsGroup):
    """The database that holds threads, runs and approvals, how its schema is migrated, and what
    the gateway does when it fails or is damaged."""

    section_key: ClassVar[str] = "storage"
    section_title: ClassVar[str] = "storage"

    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description=(
            "The store: a SQLite file (`sqlite:///path`, also `sqlite+aiosqlite:///path`; not "
            "`:memory:`) or PostgreSQL (`postgresql://user:password@host:port/dbname`, also "
            "`postgresql+asyncpg://…`; needs `pip install 'agents-ws-gateway[postgres]'`). A "
            "relative SQLite path is relative to the working directory (`dev.py` runs from the "
            "project root), and its parent directory is created if needed. The schema is migrated "
            "at every start (unless `GATEWAY_MIGRATE=false`)."
        ),
    )
    migrate: bool = Field(
        True,
        description=(
            "Migrate the schema to this gateway's revision at start-up. Off (`false`, or `--no-"
            "migrate`), the gateway migrates nothing and refuses to start on any other revision, "
            "with one error line naming the database's revision and the one it needs: for "
            "deployments that migrate as a step of their own (`python -m gateway migrate`, or "
            "Alembic's command line on `persistence/alembic.ini`; see docs/operations.md \"Before "
            'the first start").'
        ),
    )
    storage_probe_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description=(
            "Seconds (0 < s ≤ 600) between the write probes that look whether storage is back after"
            ' a failure (docs/operations.md "Storage health"); no probe runs while storage is '
            "healthy."
        ),
    )
    allow_damaged_database: bool = Field(
        False,
        description=(
            "Start even when the SQLite file fails its integrity check at start-up; the damage is "
            "logged and `/readyz` answers 503. Off, such a file stops the gateway."
        ),
    )

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme.split("+", 1)[0] not in {"sqlite", "postgresql", "postgres"}:
            raise ValueError(
                "must be a SQLite or PostgreSQL URL such as sqlite:///./gateway.db "
                "or postgresql://user@host/dbname"
            )
        return value
