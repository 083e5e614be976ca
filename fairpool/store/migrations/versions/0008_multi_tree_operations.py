"""Pool trees: operations in several trees (YTsaurus ``pool_trees`` and
``scheduling_options_per_pool_tree``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22

Written by hand, like 0001: it does not import ``fairpool.store.schema``. An operation's tree,
pool, weight, resource_limits, starvation clock and (while live) reason move to one
``tree_operation_placement`` row per tree; every existing operation gets one, and its jobs
name that tree.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_FINAL = "'completed', 'aborted'"


def _time(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "tree_operation_placement",
        sa.Column("operation_id", sa.String(36), nullable=False),
        sa.Column("tree", sa.String(255), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("weight", sa.String(64), nullable=False),
        sa.Column("resource_limits", sa.JSON(), nullable=False),
        sa.Column("running", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        _time("below_fair_share_since", nullable=True),
        sa.PrimaryKeyConstraint(
            "operation_id", "tree", name=op.f("pk_tree_operation_placement")
        ),
        sa.ForeignKeyConstraint(
            ["operation_id"], ["tree_operation.id"], ondelete="CASCADE",
            name=op.f("fk_tree_operation_placement_operation_id_tree_operation"),
        ),
        sa.ForeignKeyConstraint(
            ["tree"], ["pool_tree.name"], ondelete="RESTRICT",
            name=op.f("fk_tree_operation_placement_tree_pool_tree"),
        ),
        sa.UniqueConstraint(
            "operation_id", "position",
            name=op.f("uq_tree_operation_placement_operation_id_position"),
        ),
        sa.CheckConstraint(
            "position >= 0", name=op.f("ck_tree_operation_placement_position_non_negative")
        ),
    )
    op.create_index(
        op.f("ix_tree_operation_placement_tree_pool"),
        "tree_operation_placement",
        ["tree", "pool"],
    )
    op.execute(
        "INSERT INTO tree_operation_placement (operation_id, tree, position, pool, weight, "
        "resource_limits, running, reason, below_fair_share_since) "
        "SELECT id, tree, 0, pool, weight, resource_limits, status = 'running', "
        f"CASE WHEN status IN ({_FINAL}) THEN NULL ELSE status_reason END, "
        "below_fair_share_since FROM tree_operation"
    )
    op.execute(f"UPDATE tree_operation SET status_reason = NULL WHERE status NOT IN ({_FINAL})")
    with op.batch_alter_table("tree_job") as batch:
        batch.add_column(sa.Column("tree", sa.String(255), nullable=True))
    op.execute(
        "UPDATE tree_job SET tree = "
        "(SELECT tree FROM tree_operation WHERE tree_operation.id = tree_job.operation_id)"
    )
    with op.batch_alter_table("tree_job") as batch:
        batch.alter_column("tree", existing_type=sa.String(255), nullable=False)
        batch.create_foreign_key(
            op.f("fk_tree_job_operation_id_tree_operation_placement"),
            "tree_operation_placement",
            ["operation_id", "tree"],
            ["operation_id", "tree"],
            ondelete="CASCADE",
        )
    op.drop_index(op.f("ix_tree_operation_tree_status_created_at_id"), table_name="tree_operation")
    with op.batch_alter_table("tree_operation") as batch:
        batch.drop_constraint(op.f("fk_tree_operation_tree_pool_tree"), type_="foreignkey")
        for column in ("tree", "pool", "weight", "resource_limits", "below_fair_share_since"):
            batch.drop_column(column)
        batch.create_check_constraint(
            op.f("ck_tree_operation_reason_only_if_final"),
            f"status_reason IS NULL OR status IN ({_FINAL})",
        )
    op.create_index(
        op.f("ix_tree_operation_status_created_at_id"),
        "tree_operation",
        ["status", "created_at", "id"],
    )


def downgrade() -> None:
    # Each operation keeps its first tree; jobs in its other trees go with the rest of it.
    op.execute(
        "DELETE FROM tree_job WHERE tree != (SELECT p.tree FROM tree_operation_placement p "
        "WHERE p.operation_id = tree_job.operation_id AND p.position = 0)"
    )
    op.drop_index(op.f("ix_tree_operation_status_created_at_id"), table_name="tree_operation")
    with op.batch_alter_table("tree_operation") as batch:
        batch.drop_constraint(op.f("ck_tree_operation_reason_only_if_final"), type_="check")
        batch.add_column(sa.Column("tree", sa.String(255), nullable=True))
        batch.add_column(sa.Column("pool", sa.String(255), nullable=True))
        batch.add_column(sa.Column("weight", sa.String(64), nullable=True))
        batch.add_column(sa.Column("resource_limits", sa.JSON(), nullable=True))
        batch.add_column(_time("below_fair_share_since", nullable=True))
    first = (
        "FROM tree_operation_placement p WHERE p.operation_id = tree_operation.id "
        "AND p.position = 0"
    )
    for column in ("tree", "pool", "weight", "resource_limits", "below_fair_share_since"):
        op.execute(f"UPDATE tree_operation SET {column} = (SELECT p.{column} {first})")
    op.execute(
        "UPDATE tree_operation SET status_reason = "
        f"(SELECT p.reason {first}) WHERE status NOT IN ({_FINAL})"
    )
    with op.batch_alter_table("tree_operation") as batch:
        for column, kind in (("tree", sa.String(255)), ("pool", sa.String(255)),
                             ("weight", sa.String(64)), ("resource_limits", sa.JSON())):
            batch.alter_column(column, existing_type=kind, nullable=False)
        batch.create_foreign_key(
            op.f("fk_tree_operation_tree_pool_tree"), "pool_tree", ["tree"], ["name"],
            ondelete="RESTRICT",
        )
    op.create_index(
        op.f("ix_tree_operation_tree_status_created_at_id"),
        "tree_operation",
        ["tree", "status", "created_at", "id"],
    )
    with op.batch_alter_table("tree_job") as batch:
        batch.drop_constraint(
            op.f("fk_tree_job_operation_id_tree_operation_placement"), type_="foreignkey"
        )
        batch.drop_column("tree")
    op.drop_index(
        op.f("ix_tree_operation_placement_tree_pool"), table_name="tree_operation_placement"
    )
    op.drop_table("tree_operation_placement")
