"""Runs keep the roles and chosen token claims of whoever asked for them, for the run context;
so do pending inputs, for the run a queued input starts.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("caller", sa.JSON, nullable=True))
    with op.batch_alter_table("pending_inputs") as batch:
        batch.add_column(sa.Column("caller", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pending_inputs") as batch:
        batch.drop_column("caller")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("caller")
