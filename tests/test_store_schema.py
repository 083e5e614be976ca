"""The schema: migrations agree with the metadata, and the constraints hold the invariants.

Every test here runs on SQLite and on PostgreSQL (see ``database_url`` in conftest.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction as F
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    BindParameter,
    Column,
    Connection,
    Engine,
    bindparam,
    create_engine,
    inspect,
    make_url,
    select,
    text,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import IntegrityError, StatementError

from fairpool.errors import InvalidInput, Unreachable
from fairpool.store import repo, schema
from fairpool.store.db import (
    SCHEMA_HEAD,
    WRITE_LOCK_KEY,
    Database,
    _json_text,
    migration_config,
)
from fairpool.store.records import ComponentType, RequestStatus
from tests.conftest import BACKENDS, Backend

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
EXAMPLES = Path(__file__).parents[1] / "examples" / "scheduler"


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with Database.open(database_url) as database:
        yield database


def _describe(url: str) -> dict[str, dict[str, Any]]:
    """Everything SQLAlchemy's inspector reports about the tables of the database at ``url``."""
    engine = create_engine(url)
    try:
        inspector = inspect(engine)

        def by_name(items: list[Any]) -> list[Any]:
            return sorted(items, key=lambda item: item["name"])

        return {
            table: {
                # Type objects compare by identity: compare their DDL instead.
                "columns": [
                    {**column, "type": str(column["type"])}
                    for column in inspector.get_columns(table)
                ],
                "pk": inspector.get_pk_constraint(table),
                "fks": by_name(inspector.get_foreign_keys(table)),
                "uniques": by_name(inspector.get_unique_constraints(table)),
                # A partial index's WHERE is a clause object too: its text.
                "indexes": by_name([
                    {**index, "dialect_options": {
                        key: str(value) for key, value in index.get("dialect_options", {}).items()
                    }} for index in inspector.get_indexes(table)
                ]),
                "checks": by_name(inspector.get_check_constraints(table)),
            }
            for table in inspector.get_table_names()
            if table != "alembic_version"
        }
    finally:
        engine.dispose()


def _compare_server_default(
    context: MigrationContext,
    inspected_column: Column[Any],
    metadata_column: Column[Any],
    inspected_default: str | None,
    metadata_default: Any,
    rendered_metadata_default: str | None,
) -> bool | None:
    """Alembic's own comparison, except for JSON columns on PostgreSQL.

    Alembic compares defaults there by running ``SELECT <reflected> = <ours>``, but the json
    type has no ``=`` operator; compare the reflected text instead.
    """
    if context.dialect.name == "postgresql" and isinstance(metadata_column.type, JSON):
        return inspected_default != f"{rendered_metadata_default}::json"
    return None


def _migrated(url: str) -> str:
    """The new database at ``url`` brought to head by running every migration, as a store
    an older fairpool left is (``Database.open`` makes a new one from the metadata): its
    URL."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            command.upgrade(migration_config(connection), "head")
    finally:
        engine.dispose()
    return url


def _contents(url: str) -> dict[str, list[Any]]:
    """Every row of every table, alembic_version's too (foreign keys off: SQLite's default,
    as Alembic's downgrade runs)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                # repr: a None beside a value in one column would not compare
                table: sorted(map(tuple, connection.execute(text(f'SELECT * FROM "{table}"'))),
                              key=repr)
                for table in inspect(connection).get_table_names()
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrations_match_metadata(backend: Backend, new_database: Callable[..., str]) -> None:
    with Database.open(_migrated(new_database(backend))) as db, db.read() as connection:
        context = MigrationContext.configure(
            connection,
            opts={"compare_type": True, "compare_server_default": _compare_server_default},
        )
        assert compare_metadata(context, schema.metadata) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_store_is_the_store_the_migrations_make(
    backend: Backend, new_database: Callable[..., str]
) -> None:
    """``Database.open`` makes a new store from the metadata, not by running every migration:
    the two inspect alike (tables, columns, keys, indexes, checks) and hold the same rows (the
    generation's, the schema revision)."""
    migrated = _migrated(new_database(backend))
    created = new_database(backend)
    Database.open(created).close()

    described = _describe(migrated)
    assert described == _describe(created)
    assert sorted(described) == sorted(schema.metadata.tables)
    contents = _contents(migrated)
    assert contents == _contents(created)
    assert contents["store_generation"] and contents["alembic_version"] == [(SCHEMA_HEAD,)]
    # Every constraint carries the naming convention's name, so later migrations can drop it.
    for table in described.values():
        assert table["pk"]["name"]
        for kind in ("fks", "uniques", "indexes", "checks"):
            assert all(item["name"] for item in table[kind])


