"""The scheduler config (seed 004): applied versions, and the workloads routed by them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22

Written by hand, like 0001: it does not import ``fairpool.store.schema``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_RESOURCES = ("gpu", "cpu", "memory_gb", "tpu")
_STATUSES = ("queued", "admitted", "finished", "cancelled", "rejected", "failed")


def upgrade() -> None:
    op.create_table(
        "config_version",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rolled_back_from", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_config_version")),
        sa.ForeignKeyConstraint(
            ["rolled_back_from"], ["config_version.version"], ondelete="RESTRICT",
            name=op.f("fk_config_version_rolled_back_from_config_version"),
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_config_version_version_positive")),
        sa.CheckConstraint(
            "rolled_back_from IS NULL OR rolled_back_from < version",
            name=op.f("ck_config_version_rollback_to_older"),
        ),
    )
    statuses = ", ".join(f"'{status}'" for status in _STATUSES)
    op.create_table(
        "workload",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("requested_priority", sa.Integer(), nullable=True),
        *(sa.Column(key, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
          for key in _RESOURCES),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.String(255), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.Column("flavors", sa.JSON(), nullable=True),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("preemptions", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload")),
        sa.ForeignKeyConstraint(
            ["config_version"], ["config_version.version"], ondelete="RESTRICT",
            name=op.f("fk_workload_config_version_config_version"),
        ),
        sa.CheckConstraint(f"status IN ({statuses})", name=op.f("ck_workload_status")),
        *(sa.CheckConstraint(f"{key} >= 0", name=op.f(f"ck_workload_{key}_non_negative"))
          for key in _RESOURCES),
        sa.CheckConstraint(
            "requested_priority IS NULL OR requested_priority >= 0",
            name=op.f("ck_workload_requested_priority_non_negative"),
        ),
        sa.CheckConstraint(
            "status != 'admitted' OR (priority IS NOT NULL AND flavors IS NOT NULL "
            "AND admitted_at IS NOT NULL)",
            name=op.f("ck_workload_admitted_is_placed"),
        ),
        sa.CheckConstraint("preemptions >= 0", name=op.f("ck_workload_preemptions_non_negative")),
    )
    op.create_index(
        op.f("ix_workload_status_submitted_at_id"), "workload", ["status", "submitted_at", "id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_workload_status_submitted_at_id"), table_name="workload")
    op.drop_table("workload")
    op.drop_table("config_version")
