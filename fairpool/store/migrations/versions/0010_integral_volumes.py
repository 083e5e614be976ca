"""Pool trees: integral guarantees' persistent state per pool.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25

Written by hand, like 0001: it does not import ``fairpool.store.schema``. Each pool gains its
accumulated volume, the integral share ratio it held since the last fair-share update and
that update's time (YTsaurus persists the volume per pool, ``TPersistentPoolState``). Existing
pools get no state (all three NULL): their first pass starts an empty volume.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tree_pool") as batch:
        batch.add_column(sa.Column("integral_volume", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("integral_share_ratio", sa.String(255), nullable=True))
        batch.add_column(
            sa.Column("integral_updated_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch.create_check_constraint(
            op.f("ck_tree_pool_integral_state_whole"),
            "(integral_volume IS NULL) = (integral_updated_at IS NULL) "
            "AND (integral_share_ratio IS NULL) = (integral_updated_at IS NULL)",
        )


def downgrade() -> None:
    with op.batch_alter_table("tree_pool") as batch:
        batch.drop_constraint(op.f("ck_tree_pool_integral_state_whole"), type_="check")
        batch.drop_column("integral_updated_at")
        batch.drop_column("integral_share_ratio")
        batch.drop_column("integral_volume")