def test_downgrade_to_base_and_back(db: Database) -> None:
    with db.migrating() as connection:
        command.downgrade(migration_config(connection), "base")
    with db.read() as connection:
        assert inspect(connection).get_table_names() == ["alembic_version"]
    with db.migrating() as connection:
        command.upgrade(migration_config(connection), "head")
    with db.read() as connection:
        assert set(inspect(connection).get_table_names()) == {
            "alembic_version",
            *schema.metadata.tables,
        }


def test_opening_an_older_store_upgrades_it_and_says_so(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator upgrading a shared store saw nothing of it (helper-80)."""
    with Database.open(database_url) as db, db.migrating() as connection:
        command.downgrade(migration_config(connection), "0011")
        where = db.where
    with caplog.at_level("WARNING", logger="fairpool.store"):
        Database.open(database_url).close()
        Database.open(database_url).close()  # at head: nothing said
    assert [r.getMessage() for r in caplog.records if r.name == "fairpool.store"] == [
        f"Upgraded the store {where} from schema revision 0011 to {SCHEMA_HEAD}"]


@pytest.mark.usefixtures("short_lock_timeout")
def test_opening_a_store_another_process_is_upgrading_says_so(database_url: str) -> None:
    """It waited for the write lock to upgrade the store too, and failed with the lock's own
    words after 30 s ("database is locked"; PostgreSQL's "canceling statement due to lock
    timeout"), naming no upgrade (helper-80). Once the lock is free, it upgrades."""
    with Database.open(database_url) as db, db.migrating() as connection:
        command.downgrade(migration_config(connection), "0016")
    engine = create_engine(database_url)
    try:
        with engine.connect() as upgrading:  # another process, in its migration
            if upgrading.dialect.name == "sqlite":
                upgrading.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                upgrading.execute(text(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})"))
            with pytest.raises(Unreachable, match=(
                rf"^cannot open the database .*: its schema is at revision 0016 and this "
                rf"fairpool's at {SCHEMA_HEAD}, and another process held the write lock for "
                r"0\.2 s as this one waited to upgrade it \(upgrading it too, most likely: a "
                r"large store takes a while\): try again once it is done$"
            )):
                Database.open(database_url)
            upgrading.rollback()
    finally:
        engine.dispose()
    with Database.open(database_url) as db, db.read() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() \
            == SCHEMA_HEAD


def test_reopening_keeps_data(database_url: str) -> None:
    with Database.open(database_url) as db, db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
    with Database.open(database_url) as db, db.read() as connection:
        assert repo.get_pool(connection, "gpus").capacity == {"gpu": 8}


def test_opening_a_sqlite_file_in_no_directory_is_refused(tmp_path: Path) -> None:
    """It made the directories: a mistyped path read as a new, empty store."""
    url = f"sqlite:///{tmp_path / 'nested' / 'dir' / 'fairpool.db'}"
    with pytest.raises(InvalidInput, match=rf"^database-url: {tmp_path}/nested/dir is not a "):
        Database.open(url)
    assert not (tmp_path / "nested").exists()


NEWER = (r"its schema \(revision 9999\) is not one this fairpool knows \(its newest is "
         rf"{SCHEMA_HEAD}\): open it with the fairpool that last wrote it, or a newer one$")
NO_REVISION = (rf"it holds {len(schema.metadata.tables)} tables of fairpool's \(allocation, api_token, cluster_node, \.\.\.\) "
               r"but no schema revision \(alembic_version missing or empty\): a damaged store, "
               r"or another program's database; nothing changed$")


@pytest.mark.parametrize(("damage", "message"), [
    # Alembic's traceback was all the user saw (38 frames of "Can't locate revision").
    ("UPDATE alembic_version SET version_num = '9999'", NEWER),
    # Taken for a new database: the first migration failed on "table component already exists".
    ("DELETE FROM alembic_version", NO_REVISION),
    ("DROP TABLE alembic_version", NO_REVISION),
], ids=["newer", "emptied", "dropped"])
def test_a_database_of_another_schema_is_refused_in_one_line(database_url: str, damage: str,
                                                              message: str) -> None:
    """A revision none of ours, or fairpool's tables without one: refused, nothing changed."""
    Database.open(database_url).close()
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(damage))
        before = _dump(engine)
        with pytest.raises(Unreachable, match=r"^cannot open the database .*: " + message):
            Database.open(database_url)
        assert _dump(engine) == before
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_programs_database_is_refused_untouched(new_database: Callable[..., str],
                                                         backend: Backend) -> None:
    """A mistyped URL naming another program's database: its tables were migrated into."""
    url = new_database(backend)
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for name in ("invoices", "customers", "orders", "payments"):
                connection.execute(text(f"CREATE TABLE {name} (id INTEGER)"))
            connection.execute(text("INSERT INTO invoices VALUES (1)"))
        before = _dump(engine), _file(url)
        with pytest.raises(Unreachable, match=(
            r"^cannot open the database .*: it holds 4 tables of another program \(customers, "
            r"invoices, orders, \.\.\.\) and no fairpool store: is the URL the one meant\? "
        )):
            Database.open(url)
        assert (_dump(engine), _file(url)) == before  # SQLite: the file was switched to WAL
        # Its own Alembic revision: taken for a newer fairpool's.
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
            connection.execute(text("INSERT INTO alembic_version VALUES ('1a2b3c4d5e6f')"))
        with pytest.raises(Unreachable, match=(
            r"it holds 4 tables of another program \(customers, invoices, orders, \.\.\.\) "
            r"\(and its own schema revision, 1a2b3c4d5e6f\) and no fairpool store")):
            Database.open(url)
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE alembic_version"))
        # An empty alembic_version alone (a schema migrated down to nothing) is a new store.
        with engine.begin() as connection:
            for name in ("invoices", "customers", "orders", "payments"):
                connection.execute(text(f"DROP TABLE {name}"))
            connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        Database.open(url).close()
    finally:
        engine.dispose()


def test_a_postgresql_schema_of_its_own_keeps_the_store_beside_another_program(
        new_database: Callable[..., str]) -> None:
    """What the refusal advises: the URL's search_path names a schema for fairpool, alone or
    before the other program's (whose tables were taken for the store's neighbours)."""
    url = new_database("postgresql")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE invoices (id INTEGER)"))
            connection.execute(text("CREATE SCHEMA fairpool"))
        with Database.open(url + "?options=-csearch_path%3Dfairpool,public") as db:
            with db.write() as connection:
                repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
        with Database.open(url + "?options=-csearch_path%3Dfairpool") as db:
            with db.read() as connection:
                assert repo.get_pool(connection, "gpus").capacity == {"gpu": 8}
        with engine.connect() as connection:
            assert inspect(connection).get_table_names() == ["invoices"]
            assert set(inspect(connection).get_table_names(schema="fairpool")) == {
                "alembic_version", *schema.metadata.tables}
    finally:
        engine.dispose()


def _file(url: str) -> bytes | None:
    """A SQLite database's file as it is on disk (its header keeps the journal mode)."""
    path = make_url(url).database
    return Path(path).read_bytes() if url.startswith("sqlite") and path else None


def _dump(engine: Engine) -> dict[str, list[Any]]:
    """Every table's rows."""
    with engine.connect() as connection:
        return {name: sorted(map(repr, connection.execute(text(f"SELECT * FROM {name}"))))
                for name in sorted(inspect(connection).get_table_names())}


@pytest.mark.parametrize(("url", "message"), [
    # Each was SQLAlchemy's ModuleNotFoundError traceback, or int()'s words.
    ("postgresql+psycopg2://me:secret@db/fp", "fairpool talks to postgresql through psycopg "
     "only: use postgresql:// or postgresql+psycopg:// (got 'postgresql+psycopg2://me:***@db/fp')"),
    ("postgresql+asyncpg://me@db/fp", "through psycopg only"),
    ("sqlite+aiosqlite:///f.db", "fairpool talks to sqlite through pysqlite only: use sqlite:// "
     "or sqlite+pysqlite://"),
    ("postgresql://me:secret@db:abc/fp", "has a port that is not a number: use sqlite:///PATH "
     "or postgresql://USER@HOST/DATABASE (got 'postgresql://me:***@db:abc/fp')"),
    ("postgresql://me:sec@ret@db:abc/fp", "(got 'postgresql://me:***@db:abc/fp')"),
    # SQLAlchemy split at the first "@": "ret@db" was the host, in every error (helper-94).
    ("postgresql://me:sec@ret@db/fp", "an '@' in the user name or password is written %40 "
     "(got 'postgresql://me:***@db/fp')"),
    # A bare ValueError before 2026-12-02.
    ("mysql://me:secret@localhost/fairpool", "fairpool keeps its data in SQLite or "
     "PostgreSQL: use sqlite:///PATH or postgresql://USER@HOST/DATABASE (got "
     "'mysql://me:***@localhost/fairpool')"),
])
def test_a_database_url_fairpool_cannot_use_is_one_error(url: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)) as refused:
        Database.open(url)
    assert str(refused.value).startswith("database-url: ")
    assert "secret" not in str(refused.value) and "ret@" not in str(refused.value)


