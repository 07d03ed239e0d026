"""The gateway's tables (SQLAlchemy Core).

Core rather than ORM: the hot paths (event appends, replays) are bulk statements, and the
repositories want explicit, reviewable SQL rather than identity-map behaviour.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

ID = String(64)
ACTIVE_RUN_SQL = "status NOT IN ('completed', 'failed', 'cancelled')"

threads = Table(
    "threads",
    metadata,
    Column("thread_id", ID, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("owner", String(128), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("metadata", JSON, nullable=False),
    Column("epoch", String(32), nullable=False),
    Column("head_seq", BigInteger, nullable=False, default=0),
    # Every event up to this seq was removed by retention; the log starts after it.
    Column("truncated_seq", BigInteger, nullable=False, default=0, server_default="0"),
    # What lists show: the first input unless renamed (null until the first run).
    Column("title", String(200), nullable=True),
    Column("archived_at", DateTime(timezone=True), nullable=True),
    # A deleted thread's row stays (its id is never reused), its conversation gone.
    Column("deleted_at", DateTime(timezone=True), nullable=True),
    Index("ix_threads_tenant_owner", "tenant", "owner"),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", ID, primary_key=True),
    Column("thread_id", ID, nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("owner", String(128), nullable=False),
    Column("status", String(32), nullable=False),
    Column("agent", String(128), nullable=False),
    Column("graph_version", String(64), nullable=False),
    Column("on_disconnect", String(16), nullable=False),
    Column("input", Text, nullable=False),
    Column("checkpoint_version", Integer, nullable=False, default=0),
    # How many SDK session items existed before this run wrote any: a run restarted from its
    # input after a crash trims the session back to this mark instead of duplicating history.
    Column("session_mark", Integer, nullable=False, default=0),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    # Fencing token: bumped on every acquisition; writes for the run carry the token they were
    # granted and are refused once another process has taken the lease.
    Column("lease_token", BigInteger, nullable=False, default=0, server_default="0"),
    Column("error", JSON, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # The user who started the run (or sent the input that started it): the "requester" that
    # the four-eyes rule keeps from deciding the run's approvals. Null for runs from before 0004.
    Column("requested_by", String(128), nullable=True),
    # When retention removed the ended run's checkpoints and events (null: not yet), so each
    # sweep looks only at runs it has not swept before.
    Column("swept_at", DateTime(timezone=True), nullable=True),
    # The roles and chosen token claims of whoever asked for the run, for its run context
    # (gateway/agents/run_caller.py): a continuation in any process describes the same caller.
    Column("caller", JSON, nullable=True),
    # The operation-ledger scope of the run's side effects (gateway/agents/exactly_once.py):
    # null for the run's own id; a retry of a failed run shares that run's scope, so what the
    # failed run already did is not done again.
    Column("ledger_scope", ID, nullable=True),
    Index("ix_runs_thread", "thread_id"),
    Index("ix_runs_status", "status"),
    Index(
        "uq_runs_one_active_per_thread",
        "thread_id",
        unique=True,
        sqlite_where=text(ACTIVE_RUN_SQL),
        postgresql_where=text(ACTIVE_RUN_SQL),
    ),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("run_id", ID, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("state", Text, nullable=False),
    Column("sdk_schema_version", String(16), nullable=False),
    Column("graph_name", String(128), nullable=False),
    Column("graph_version", String(64), nullable=False),
    Column("reason", String(16), nullable=False),
    # SDK session length when the state was taken (see runs.session_mark).
    Column("session_mark", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", ID, primary_key=True),
    Column("run_id", ID, nullable=False),
    Column("thread_id", ID, nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("checkpoint_version", Integer, nullable=False),
    Column("call_id", String(128), nullable=False),
    Column("tool_name", String(256), nullable=False),
    Column("agent", String(256), nullable=False),
    Column("arguments", JSON, nullable=False),
    Column("arguments_digest", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("reviewer", String(128), nullable=True),
    Column("reason", Text, nullable=True),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=True),
    # Past this instant the system rejects the approval (GATEWAY_APPROVAL_TTL_S; null: never).
    Column("expires_at", DateTime(timezone=True), nullable=True),
    # The arguments the reviewer approved the call with instead of `arguments` (null: as made).
    Column("edited_arguments", JSON, nullable=True),
    UniqueConstraint("run_id", "checkpoint_version", "call_id", name="uq_approvals_call"),
    Index("ix_approvals_tenant_status", "tenant", "status"),
    Index("ix_approvals_run", "run_id", "checkpoint_version"),
    Index("ix_approvals_status_expires", "status", "expires_at"),
)

events = Table(
    "events",
    metadata,
    Column("thread_id", ID, primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("run_id", ID, nullable=True),
    Column("type", String(64), nullable=False),
    Column("ts", String(32), nullable=False),
    # The event's data as compact JSON text, stored exactly as it is sent.
    Column("data", Text, nullable=False),
    # No index by run: each event would dirty a page of it at commit. A run's events are
    # read through the primary key, by its thread (runs are sequential on a thread).
)

pending_inputs = Table(
    "pending_inputs",
    metadata,
    Column("input_id", Integer, primary_key=True, autoincrement=True),
    Column("thread_id", ID, nullable=False),
    Column("run_id", ID, nullable=True),
    Column("input", Text, nullable=False),
    Column("disposition", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("consumed_at", DateTime(timezone=True), nullable=True),
    # Who sent it: the requester of the run a queued input starts (four-eyes). Null before 0005.
    Column("sender", String(128), nullable=True),
    # The sender's roles and chosen token claims, for the run a queued input starts (0007).
    Column("caller", JSON, nullable=True),
    Index("ix_pending_inputs_thread", "thread_id", "consumed_at"),
    sqlite_autoincrement=True,
)

operations = Table(
    "operations",
    metadata,
    Column("scope", ID, primary_key=True),
    Column("call_id", String(128), primary_key=True),
    Column("tool_name", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("result", Text, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)

# Who did what, when, from where: decisions, cancellations, token failures, access denials.
# Never removed by retention of run data.
audit = Table(
    "audit",
    metadata,
    Column("audit_id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("tenant", String(128), nullable=True),
    Column("actor", String(128), nullable=True),
    Column("action", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("target", String(128), nullable=True),
    Column("source", String(128), nullable=True),
    Column("details", JSON, nullable=False),
    Index("ix_audit_tenant_at", "tenant", "at"),
    Index("ix_audit_action", "action"),
    sqlite_autoincrement=True,
)

# Signed webhooks waiting to be delivered (gateway/event_log/webhook_dispatch.py): written in the
# transaction of the events they announce, one row per event and endpoint. A delivered row is
# deleted; one that exhausted its attempts stays, `failed`, for an operator to look at.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", Integer, primary_key=True, autoincrement=True),
    # The `Webhook-Id` receivers dedupe on: the same for every attempt and every endpoint.
    Column("message_id", ID, nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("type", String(64), nullable=False),
    # The request body exactly as signed and sent.
    Column("payload", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    # A dispatcher's claim: no other process attempts the row until it expires (a process
    # killed mid-delivery leaves its claims to expire).
    Column("claimed_by", String(96), nullable=True),
    Column("claim_expires_at", DateTime(timezone=True), nullable=True),
    Column("last_error", String(256), nullable=True),
    UniqueConstraint("message_id", "endpoint", name="uq_webhook_deliveries_message"),
    Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    sqlite_autoincrement=True,
)

# Which process runs under each instance id (persistence/instances.py): its incarnation token,
# renewed every second while it runs. Only the current incarnation takes the id's leases early.
instances = Table(
    "instances",
    metadata,
    Column("instance_id", ID, primary_key=True),
    Column("incarnation", String(32), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("beat_at", DateTime(timezone=True), nullable=False),
)

# Runs the operator's command line cancelled (`runs cancel`), which no gateway process has counted
# in its metrics yet (persistence/uncounted_cancels.py): the row is written in the transaction
# that cancels, and deleted by the one gateway process whose claim takes it.
uncounted_cancels = Table(
    "uncounted_cancels",
    metadata,
    Column("run_id", ID, primary_key=True),
    # The run's agent: the `agent` label it is counted under.
    Column("agent", String(128), nullable=False),
    Column("cancelled_at", DateTime(timezone=True), nullable=False),
)
