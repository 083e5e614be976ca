"""``Direct`` statements write what SQLAlchemy's execution would, on SQLite and PostgreSQL.

Each case writes one row through ``Direct`` and the same values, under another key, through
``connection.execute``, then compares the two rows as the database stores them (raw SQL, no
type processing: on SQLite a datetime is text, a bool an integer, JSON a string).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import (
    Connection,
    Table,
    bindparam,
    create_engine,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, IntegrityError

from fairpool.errors import NotFound, WouldWait
from fairpool.store import direct, repo, schema
from fairpool.store.db import Database, generation
from fairpool.store.direct import DeferredWriteFailed, Direct, _compile, _numbered, _text
from fairpool.store.records import ComponentType

NOW = datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
ELSEWHERE = timezone(timedelta(hours=-7, minutes=-30))


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with Database.open(database_url) as database:
        yield database


def _stored(connection: Connection, table: Table, key: str, value: str) -> dict[str, Any]:
    row = connection.exec_driver_sql(
        f"SELECT * FROM {table.name} WHERE {key} = '{value}'"
    ).mappings().one()
    return {column: cell for column, cell in row.items() if column not in (key, "id")}


def _request(component_id: str, id_: str, **changes: Any) -> dict[str, Any]:
    values = {
        "id": id_,
        "component_id": component_id,
        "status": "queued",
        "preemptible": True,
        "max_retries": 2,
        "attempt": 1,
        "previous_attempt_id": None,
        "labels": {"team": "ämbient ✓", "quote": "it's \"x\""},
        "created_at": NOW,
        "updated_at": NOW.astimezone(ELSEWHERE),
        "lease_ttl": None,
        "created_by_token_id": None,
        "idempotency_key": None,
    }
    return values | changes


REQUEST_CASES = [
    {},
    {"preemptible": False, "labels": {}, "lease_ttl": 60, "idempotency_key": "k-1"},
    {"created_at": datetime(1999, 12, 31, 23, 59, 59, tzinfo=ELSEWHERE), "attempt": 3},
]


@pytest.mark.parametrize("changes", REQUEST_CASES)
def test_insert_writes_what_execute_writes(db: Database, changes: dict[str, Any]) -> None:
    statement = insert(schema.request)
    with db.write() as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        direct_values = _request(component.id, "direct", **changes)
        if changes.get("idempotency_key"):
            direct_values["idempotency_key"] = "direct-key"
        Direct(statement).execute(connection, direct_values)
        connection.execute(statement, _request(component.id, "core", **changes))
        direct = _stored(connection, schema.request, "id", "direct")
        core = _stored(connection, schema.request, "id", "core")
    direct.pop("idempotency_key"), core.pop("idempotency_key")
    assert direct == core
    with db.read() as connection:  # and read back through the records, the same values
        got = repo.get_request(connection, "direct")
    assert got.labels == direct_values["labels"]
    assert got.created_at == direct_values["created_at"]
    assert got.preemptible is direct_values["preemptible"]


def test_update_and_execute_many_write_what_execute_writes(db: Database) -> None:
    events = [
        repo.event_row("allocated", "on pool ä", NOW, data={"by": None, "n": [1, 2]}),
        repo.event_row("released", "x", NOW.astimezone(ELSEWHERE)),
    ]
    with db.write() as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        for id_ in ("direct", "core"):
            connection.execute(insert(schema.request), _request(component.id, id_))
        change = {"status": "released", "finished_at": NOW + timedelta(seconds=1.5),
                  "status_reason": None, "preemptible": False}
        statement = update(schema.request).where(schema.request.c.id == bindparam("_id"))
        Direct(statement).execute(
            connection, {"_id": "direct", **change}, must_change=("request", "direct")
        )
        connection.execute(statement, {"_id": "core", **change})
        assert _stored(connection, schema.request, "id", "direct") == _stored(
            connection, schema.request, "id", "core"
        )
        Direct(insert(schema.event)).execute_many(connection, events)
        connection.execute(insert(schema.event), events)
        rows = connection.exec_driver_sql(
            "SELECT at, kind, request_id, pool_id, message, data FROM event ORDER BY id"
        ).all()
    assert len(rows) == 4
    assert rows[:2] == rows[2:]


def test_changed_rows_and_scalars(db: Database) -> None:
    set_status = Direct(update(schema.request).where(schema.request.c.id == bindparam("_id")))
    with db.write() as connection:
        set_status.execute(connection, {"_id": "nobody", "status": "queued"})  # may change none
        with pytest.raises(NotFound, match="no request 'nobody'"):
            set_status.execute(
                connection, {"_id": "nobody", "status": "queued"}, must_change=("request", "nobody")
            )
    with db.write() as connection:
        assert Direct(text("SELECT 41 + 1")).scalar(connection) == 42
        assert Direct(text("SELECT 1 WHERE 1 = 0")).scalar(connection) is None
        made = Direct(text("SELECT count(*) FROM component")).scalar(
            connection, preceded_by=[_insert_component("a"), _insert_component("b")]
        )
        assert made == 2


def _insert_component(name: str) -> Direct:
    return Direct(text(
        "INSERT INTO component (id, name, type, created_at) "
        f"VALUES ('{name}', '{name}', 'orchestrator', '2025-01-01 00:00:00+00:00')"
    ))


def test_a_statement_needing_parameters_it_is_not_given_is_refused(db: Database) -> None:
    statement = update(schema.request).where(schema.request.c.id == bindparam("_id"))
    with db.write() as connection, pytest.raises(ValueError, match="_id"):
        Direct(statement).execute(connection, {"status": "queued"})


# Deferred writes (PostgreSQL): queued, then sent together when the transaction next needs
# the database.

ON_POSTGRESQL = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
SET_STATUS_STATEMENT = update(schema.request).where(schema.request.c.id == bindparam("_id"))
SET_STATUS = Direct(SET_STATUS_STATEMENT)


def _count(connection: Connection) -> int:
    return int(connection.execute(select(func.count()).select_from(schema.request)).scalar_one())


@ON_POSTGRESQL
def test_deferred_writes_are_seen_by_the_next_statement_and_committed(db: Database) -> None:
    with db.write(defer=True) as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))
        SET_STATUS.execute(connection, {"_id": "a", "status": "released"}, ("request", "a"))
        assert _count(connection) == 1  # a SQLAlchemy statement: the queue went first
        Direct(insert(schema.request)).execute(connection, _request(component.id, "b"))
        assert Direct(text("SELECT count(*) FROM request")).scalar(connection) == 2
        Direct(insert(schema.request)).execute(connection, _request(component.id, "c"))
    with db.read() as connection:  # the last one was sent at the end, before the commit
        ids, _, _ = repo.request_page(connection)
        assert [r.status.value for r in repo.requests_by_id(connection, ids)] == [
            "released", "queued", "queued"
        ]


@ON_POSTGRESQL
@pytest.mark.parametrize("failing", ["no row changed", "duplicate key"])
def test_a_failed_deferred_write_fails_the_transaction_when_sent(
    db: Database, failing: str
) -> None:
    with pytest.raises(DeferredWriteFailed) as failed, db.write(defer=True) as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))
        if failing == "no row changed":
            SET_STATUS.execute(connection, {"_id": "x", "status": "queued"}, ("request", "x"))
        else:
            Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))
        Direct(insert(schema.request)).execute(connection, _request(component.id, "b"))
    cause = failed.value.__cause__
    if failing == "no row changed":  # checked in the database, which refuses to commit
        assert isinstance(cause, DataError) and "division by zero" in str(cause)
    else:
        assert isinstance(cause, IntegrityError)
    with db.read() as connection:  # rolled back: nothing of it was committed
        assert _count(connection) == 0
        assert repo.list_components(connection) == []


@ON_POSTGRESQL
def test_a_write_expecting_the_generation_commits_only_if_it_is_that(db: Database) -> None:
    with db.write() as connection:
        seen = generation(connection)
    for last_seen in (seen - 1, seen + 1):
        with pytest.raises(DeferredWriteFailed), db.write(
            defer=True, last_seen=last_seen
        ) as connection:
            assert generation(connection) == last_seen + 1
            repo.insert_component(connection, f"c{last_seen}", ComponentType.ORCHESTRATOR, NOW)
    with db.write(defer=True, last_seen=seen) as connection:
        assert generation(connection) == seen + 1
        repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
    with db.read() as connection:
        assert [c.name for c in repo.list_components(connection)] == ["c"]
    with db.write() as connection:
        assert generation(connection) == seen + 2


async def _collected(db: Database, last_seen: int, write: Callable[[Connection], None]) -> None:
    """``write`` in ``db.write_async``, on a loop of its own (within 30 s: fails, not hangs)."""
    try:
        async with asyncio.timeout(30), db.write_async(last_seen) as connection:
            write(connection)
    finally:
        await db.close_async()


@ON_POSTGRESQL
def test_what_the_loop_sends_writes_what_execute_writes(db: Database) -> None:
    """Its values sent apart from its prepared statements, in PostgreSQL's text format
    (``AsyncWriter``), as the server's loop sends a batch: stored as ``connection.execute``
    stores them."""
    events = [
        repo.event_row("allocated", "on pool ä; it's", NOW, data={"by": None, "n": [1, 2]}),
        repo.event_row("released", "x\ny", NOW.astimezone(ELSEWHERE)),
    ]
    change = {"status": "released", "finished_at": NOW + timedelta(seconds=1.5),
              "status_reason": "a 'quoted' reason", "preemptible": False}
    with db.write() as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        for n, changes in enumerate(REQUEST_CASES):
            connection.execute(insert(schema.request), _request(component.id, f"core{n}",
                                                                **changes))
            connection.execute(SET_STATUS_STATEMENT, {"_id": f"core{n}", **change})
        connection.execute(insert(schema.event), events)
        seen = generation(connection)

    def write(connection: Connection) -> None:
        for n, changes in enumerate(REQUEST_CASES):
            changes = changes | ({"idempotency_key": "k-2"} if "idempotency_key" in changes
                                 else {})
            Direct(insert(schema.request)).execute(
                connection, _request(component.id, f"script{n}", **changes)
            )
            SET_STATUS.execute(connection, {"_id": f"script{n}", **change},
                               ("request", f"script{n}"))
        Direct(insert(schema.event)).execute_many(connection, events)

    asyncio.run(_collected(db, seen, write))
    with db.read() as connection:
        for n in range(len(REQUEST_CASES)):
            script = _stored(connection, schema.request, "id", f"script{n}")
            core = _stored(connection, schema.request, "id", f"core{n}")
            script.pop("idempotency_key"), core.pop("idempotency_key")
            assert script == core
        rows = connection.exec_driver_sql(
            "SELECT at, kind, request_id, pool_id, message, data FROM event ORDER BY id"
        ).all()
    assert len(rows) == 4
    assert rows[:2] == rows[2:]


@ON_POSTGRESQL
@pytest.mark.parametrize("failing", ["no row changed", "duplicate key", "stale generation"])
def test_what_the_loop_sends_fails_whole(db: Database, failing: str) -> None:
    with db.write() as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        seen = generation(connection)

    def write(connection: Connection) -> None:
        Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))
        if failing == "no row changed":
            SET_STATUS.execute(connection, {"_id": "x", "status": "queued"}, ("request", "x"))
        elif failing == "duplicate key":
            Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))

    last_seen = seen - 1 if failing == "stale generation" else seen
    with pytest.raises(DeferredWriteFailed) as failed:
        asyncio.run(_collected(db, last_seen, write))
    cause = failed.value.__cause__
    assert isinstance(cause, IntegrityError if failing == "duplicate key" else DataError)
    with db.read() as connection:
        assert _count(connection) == 0


@ON_POSTGRESQL
def test_a_collected_write_that_needs_the_database_sends_nothing(db: Database) -> None:
    """A read inside it would wait for the network: ``WouldWait``, before anything is sent,
    and the writer's connection is as it was."""
    with db.write() as connection:
        component = repo.insert_component(connection, "c", ComponentType.ORCHESTRATOR, NOW)
        seen = generation(connection)

    def write(connection: Connection) -> None:
        Direct(insert(schema.request)).execute(connection, _request(component.id, "a"))
        _count(connection)

    with pytest.raises(WouldWait):
        asyncio.run(_collected(db, seen, write))
    with db.write() as connection:
        assert _count(connection) == 0
        assert generation(connection) == seen + 1


