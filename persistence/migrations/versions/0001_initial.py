"""Initial schema: threads, runs, checkpoints, approvals, events, pending inputs, operations,
and the SDK's SQLAlchemySession tables (agent_sessions, agent_messages).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(64)
TS = sa.DateTime(timezone=True)
ACTIVE = "status NOT IN ('completed', 'failed', 'cancelled')"


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("thread_id", ID, primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("epoch", sa.String(32), nullable=False),
        sa.Column("head_seq", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_threads_tenant_owner", "threads", ["tenant", "owner"])
    op.create_table(
        "runs",
        sa.Column("run_id", ID, primary_key=True),
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("graph_version", sa.String(64), nullable=False),
        sa.Column("on_disconnect", sa.String(16), nullable=False),
        sa.Column("input", sa.Text, nullable=False),
        sa.Column("checkpoint_version", sa.Integer, nullable=False),
        sa.Column("session_mark", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", TS, nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_runs_thread", "runs", ["thread_id"])
    op.create_index("ix_runs_status", "runs", ["status"])
    # At most one active run per thread, enforced by the database itself.
    op.create_index(
        "uq_runs_one_active_per_thread",
        "runs",
        ["thread_id"],
        unique=True,
        sqlite_where=sa.text(ACTIVE),
        postgresql_where=sa.text(ACTIVE),
    )
    op.create_table(
        "checkpoints",
        sa.Column("run_id", ID, primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("sdk_schema_version", sa.String(16), nullable=False),
        sa.Column("graph_name", sa.String(128), nullable=False),
        sa.Column("graph_version", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("session_mark", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "approvals",
        sa.Column("approval_id", ID, primary_key=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("checkpoint_version", sa.Integer, nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("tool_name", sa.String(256), nullable=False),
        sa.Column("agent", sa.String(256), nullable=False),
        sa.Column("arguments", sa.JSON, nullable=False),
        sa.Column("arguments_digest", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reviewer", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("requested_at", TS, nullable=False),
        sa.Column("decided_at", TS, nullable=True),
        sa.UniqueConstraint("run_id", "checkpoint_version", "call_id", name="uq_approvals_call"),
    )
    op.create_index("ix_approvals_tenant_status", "approvals", ["tenant", "status"])
    op.create_index("ix_approvals_run", "approvals", ["run_id", "checkpoint_version"])
    op.create_table(
        "events",
        sa.Column("thread_id", ID, primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run_id", ID, nullable=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_index("ix_events_run", "events", ["run_id"])
    op.create_table(
        "pending_inputs",
        sa.Column("input_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("run_id", ID, nullable=True),
        sa.Column("input", sa.Text, nullable=False),
        sa.Column("disposition", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("consumed_at", TS, nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_pending_inputs_thread", "pending_inputs", ["thread_id", "consumed_at"])
    op.create_table(
        "operations",
        sa.Column("scope", ID, primary_key=True),
        sa.Column("call_id", sa.String(128), primary_key=True),
        sa.Column("tool_name", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
    )
    # The SDK's SQLAlchemySession tables, with the SDK's own definitions (agents 0.24), so that
    # conversation history lives in the same database and is created by the same migration.
    op.create_table(
        "agent_sessions",
        sa.Column("session_id", sa.String, primary_key=True),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=False),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.TIMESTAMP(timezone=False),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
    )
    op.create_table(
        "agent_messages",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id",
            sa.String,
            sa.ForeignKey("agent_sessions.session_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("message_data", sa.Text, nullable=False),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=False),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "idx_agent_messages_session_time", "agent_messages", ["session_id", "created_at"]
    )


def downgrade() -> None:
    for index, table in (
        ("idx_agent_messages_session_time", "agent_messages"),
        ("ix_pending_inputs_thread", "pending_inputs"),
        ("ix_events_run", "events"),
        ("ix_approvals_run", "approvals"),
        ("ix_approvals_tenant_status", "approvals"),
        ("uq_runs_one_active_per_thread", "runs"),
        ("ix_runs_status", "runs"),
        ("ix_runs_thread", "runs"),
        ("ix_threads_tenant_owner", "threads"),
    ):
        op.drop_index(index, table_name=table)
    for table in (
        "agent_messages",
        "agent_sessions",
        "operations",
        "pending_inputs",
        "events",
        "approvals",
        "checkpoints",
        "runs",
        "threads",
    ):
        op.drop_table(table)
