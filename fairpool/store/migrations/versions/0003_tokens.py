"""API tokens, and the token each request was submitted with.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Written by hand, like 0001: it does not import ``fairpool.store.schema``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("components", sa.JSON(), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_token_secret_hash")),
        sa.CheckConstraint("role IN ('admin', 'submitter')", name=op.f("ck_api_token_role")),
    )
    with op.batch_alter_table("request") as batch:
        batch.add_column(sa.Column("created_by_token_id", sa.String(36), nullable=True))
        batch.create_foreign_key(
            op.f("fk_request_created_by_token_id_api_token"),
            "api_token",
            ["created_by_token_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(op.f("ix_request_created_by_token_id"), ["created_by_token_id"])


def downgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.drop_index(op.f("ix_request_created_by_token_id"))
        batch.drop_constraint(op.f("fk_request_created_by_token_id_api_token"), type_="foreignkey")
        batch.drop_column("created_by_token_id")
    op.drop_table("api_token")
