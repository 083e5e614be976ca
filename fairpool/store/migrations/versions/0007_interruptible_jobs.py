"""Pool trees: interruptible operations, and jobs interrupted for allocation_preemption_timeout.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22

Written by hand, like 0001: it does not import ``fairpool.store.schema``. Existing operations
become non-interruptible (what they were); existing jobs keep their status.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OLD_JOB_STATUSES = "'running', 'preempted', 'completed', 'aborted'"
_JOB_STATUSES = "'running', 'interrupting', 'preempted', 'completed', 'aborted'"


def upgrade() -> None:
    with op.batch_alter_table("tree_operation") as batch:
        # The server default only fills the existing rows; the application always sets it.
        batch.add_column(
            sa.Column("interruptible", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("tree_operation") as batch:
        batch.alter_column("interruptible", server_default=None)
    with op.batch_alter_table("tree_job") as batch:
        batch.add_column(
            sa.Column("interrupt_deadline", sa.DateTime(timezone=True), nullable=True)
        )
        batch.drop_constraint(op.f("ck_tree_job_status"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_finished_iff_not_running"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_preemptor_only_if_preempted"), type_="check")
        batch.create_check_constraint(
            op.f("ck_tree_job_status"), f"status IN ({_JOB_STATUSES})"
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_finished_iff_not_live"),
            "(status IN ('running', 'interrupting')) = (finished_at IS NULL)",
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_interrupting_has_deadline"),
            "status != 'interrupting' OR interrupt_deadline IS NOT NULL",
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_running_not_interrupted"),
            "status != 'running' OR interrupt_deadline IS NULL",
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_preemptor_only_if_preempted"),
            "preempted_by IS NULL OR status = 'preempted' OR interrupt_deadline IS NOT NULL",
        )


def downgrade() -> None:
    # Jobs still being interrupted are preempted now: the old schema has no such state.
    op.execute(
        "UPDATE tree_job SET status = 'preempted', finished_at = interrupt_deadline "
        "WHERE status = 'interrupting'"
    )
    op.execute(
        "UPDATE tree_job SET preempted_by = NULL "
        "WHERE status != 'preempted' AND preempted_by IS NOT NULL"
    )
    with op.batch_alter_table("tree_job") as batch:
        batch.drop_constraint(op.f("ck_tree_job_preemptor_only_if_preempted"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_running_not_interrupted"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_interrupting_has_deadline"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_finished_iff_not_live"), type_="check")
        batch.drop_constraint(op.f("ck_tree_job_status"), type_="check")
        batch.drop_column("interrupt_deadline")
        batch.create_check_constraint(
            op.f("ck_tree_job_status"), f"status IN ({_OLD_JOB_STATUSES})"
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_finished_iff_not_running"),
            "(status = 'running') = (finished_at IS NULL)",
        )
        batch.create_check_constraint(
            op.f("ck_tree_job_preemptor_only_if_preempted"),
            "preempted_by IS NULL OR status = 'preempted'",
        )
    with op.batch_alter_table("tree_operation") as batch:
        batch.drop_column("interruptible")
