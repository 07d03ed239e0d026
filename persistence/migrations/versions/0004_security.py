"""Security: the audit trail, approval expiry and who asked for each run.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("audit_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=True),
        sa.Column("actor", sa.String(128), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("target", sa.String(128), nullable=True),
        sa.Column("source", sa.String(128), nullable=True),
        sa.Column("details", sa.JSON, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_tenant_at", "audit", ["tenant", "at"])
    op.create_index("ix_audit_action", "audit", ["action"])
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("requested_by", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("requested_by")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("expires_at")
    op.drop_index("ix_audit_action", table_name="audit")
    op.drop_index("ix_audit_tenant_at", table_name="audit")
    op.drop_table("audit")