def test_a_database_out_of_reach_is_one_line() -> None:
    """libpq puts its hint on a line of its own; every error's message is one line, the
    SDK's too (only the CLI joined it: helper-94)."""
    from tests.servers import free_port

    with pytest.raises(Unreachable) as refused:
        Database.open(f"postgresql://postgres@127.0.0.1:{free_port()}/fairpool")
    assert "\n" not in str(refused.value) and "Connection refused" in str(refused.value)


def test_times_come_back_aware_in_utc(db: Database) -> None:
    cest = timezone(timedelta(hours=2))
    local = datetime(2025, 6, 1, 14, 30, 15, 123456, tzinfo=cest)
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {}, local).id
    with db.read() as connection:
        pool = repo.get_pool(connection, pool_id)
    assert pool.created_at == local
    assert pool.created_at.tzinfo is UTC
    assert pool.created_at.hour == 12


def test_naive_times_are_refused(db: Database) -> None:
    naive = datetime(2025, 1, 1)
    with pytest.raises(ValueError, match="naive"), db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {}, naive)
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {}, NOW).id
    with pytest.raises(StatementError, match="naive"), db.write() as connection:
        repo.update_pool_description(connection, pool_id, "x", naive)


@settings(max_examples=500, deadline=None)
@given(
    moment=st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                        timezones=st.timezones()),
)
def test_sqlite_stores_a_time_as_sqlalchemy_would(moment: datetime) -> None:
    """``UTCDateTime`` writes SQLite's text itself (faster): exactly SQLAlchemy's, in UTC."""
    dialect = sqlite.pysqlite.dialect()
    ours = schema.UTCDateTime().bind_processor(dialect)
    theirs = sqlite.DATETIME().bind_processor(dialect)
    assert ours is not None and theirs is not None
    assert ours(moment) == theirs(schema.as_utc(moment))
    assert ours(None) is None


