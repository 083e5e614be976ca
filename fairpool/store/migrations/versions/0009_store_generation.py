"""The store's generation: a counter every write transaction increments.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

Written by hand, like 0001. A process that keeps the live state in memory between its
transactions (``fairpool.service``) reuses it only while nobody else has written since: the
generation it read at its last commit is still the database's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    generation = op.create_table(
        "store_generation",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_generation")),
        sa.CheckConstraint("id = 1", name=op.f("ck_store_generation_single_row")),
    )
    op.bulk_insert(generation, [{"id": 1, "value": 0}])


def downgrade() -> None:
    op.drop_table("store_generation")
