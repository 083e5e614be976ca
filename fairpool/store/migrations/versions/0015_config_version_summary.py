"""A config version's summary: its counts and its queues' specs.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29

Written by hand. Listing versions, and checking a new one against every earlier one (a
queue's spec is immutable per name), parsed every stored document: seconds per apply past a
few dozen versions of a large config, under the write lock. A version applied before this
migration gets its summary the first time an apply reads it (``scheduling``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("config_version") as batch:
        batch.add_column(sa.Column("summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("config_version") as batch:
        batch.drop_column("summary")