@settings(max_examples=300, deadline=None)
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
))
def test_sqlite_stores_json_as_json_dumps_writes_it(value: Any) -> None:
    """The empty object is written without ``json.dumps`` (faster), as the same text."""
    assert _json_text(value) == json.dumps(value)
    assert _json_text({}) == "{}"


def _component(connection: Connection) -> str:
    return repo.insert_component(connection, "k8s", ComponentType.ORCHESTRATOR, NOW).id


def _pool(connection: Connection, name: str = "gpus") -> str:
    return repo.insert_pool(connection, name, None, {"gpu": 8}, NOW).id


def _zero_capacity(connection: Connection) -> None:
    repo.insert_pool(connection, "gpus", None, {"gpu": 0}, NOW)


def _duplicate_pool_name(connection: Connection) -> None:
    _pool(connection)
    _pool(connection)


def _reserved_above_limit(connection: Connection) -> None:
    repo.insert_policy(
        connection, _pool(connection), _component(connection), 1, {"gpu": 4}, {"gpu": 2}, NOW
    )


def _negative_reserved(connection: Connection) -> None:
    repo.insert_policy(
        connection, _pool(connection), _component(connection), 1, {"gpu": -1}, {}, NOW
    )


def _negative_priority(connection: Connection) -> None:
    repo.insert_policy(connection, _pool(connection), _component(connection), -1, {}, {}, NOW)