def test_the_event_log_insert_asks_for_nothing_back() -> None:
    """PostgreSQL would send back each event's new id (implicit RETURNING), which nobody
    reads."""
    keys = tuple(repo.event_row("allocated", "m", NOW))
    for dialect in (postgresql.psycopg.dialect(), sqlite.pysqlite.dialect()):
        sql = _compile(repo._INSERT_EVENT._statement, dialect, keys).sql
        assert sql.startswith("INSERT INTO event") and "RETURNING" not in sql


def test_named_parameters_are_numbered_in_order_of_first_use() -> None:
    """The loop's pipeline (``AsyncWriter``) prepares psycopg's SQL in libpq's style."""
    sql = "UPDATE t SET a = %(x)s, b = %(y)s WHERE c = %(x)s AND d LIKE 'q%%'"
    assert _numbered(sql) == (
        b"UPDATE t SET a = $1, b = $2 WHERE c = $1 AND d LIKE 'q%'", ("x", "y")
    )


def test_a_value_of_a_type_no_column_has_is_refused_not_guessed() -> None:
    assert _text(ComponentType.ORCHESTRATOR, ()) == b"orchestrator"
    assert [_text(v, ()) for v in (None, True, False, -(2**63))] == [
        None, b"t", b"f", b"-9223372036854775808"
    ]
    with pytest.raises(TypeError, match="no text format for a float value"):
        _text(0.5, ())


