"""Idempotent creates of workloads, pool-tree operations and config versions, as of requests
(0004).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29

Written by hand. The key a create was made with, and the digest of what it asked: a submit,
a start or an apply sent again after its answer was lost answers what the first made.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_TABLES = ("workload", "tree_operation", "config_version")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("idempotency_key", sa.String(64), nullable=True))
            batch.add_column(sa.Column("idempotency_digest", sa.String(64), nullable=True))
            batch.create_unique_constraint(
                op.f(f"uq_{table}_idempotency_key"), ["idempotency_key"]
            )
            batch.create_check_constraint(
                op.f(f"ck_{table}_idempotency_keyed"),
                "(idempotency_key IS NULL) = (idempotency_digest IS NULL)",
            )


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"ck_{table}_idempotency_keyed"), type_="check")
            batch.drop_constraint(op.f(f"uq_{table}_idempotency_key"), type_="unique")
            batch.drop_column("idempotency_digest")
            batch.drop_column("idempotency_key")