def _duplicate_policy(connection: Connection) -> None:
    pool_id, component_id = _pool(connection), _component(connection)
    repo.insert_policy(connection, pool_id, component_id, 1, {}, {}, NOW)
    repo.insert_policy(connection, pool_id, component_id, 2, {}, {}, NOW)


def _policy_for_unknown_pool(connection: Connection) -> None:
    repo.insert_policy(connection, "no-such-pool", _component(connection), 1, {}, {}, NOW)


def _duplicate_component(connection: Connection) -> None:
    _component(connection)
    _component(connection)


def _unknown_component_type(connection: Connection) -> None:
    connection.execute(
        schema.component.insert().values(id="c", name="x", type="deployer", created_at=NOW)
    )


def _zero_demand(connection: Connection) -> None:
    repo.insert_request(connection, _component(connection), {"gpu": 0}, NOW, preemptible=True)


def _request(connection: Connection) -> str:
    return repo.insert_request(
        connection, _component(connection), {"gpu": 1}, NOW, preemptible=True
    ).id


def _unknown_status(connection: Connection) -> None:
    request = schema.request
    connection.execute(
        update(request).where(request.c.id == _request(connection)).values(status="running")
    )


def _negative_retries(connection: Connection) -> None:
    repo.insert_request(
        connection, _component(connection), {}, NOW, preemptible=True, max_retries=-1
    )


def _attempt_zero(connection: Connection) -> None:
    repo.insert_request(connection, _component(connection), {}, NOW, preemptible=True, attempt=0)


def _two_retries_of_one_attempt(connection: Connection) -> None:
    first = _request(connection)
    component_id = repo.list_components(connection)[0].id
    for _ in range(2):
        repo.insert_request(
            connection,
            component_id,
            {},
            NOW,
            preemptible=True,
            attempt=2,
            previous_attempt_id=first,
        )


def _two_allocations_for_one_request(connection: Connection) -> None:
    request_id, pool_id = _request(connection), _pool(connection)
    repo.insert_allocation(connection, request_id, pool_id, None, "gpus", 1, NOW)
    repo.release_allocation(connection, request_id, NOW)
    repo.insert_allocation(connection, request_id, pool_id, None, "gpus", 1, NOW)


def _delete_component_with_requests(connection: Connection) -> None:
    _request(connection)
    repo.delete_component(connection, repo.list_components(connection)[0].id)


def _null_labels(connection: Connection) -> None:
    connection.execute(
        text(
            "INSERT INTO request (id, component_id, status, preemptible, labels, created_at,"
            " updated_at) VALUES ('r', :component_id, 'queued', TRUE, NULL, :now, :now)"
        ),
        {"component_id": _component(connection), "now": "2025-01-01 00:00:00.000000"},
    )


@pytest.mark.parametrize(
    "violation",
    [
        _zero_capacity,
        _duplicate_pool_name,
        _reserved_above_limit,
        _negative_reserved,
        _negative_priority,
        _duplicate_policy,
        _policy_for_unknown_pool,
        _duplicate_component,
        _unknown_component_type,
        _zero_demand,
        _unknown_status,
        _negative_retries,
        _attempt_zero,
        _two_retries_of_one_attempt,
        _two_allocations_for_one_request,
        _delete_component_with_requests,
        _null_labels,
    ],
)
def test_constraints_reject(db: Database, violation: Callable[[Connection], None]) -> None:
    with pytest.raises(IntegrityError), db.write() as connection:
        violation(connection)
    # The failed transaction left nothing behind.
    with db.read() as connection:
        assert repo.list_pools(connection) == []
        assert repo.list_components(connection) == []


