"""Pool trees (seed 003): cluster nodes, trees, their pools, operations and their jobs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29

Written by hand, like 0001: it does not import ``fairpool.store.schema``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_OPERATION_STATUSES = ("pending", "running", "completed", "aborted")
_JOB_STATUSES = ("running", "preempted", "completed", "aborted")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _time(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "cluster_node",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("resources", sa.JSON(), nullable=False),
        _time("created_at"),
        _time("last_preemption_at", nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cluster_node")),
    )
    op.create_table(
        "pool_tree",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        _time("created_at"),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pool_tree")),
    )
    op.create_table(
        "pool_tree_default",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("tree", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pool_tree_default")),
        sa.ForeignKeyConstraint(
            ["tree"], ["pool_tree.name"], ondelete="CASCADE",
            name=op.f("fk_pool_tree_default_tree_pool_tree"),
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_pool_tree_default_single_row")),
    )
    op.create_table(
        "tree_pool",
        sa.Column("tree", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("parent", sa.String(255), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("ephemeral_user", sa.String(255), nullable=True),
        _time("below_fair_share_since", nullable=True),
        _time("created_at"),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("tree", "name", name=op.f("pk_tree_pool")),
        sa.ForeignKeyConstraint(
            ["tree"], ["pool_tree.name"], ondelete="CASCADE",
            name=op.f("fk_tree_pool_tree_pool_tree"),
        ),
        sa.ForeignKeyConstraint(
            ["tree", "parent"], ["tree_pool.tree", "tree_pool.name"], ondelete="RESTRICT",
            name=op.f("fk_tree_pool_tree_tree_pool"),
        ),
        sa.CheckConstraint(
            "parent IS NULL OR parent != name", name=op.f("ck_tree_pool_not_its_own_parent")
        ),
    )
    final = _quoted(("completed", "aborted"))
    op.create_table(
        "tree_operation",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tree", sa.String(255), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("job_resources", sa.JSON(), nullable=False),
        sa.Column("job_count", sa.Integer(), nullable=False),
        sa.Column("gang", sa.Boolean(), nullable=False),
        sa.Column("weight", sa.String(64), nullable=False),
        sa.Column("resource_limits", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        _time("created_at"),
        _time("started_at", nullable=True),
        _time("finished_at", nullable=True),
        _time("updated_at"),
        _time("below_fair_share_since", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tree_operation")),
        sa.ForeignKeyConstraint(
            ["tree"], ["pool_tree.name"], ondelete="RESTRICT",
            name=op.f("fk_tree_operation_tree_pool_tree"),
        ),
        sa.CheckConstraint(
            f"status IN ({_quoted(_OPERATION_STATUSES)})", name=op.f("ck_tree_operation_status")
        ),
        sa.CheckConstraint("job_count >= 1", name=op.f("ck_tree_operation_job_count_positive")),
        sa.CheckConstraint(
            f"(status IN ({final})) = (finished_at IS NOT NULL)",
            name=op.f("ck_tree_operation_finished_iff_final"),
        ),
        sa.CheckConstraint(
            "status != 'running' OR started_at IS NOT NULL",
            name=op.f("ck_tree_operation_running_is_started"),
        ),
    )
    op.create_index(
        op.f("ix_tree_operation_tree_status_created_at_id"),
        "tree_operation",
        ["tree", "status", "created_at", "id"],
    )
    op.create_table(
        "tree_job",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("operation_id", sa.String(36), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _time("started_at"),
        _time("finished_at", nullable=True),
        sa.Column("preempted_by", sa.String(36), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tree_job")),
        sa.ForeignKeyConstraint(
            ["operation_id"], ["tree_operation.id"], ondelete="CASCADE",
            name=op.f("fk_tree_job_operation_id_tree_operation"),
        ),
        sa.ForeignKeyConstraint(
            ["preempted_by"], ["tree_operation.id"], ondelete="SET NULL",
            name=op.f("fk_tree_job_preempted_by_tree_operation"),
        ),
        sa.CheckConstraint(
            f"status IN ({_quoted(_JOB_STATUSES)})", name=op.f("ck_tree_job_status")
        ),
        sa.CheckConstraint(
            "(status = 'running') = (finished_at IS NULL)",
            name=op.f("ck_tree_job_finished_iff_not_running"),
        ),
        sa.CheckConstraint(
            "preempted_by IS NULL OR status = 'preempted'",
            name=op.f("ck_tree_job_preemptor_only_if_preempted"),
        ),
    )
    op.create_index(
        op.f("ix_tree_job_operation_id_status"), "tree_job", ["operation_id", "status"]
    )
    op.create_index(op.f("ix_tree_job_node_status"), "tree_job", ["node", "status"])


def downgrade() -> None:
    op.drop_index(op.f("ix_tree_job_node_status"), table_name="tree_job")
    op.drop_index(op.f("ix_tree_job_operation_id_status"), table_name="tree_job")
    op.drop_table("tree_job")
    op.drop_index(op.f("ix_tree_operation_tree_status_created_at_id"), table_name="tree_operation")
    op.drop_table("tree_operation")
    op.drop_table("tree_pool")
    op.drop_table("pool_tree_default")
    op.drop_table("pool_tree")
    op.drop_table("cluster_node")
