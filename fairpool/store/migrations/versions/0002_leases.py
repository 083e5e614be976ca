"""Leases: a request may ask for a lease TTL; its allocation then expires without heartbeats.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.add_column(sa.Column("lease_ttl", sa.Integer(), nullable=True))
        batch.create_check_constraint(
            op.f("ck_request_lease_ttl_positive"), "lease_ttl IS NULL OR lease_ttl > 0"
        )
    with op.batch_alter_table("allocation") as batch:
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocation") as batch:
        batch.drop_column("lease_expires_at")
    with op.batch_alter_table("request") as batch:
        batch.drop_constraint(op.f("ck_request_lease_ttl_positive"), type_="check")
        batch.drop_column("lease_ttl")
