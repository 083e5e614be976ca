"""Partial indexes of the rows that name a preemptor: request.preempted_by_id and
tree_job.preempted_by.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30

Written by hand. Deleting a request (or an operation) runs its foreign keys' ON DELETE SET
NULL, which looked for the rows naming it by scanning the whole table: a prune of 50,000
finished requests took over five minutes on SQLite. Only preempted rows name a preemptor,
so the indexes are partial and a submit does not pay for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_INDEXES = (("request", "preempted_by_id"), ("tree_job", "preempted_by"))


def upgrade() -> None:
    for table, column in _INDEXES:
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(op.f(f"ix_{table}_{column}"), table, [column],
                        sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    for table, column in _INDEXES:
        op.drop_index(op.f(f"ix_{table}_{column}"), table_name=table)