@ON_POSTGRESQL
def test_what_the_loop_sends_may_be_more_than_the_socket_takes_at_once(
    db: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline is flushed in parts, the server's answers read meanwhile: 8 MiB of
    events through a socket whose send buffer takes 64 KiB, while the server, its first
    INSERT waiting for a lock on the table, reads none of it for a second. (Without the lock a
    loaded machine once sent slower than the server read, and never had to wait.)"""
    waits: list[bool] = []
    ready, connect = direct._ready, db._connect_async

    async def counted(loop: Any, fileno: int, write: bool) -> bool:
        waits.append(write)
        return await ready(loop, fileno, write)

    async def small_buffer() -> Any:
        connection = await connect()
        with socket.fromfd(connection.pgconn.socket, socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # the same socket
        return connection

    monkeypatch.setattr(direct, "_ready", counted)
    monkeypatch.setattr(db, "_connect_async", small_buffer)
    with db.write() as connection:
        seen = generation(connection)
    events = [repo.event_row("allocated", f"m{n}", NOW, data={"pad": "x" * 32_768})
              for n in range(256)]

    def write(connection: Connection) -> None:
        Direct(insert(schema.event)).execute_many(connection, events)

    locker = create_engine(database_url)
    try:
        with locker.connect() as other:
            other.exec_driver_sql("LOCK TABLE event IN SHARE MODE")
            unlock = threading.Timer(1.0, other.commit)
            unlock.start()
            asyncio.run(_collected(db, seen, write))
            unlock.join()
    finally:
        locker.dispose()
    with db.read() as connection:
        stored = connection.exec_driver_sql(
            "SELECT count(*), sum(length(data::text)) FROM event"
        ).one()
    assert stored == (256, 256 * len('{"pad": ""}') + 256 * 32_768)
    assert True in waits  # it waited to send more
