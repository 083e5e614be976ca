"""A workload's status_notes: why earlier rules and other flavors did not apply, kept with
the decision.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30

Written by hand. The notes were worked out by each pass and shown only while a workload
waited: once it was admitted, rejected or failed (by a config apply too, where nobody saw a
submit's answer) nothing said which rule's priority policy refused it or which flavor's
selector missed. Workloads decided before this revision have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.add_column(sa.Column("status_notes", sa.JSON(), nullable=False,
                                   server_default=sa.text("'[]'")))


def downgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.drop_column("status_notes")
