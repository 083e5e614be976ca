"""Idempotent creates: a client-chosen key per create call, unique.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22

Written by hand, like 0001: it does not import ``fairpool.store.schema``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(64), nullable=True))
        batch.create_unique_constraint(
            op.f("uq_request_idempotency_key"), ["idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.drop_constraint(op.f("uq_request_idempotency_key"), type_="unique")
        batch.drop_column("idempotency_key")
