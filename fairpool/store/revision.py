"""The schema revision this fairpool works with, apart from ``db`` so that the CLI can name
it (``fairpool --version``) without loading SQLAlchemy."""

#: The newest migration. Opening compares the database with it in plain SQL, so the common
#: case (schema up to date) never imports Alembic, which costs every CLI call ~0.2 s.
#: tests/test_store_schema.py checks it is the migrations' head.
SCHEMA_HEAD = "0018"
