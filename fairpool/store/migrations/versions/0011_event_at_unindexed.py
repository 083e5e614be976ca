"""The event log's time is no longer indexed.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24

Written by hand, like 0001. Events are read newest first by id (``repo.list_events``), never
by time, and every write transaction inserts some: the index cost each of them an insert and
a dirty page, ~4 % of a create + release's CPU on SQLite.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_event_at"), table_name="event")


def downgrade() -> None:
    op.create_index(op.f("ix_event_at"), "event", ["at"])
