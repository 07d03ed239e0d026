"""Log truncation by retention: threads remember how far their log was cut.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("threads") as batch:
        batch.add_column(
            sa.Column("truncated_seq", sa.BigInteger, nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("truncated_seq")
