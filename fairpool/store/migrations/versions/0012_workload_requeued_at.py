"""A workload's requeued_at: when it was last preempted and queued again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29

Written by hand. A preempted workload waits from its requeue, not its submission: counted
from its submission, one that had run for longer than backfill_after held free quota back
from smaller workloads the moment it was requeued.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.add_column(sa.Column("requeued_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.drop_column("requeued_at")
