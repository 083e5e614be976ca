"""The API token each workload and pool-tree operation was submitted with.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

Written by hand. As requests' (0003): a submitter token sees and ends only the workloads and
operations it submitted. Existing rows belong to no token (only admins see them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_TABLES = ("workload", "tree_operation")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("created_by_token_id", sa.String(36), nullable=True))
            batch.create_foreign_key(
                op.f(f"fk_{table}_created_by_token_id_api_token"),
                "api_token",
                ["created_by_token_id"],
                ["id"],
                ondelete="SET NULL",
            )
            batch.create_index(op.f(f"ix_{table}_created_by_token_id"), ["created_by_token_id"])


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_index(op.f(f"ix_{table}_created_by_token_id"))
            batch.drop_constraint(
                op.f(f"fk_{table}_created_by_token_id_api_token"), type_="foreignkey"
            )
            batch.drop_column("created_by_token_id")
