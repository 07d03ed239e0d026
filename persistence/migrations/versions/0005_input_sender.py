"""Who sent each pending input (the requester of the run a queued input starts), and an index
for the approval-expiry sweep.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pending_inputs") as batch:
        batch.add_column(sa.Column("sender", sa.String(128), nullable=True))
    op.create_index("ix_approvals_status_expires", "approvals", ["status", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_status_expires", table_name="approvals")
    with op.batch_alter_table("pending_inputs") as batch:
        batch.drop_column("sender")