def test_every_status_is_accepted(db: Database) -> None:
    with db.write() as connection:
        request_id = _request(connection)
        for status in RequestStatus:
            repo.set_request_status(connection, request_id, status, None, NOW)
            assert repo.get_request(connection, request_id).status is status


def test_schema_head_constant_is_the_migrations_head(tmp_path: Path) -> None:
    # Opening skips Alembic when the database is at SCHEMA_HEAD: a new migration must move it.
    from alembic.script import ScriptDirectory

    from fairpool.store.db import default_url

    db = Database.open(default_url(tmp_path))
    with db.read() as connection:
        head = ScriptDirectory.from_config(migration_config(connection)).get_current_head()
    db.close()
    assert head == SCHEMA_HEAD


def test_0008_moves_each_operations_tree_to_a_placement(
    database_url: str, new_database: Callable[..., str]
) -> None:
    """Operations stored before multi-tree operations keep their tree, pool, weight, limits,
    reason and starvation clock (now per tree), and their jobs name the tree; and back."""
    from fairpool.store import trees as tree_store

    def moment(name: str) -> BindParameter[datetime]:
        return bindparam(name, type_=schema.UTCDateTime())

    url = new_database(make_url(database_url).get_backend_name())
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            command.upgrade(migration_config(connection), "0007")
            connection.execute(text(
                "INSERT INTO pool_tree (name, config, created_at, updated_at) "
                "VALUES ('physical', '{}', :now, :now)").bindparams(moment("now")), {"now": NOW})
            insert_operation = text(
                "INSERT INTO tree_operation (id, tree, pool, user_name, job_resources, "
                "job_count, gang, weight, resource_limits, status, status_reason, created_at, "
                "started_at, finished_at, updated_at, below_fair_share_since, interruptible) "
                "VALUES (:id, 'physical', :pool, 'u', '{\"cpu\": 1}', 2, FALSE, :weight, "
                "'{\"cpu\": 4}', :status, :reason, :now, :now, :finished, :now, :since, FALSE)"
            ).bindparams(moment("now"), moment("finished"), moment("since"))
            connection.execute(insert_operation, [
                {"id": "live", "pool": "batch", "weight": "2", "status": "running",
                 "reason": "1 jobs pending: no room", "finished": None, "since": NOW, "now": NOW},
                {"id": "done", "pool": "adhoc", "weight": "1", "status": "completed",
                 "reason": "completed", "finished": NOW, "since": None, "now": NOW},
            ])
            connection.execute(text(
                "INSERT INTO tree_job (id, operation_id, node, status, started_at) "
                "VALUES ('j1', 'live', 'n1', 'running', :now)").bindparams(moment("now")),
                {"now": NOW})
            command.upgrade(migration_config(connection), "head")
        with Database.open(url) as db, db.read() as connection:
            live = tree_store.get_operation(connection, "live")
            done = tree_store.get_operation(connection, "done")
            jobs = tree_store.jobs_of(connection, ["live"])
        (placement,) = live.placements
        assert (placement.tree, placement.pool, placement.weight, placement.resource_limits) == (
            "physical", "batch", "2", {"cpu": 4})
        assert (placement.running, placement.reason, placement.below_fair_share_since) == (
            True, "1 jobs pending: no room", NOW)
        assert (live.status_reason, done.status_reason) == (None, "completed")
        assert (done.placements[0].pool, done.placements[0].running) == ("adhoc", False)
        assert [job.tree for job in jobs] == ["physical"]
        with engine.begin() as connection:
            command.downgrade(migration_config(connection), "0007")
            row = connection.execute(text(
                "SELECT tree, pool, weight, status_reason FROM tree_operation WHERE id = 'live'"
            )).one()
        assert tuple(row) == ("physical", "batch", "2", "1 jobs pending: no room")
    finally:
        engine.dispose()


