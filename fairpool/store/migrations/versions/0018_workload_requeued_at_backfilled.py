"""Workloads preempted before revision 0012 and still waiting: their requeued_at.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01

Written by hand. 0012 added requeued_at empty, so a workload preempted before it and still
queued waited from its submission, ahead of those queued after it was requeued, and held free
quota back from smaller ones as if it had waited all that time (helper-92). Such a row was
last written when it was requeued, or since by a reason (which only moves it later): its
updated_at. No workload event log holds the exact moment.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE workload SET requeued_at = updated_at "
        "WHERE status = 'queued' AND preemptions > 0 AND requeued_at IS NULL"
    )


def downgrade() -> None:
    """Nothing to undo: 0017's readers take requeued_at as they find it."""
