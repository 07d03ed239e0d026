"""Retention marks the runs it has swept; the event log loses its run_id index.

Every stored event updated `ix_events_run`, a B-tree keyed by run: under many concurrent runs
each event dirtied a page of it of its own, about a quarter of a group commit's time. Its
only readers were retention, which asked of every ended run whether it still had events (now
`runs.swept_at`: a run is looked at once), and the reads of one run's events, which now go
through the primary key by thread.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_events_run", table_name="events")


def downgrade() -> None:
    op.create_index("ix_events_run", "events", ["run_id"])
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("swept_at")
