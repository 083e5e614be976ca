"""The store's generation: a stamp of the commit that set it, besides its counter.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24

Written by hand, like 0001. Every write transaction writes a random stamp with the counter.
A server's event loop sends its next write before the previous one's commit is confirmed,
built on the state that one left (``fairpool.service``): it must commit only if exactly that
transaction committed before it. The counter cannot tell: had that one failed, another
(its rerun, another replica) could commit the same counter value in its place. The stamp
differs. Existing databases start with stamp 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("store_generation") as batch:
        batch.add_column(
            sa.Column("stamp", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("store_generation") as batch:
        batch.drop_column("stamp")
