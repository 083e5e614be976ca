"""Alembic environment: runs on the connection the caller put in ``config.attributes``.

There is no alembic.ini and no URL here: ``fairpool.store.db`` opens the database, takes the
write lock and passes its connection in, so migrations run inside that transaction. To write
a new revision, pass a connection the same way to ``alembic.command.revision(config,
message, autogenerate=True, rev_id="0002")`` with ``config = migration_config(connection)``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from fairpool.store.schema import metadata

connection: Connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
