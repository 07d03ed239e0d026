"""Cancels of the operator's command line that no gateway process has counted in its metrics
yet (persistence/uncounted_cancels.py).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uncounted_cancels",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("uncounted_cancels")
