"""Initial schema.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Written by hand and frozen: it must not import ``fairpool.store.schema``, which moves on with
later revisions. Every constraint is named as the metadata's naming convention names it.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _time(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "component",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_component")),
        sa.UniqueConstraint("name", "type", name=op.f("uq_component_name_type")),
        sa.CheckConstraint(
            "type IN ('orchestrator', 'step_operator')", name=op.f("ck_component_type")
        ),
    )
    op.create_table(
        "pool",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        _time("created_at"),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pool")),
        sa.UniqueConstraint("name", name=op.f("uq_pool_name")),
    )
    op.create_table(
        "pool_resource",
        sa.Column("pool_id", sa.String(36), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool_id", "key", name=op.f("pk_pool_resource")),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pool.id"], name=op.f("fk_pool_resource_pool_id_pool"), ondelete="CASCADE"
        ),
        sa.CheckConstraint("total > 0", name=op.f("ck_pool_resource_total_positive")),
    )
    op.create_table(
        "policy",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("pool_id", sa.String(36), nullable=False),
        sa.Column("component_id", sa.String(36), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        _time("created_at"),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy")),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pool.id"], name=op.f("fk_policy_pool_id_pool"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["component_id"],
            ["component.id"],
            name=op.f("fk_policy_component_id_component"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("component_id", "pool_id", name=op.f("uq_policy_component_id_pool_id")),
        sa.CheckConstraint("priority >= 0", name=op.f("ck_policy_priority_non_negative")),
    )
    op.create_table(
        "policy_resource",
        sa.Column("policy_id", sa.String(36), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("reserved", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("limit", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("policy_id", "key", name=op.f("pk_policy_resource")),
        sa.ForeignKeyConstraint(
            ["policy_id"],
            ["policy.id"],
            name=op.f("fk_policy_resource_policy_id_policy"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("reserved >= 0", name=op.f("ck_policy_resource_reserved_non_negative")),
        sa.CheckConstraint(
            '"limit" IS NULL OR "limit" >= reserved',
            name=op.f("ck_policy_resource_limit_covers_reserved"),
        ),
    )
    op.create_table(
        "request",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("component_id", sa.String(36), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("max_retries", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("previous_attempt_id", sa.String(36), nullable=True),
        sa.Column("preempted_by_id", sa.String(36), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        _time("created_at"),
        _time("updated_at"),
        _time("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request")),
        sa.ForeignKeyConstraint(
            ["component_id"],
            ["component.id"],
            name=op.f("fk_request_component_id_component"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["previous_attempt_id"],
            ["request.id"],
            name=op.f("fk_request_previous_attempt_id_request"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["preempted_by_id"],
            ["request.id"],
            name=op.f("fk_request_preempted_by_id_request"),
            ondelete="SET NULL",
        ),
        sa.UniqueConstraint("previous_attempt_id", name=op.f("uq_request_previous_attempt_id")),
        sa.CheckConstraint(
            "status IN ('queued', 'allocated', 'released', 'rejected', 'preempted', 'cancelled')",
            name=op.f("ck_request_status"),
        ),
        sa.CheckConstraint("max_retries >= 0", name=op.f("ck_request_max_retries_non_negative")),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_request_attempt_positive")),
    )
    op.create_index(
        op.f("ix_request_status_created_at_id"), "request", ["status", "created_at", "id"]
    )
    op.create_table(
        "request_resource",
        sa.Column("request_id", sa.String(36), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "key", name=op.f("pk_request_resource")),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["request.id"],
            name=op.f("fk_request_resource_request_id_request"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("amount > 0", name=op.f("ck_request_resource_amount_positive")),
    )
    op.create_table(
        "allocation",
        sa.Column("request_id", sa.String(36), nullable=False),
        sa.Column("pool_id", sa.String(36), nullable=True),
        sa.Column("policy_id", sa.String(36), nullable=True),
        sa.Column("pool_name", sa.String(255), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        _time("allocated_at"),
        _time("released_at", nullable=True),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_allocation")),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["request.id"],
            name=op.f("fk_allocation_request_id_request"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pool.id"], name=op.f("fk_allocation_pool_id_pool"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["policy_id"],
            ["policy.id"],
            name=op.f("fk_allocation_policy_id_policy"),
            ondelete="SET NULL",
        ),
    )
    op.create_index(
        op.f("ix_allocation_pool_id_released_at"), "allocation", ["pool_id", "released_at"]
    )
    op.create_table(
        "event",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _time("at"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(36), nullable=True),
        sa.Column("pool_id", sa.String(36), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), server_default=sa.text("'{}'"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
    )
    op.create_index(op.f("ix_event_request_id"), "event", ["request_id"])
    op.create_index(op.f("ix_event_at"), "event", ["at"])


def downgrade() -> None:
    for table in (
        "event",
        "allocation",
        "request_resource",
        "request",
        "policy_resource",
        "policy",
        "pool_resource",
        "pool",
        "component",
    ):
        op.drop_table(table)