def test_0018_gives_workloads_preempted_before_0012_their_requeue_time(
    database_url: str, new_database: Callable[..., str]
) -> None:
    """0012 added requeued_at empty: a workload preempted before it and still queued waited
    from its submission, ahead of those queued after its requeue (helper-92). Its row was
    last written when it was requeued: its updated_at."""
    url = new_database(make_url(database_url).get_backend_name())
    engine = create_engine(url)
    requeued = NOW + timedelta(hours=1)
    try:
        with engine.begin() as connection:
            command.upgrade(migration_config(connection), "0017")
            insert = text(
                "INSERT INTO workload (id, status, labels, submitted_at, updated_at, "
                "preemptions) VALUES (:id, :status, '{}', :submitted, :updated, :preemptions)"
            ).bindparams(bindparam("submitted", type_=schema.UTCDateTime()),
                         bindparam("updated", type_=schema.UTCDateTime()))
            for row_id, status, preemptions in [("preempted", "queued", 1),
                                                ("never", "queued", 0),
                                                ("ended", "finished", 2)]:
                connection.execute(insert, {"id": row_id, "status": status,
                                            "preemptions": preemptions, "submitted": NOW,
                                            "updated": requeued})
            command.upgrade(migration_config(connection), "head")
            found = dict(connection.execute(text("SELECT id, requeued_at FROM workload")).all())
        assert {k: v is not None for k, v in found.items()} == {
            "preempted": True, "never": False, "ended": False}
        with Database.open(url) as db, db.read() as connection:
            row = connection.execute(select(schema.workload.c.requeued_at).where(
                schema.workload.c.id == "preempted")).scalar_one()
        assert row == requeued
    finally:
        engine.dispose()


def test_0010_upgrades_a_database_with_pools(
    database_url: str, new_database: Callable[..., str]
) -> None:
    """Pools stored before integral guarantees get no integral state (all three columns
    NULL), the constraint keeps the three together, and a pass then fills them; and back."""
    from fairpool.store import trees as tree_store
    from fairpool.store.tree_records import IntegralRecord

    url = new_database(make_url(database_url).get_backend_name())
    engine = create_engine(url)
    now = bindparam("now", type_=schema.UTCDateTime())
    try:
        with engine.begin() as connection:
            command.upgrade(migration_config(connection), "0009")
            connection.execute(text(
                "INSERT INTO pool_tree (name, config, created_at, updated_at) "
                "VALUES ('physical', '{}', :now, :now)").bindparams(now), {"now": NOW})
            connection.execute(text(
                "INSERT INTO tree_pool (tree, name, config, created_at, updated_at) VALUES "
                "('physical', 'burst', '{\"integral_guarantees\": {\"guarantee_type\": "
                "\"burst\"}}', :now, :now)").bindparams(now), {"now": NOW})
            command.upgrade(migration_config(connection), "head")
        with Database.open(url) as db:
            with db.read() as connection:
                (pool,) = tree_store.list_pools(connection, "physical")
            assert pool.integral is None and pool.config["integral_guarantees"]
            with db.write() as connection:
                tree_store.set_pool_integral(connection, "physical", "burst", IntegralRecord(
                    {"cpu": F(6000)}, F(1, 2), NOW))
            with db.read() as connection:
                (pool,) = tree_store.list_pools(connection, "physical")
            assert pool.integral == IntegralRecord({"cpu": F(6000)}, F(1, 2), NOW)
            with pytest.raises(IntegrityError), db.write() as connection:
                connection.execute(update(schema.tree_pool).values(integral_updated_at=None))
        with engine.begin() as connection:
            command.downgrade(migration_config(connection), "0009")
            columns = {c["name"] for c in inspect(connection).get_columns("tree_pool")}
        assert not {"integral_volume", "integral_share_ratio", "integral_updated_at"} & columns
    finally:
        engine.dispose()


#: Every revision but the head: a database a user's older fairpool left at it.
OLDER_REVISIONS = [f"{n:04d}" for n in range(1, int(SCHEMA_HEAD))]


def _rows(url: str) -> dict[str, int]:
    """Rows per table but alembic_version."""
    return {table: len(rows) for table, rows in _contents(url).items()
            if table != "alembic_version"}


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A SQLite database at the head holding a row in every table: requests in each state
    (a preempted one with its retry), pools, policies, a token, config versions, workloads,
    nodes, a tree of nested pools and an operation with running jobs."""
    from fairpool.scheduling import SchedulingService
    from fairpool.service import Service
    from fairpool.trees_service import TreesService

    path = tmp_path_factory.mktemp("populated") / "fairpool.db"
    db = Database.open(f"sqlite:///{path}")
    try:
        svc = Service(db)
        svc.create_pool("gpus", {"gpu": 4})
        svc.attach_policy("gpus", "low")
        svc.attach_policy("gpus", "high", priority=10, reserved={"gpu": 1})
        token = svc.create_token("submitter", ["low"], name="ci")[0].id
        victim = svc.create_request("low", demand={"gpu": 3}, max_retries=1, created_by=token)
        svc.create_request("low", demand={"gpu": 1}, lease_ttl=600, idempotency_key="k1")
        svc.create_request("high", demand={"gpu": 2})  # preempts the victim; its retry waits
        svc.cancel_request(svc.create_request("high", demand={"gpu": 4}).id, "changed plans")
        svc.create_request("low", demand={"gpu": 9})  # rejected
        assert svc.get_request(victim.id).status == "preempted"
        sched = SchedulingService(db)
        sched.apply_config((EXAMPLES / "m5-cap.yaml").read_text())
        sched.submit_workload(instance_type="m5.2xlarge", demand={"cpu": 8, "memory_gb": 32})
        trees = TreesService(db)
        trees.add_node("n1", ["gpu"], {"cpu": 8, "memory": "64GiB", "user_slots": 8})
        trees.create_tree("physical", {"node_tag_filter": "gpu"})
        trees.create_pool("physical", "team")
        trees.create_pool("physical", "batch", parent="team")
        trees.start_operation(user="u", job_resources={"cpu": 1}, job_count=3, pool="batch")
    finally:
        db.close()
    counts = _rows(f"sqlite:///{path}")
    assert all(counts.values()), {t: n for t, n in counts.items() if not n}
    return path.read_bytes()


def _left_at(path: Path, populated: bytes, revision: str, *then: str) -> str:
    """The populated database written at ``path`` and taken down to ``revision`` as an older
    fairpool left it (foreign keys off, as Alembic runs), ``then`` run on it: its URL."""
    path.write_bytes(populated)
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            command.downgrade(migration_config(connection), revision)
            for statement in then:
                connection.execute(text(statement))
    finally:
        engine.dispose()
    return url


@pytest.mark.parametrize("revision", OLDER_REVISIONS)
def test_opening_a_database_an_older_fairpool_left_keeps_every_row(
    tmp_path: Path, populated: bytes, revision: str
) -> None:
    """SQLite cannot alter most things, so a migration rebuilds the table (Alembic's batch
    mode: copy, DROP the old one, rename). With foreign keys on, as fairpool opens SQLite,
    that DROP deleted every row referring to the old table (allocations, resources, jobs) or
    failed (a tree's nested pools). A populated database is taken down to ``revision`` (as
    an older fairpool left it), then opened: every row of every table there is still there.
    SQLite only: PostgreSQL alters tables in place."""
    url = _left_at(tmp_path / "fairpool.db", populated, revision)
    before = _rows(url)
    Database.open(url).close()
    after = _rows(url)
    assert {table: after[table] for table in before} == before


def test_a_migration_that_would_leave_a_dangling_reference_is_rolled_back(
    tmp_path: Path, populated: bytes
) -> None:
    """The references are checked before a migration commits (foreign keys are off while it
    runs): a row referring to none is refused in one line, the store left as it was."""
    path = tmp_path / "fairpool.db"
    url = _left_at(path, populated, OLDER_REVISIONS[-1],
                   "UPDATE allocation SET request_id = 'gone' "
                   "WHERE rowid = (SELECT min(rowid) FROM allocation)")
    before = path.read_bytes()
    with pytest.raises(Unreachable, match=(
        r"^cannot open the database .*: the migration would leave 1 row referring to none "
        r"\(the first: allocation row \d+, to request\)$")):
        Database.open(url)
    assert _rows(url) and path.read_bytes() == before
