"""PostgreSQL only: the advisory write lock, transaction settings, several processes at once.

The counterparts of test_store.py's SQLite-only tests (PRAGMAs, BEGIN IMMEDIATE, processes).
Skipped when PostgreSQL is unreachable, failed instead under CI (see conftest.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, event, func, make_url, select
from sqlalchemy.exc import OperationalError

from fairpool import Client, NotGranted
from fairpool.api.app import PREFIX, Api, create_app
from fairpool.api.notify import PostgresChangeNotifier, notifier_for
from fairpool.api.reconciler import Reconciler
from fairpool.errors import Conflict, Unreachable
from fairpool.service import Service
from fairpool.store import db as store_db
from fairpool.store import repo, schema
from fairpool.store import trees as store_trees
from fairpool.store.db import (
    TCP_DEFAULTS,
    WRITE_LOCK_KEY,
    Database,
    generation,
    migration_config,
)
from fairpool.trees_service import TreesService
from fairpool.views import RequestView
from tests.conftest import POSTGRES_CONNINFO, PostgresServer
from tests.test_busy_routes import call
from tests.test_service import team_service
from tests.test_store import (
    NOW,
    PROCESSES,
    WRITES_PER_PROCESS,
    _count_then_append,
    _open_at_once,
    _run_processes,
)


@pytest.fixture
def url(new_database: Callable[..., str]) -> str:
    """A new PostgreSQL database at the schema head."""
    return new_database("postgresql", migrated=True)


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    with Database.open(url) as database:
        yield database


@pytest.fixture
def other(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain session on the same database, outside fairpool."""
    dbname = make_url(url).database
    with psycopg.connect(POSTGRES_CONNINFO, dbname=dbname, autocommit=True) as connection:
        yield connection


def _lock_is_free(other: psycopg.Connection[Any]) -> bool:
    """Whether the write lock is free now; takes it and lets go of it at once."""
    with other.transaction():
        row = other.execute("SELECT pg_try_advisory_xact_lock(%s)", [WRITE_LOCK_KEY]).fetchone()
    assert row is not None
    return bool(row[0])


@contextmanager
def _protocol(tmp_path: Path, on: str = "begin") -> Iterator[list[list[str]]]:
    """The protocol messages of the transactions any engine begins meanwhile (``on`` a
    connection's "engine_connect": of the connections checked out), in order, as libpq
    traces them: [direction ("F" from us, "B" from the server), length, type, fields...].
    Statements fairpool runs on the DBAPI cursor included."""
    trace = (tmp_path / "libpq.trace").open("w+")
    traced: list[Any] = []

    def begin(connection: Connection) -> None:
        dbapi_connection: Any = connection.connection.driver_connection
        if dbapi_connection not in traced:
            dbapi_connection.pgconn.trace(trace.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            traced.append(dbapi_connection)

    messages: list[list[str]] = []
    event.listen(Engine, on, begin)
    try:
        yield messages
    finally:
        event.remove(Engine, on, begin)
        for dbapi_connection in traced:
            if not dbapi_connection.closed:
                dbapi_connection.pgconn.untrace()
        trace.seek(0)
        messages.extend(line.rstrip("\n").split("\t") for line in trace)
        trace.close()


def _sql(messages: list[list[str]]) -> list[str]:
    """The statements sent, transaction control (psycopg sends BEGIN itself) left out."""
    statements = []
    for fields in messages:
        if fields[0] == "F" and fields[2] in ("Query", "Parse"):
            # Query: "SQL"; Parse: "statement name" "SQL" ...
            sql = fields[3].split('"')[1 if fields[2] == "Query" else 3]
            if sql.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
                statements.append(sql)
    return statements


def _round_trips(messages: list[list[str]]) -> int:
    """How many times we sent and then waited for the server's answer."""
    directions = [fields[0] for fields in messages if fields[0] in ("F", "B")]
    return sum(1 for sent, then in itertools.pairwise(directions) if (sent, then) == ("F", "B"))


def test_write_holds_the_lock_until_commit_or_rollback(
    db: Database, other: psycopg.Connection[Any]
) -> None:
    assert _lock_is_free(other)
    with db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
        assert not _lock_is_free(other)
    assert _lock_is_free(other)
    with pytest.raises(RuntimeError), db.write():
        assert not _lock_is_free(other)
        raise RuntimeError
    assert _lock_is_free(other)


def test_the_lock_is_the_first_statement_of_a_write_and_reads_take_none(
    db: Database, tmp_path: Path
) -> None:
    for defer in (False, True):
        with _protocol(tmp_path) as messages, db.write(defer=defer) as connection:
            repo.list_pools(connection)
        statements = _sql(messages)
        assert statements[0] == f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})"
        assert sum("pg_advisory" in statement for statement in statements) == 1
    with _protocol(tmp_path) as messages, db.read() as connection:
        repo.list_pools(connection)
    statements = _sql(messages)
    assert statements and not any("pg_advisory" in statement for statement in statements)


def test_a_read_of_one_statement_is_that_statement_alone(db: Database, tmp_path: Path) -> None:
    """``read(statement=True)``: no BEGIN nor COMMIT around the statement, one round trip
    (a transaction's read is three)."""
    unknown = "00000000-0000-4000-8000-000000000000"
    for statement, control, round_trips in ((True, [], 1), (False, ["BEGIN", "COMMIT"], 3)):
        with _protocol(tmp_path, on="engine_connect") as messages:
            with db.read(statement=statement) as connection:
                assert repo.request_status(connection, unknown) is None
        # Transaction control goes as simple queries; the statement as Parse, Bind, Execute.
        queries = [fields[3].split()[0].strip('"') for fields in messages
                   if fields[0] == "F" and fields[2] == "Query"]
        assert queries == control
        assert _round_trips(messages) == round_trips


def test_a_write_of_the_service_is_one_round_trip(url: str, tmp_path: Path) -> None:
    """BEGIN, the lock, the generation (checked), the writes and COMMIT, sent together,
    however many statements the write runs; after another writer's commit, the one that
    finds the generation moved on runs again, reading the state anew."""
    with Database.open(url) as db, Database.open(url) as other:
        service = Service(db)
        service.create_pool("gpus", {"gpu": 8})
        service.attach_policy("gpus", "team")
        service.release_request(service.create_request("team", demand={"gpu": 1}).id)
        with _protocol(tmp_path) as create:
            held = service.create_request("team", demand={"gpu": 1}, labels={"a": "b"})
        with _protocol(tmp_path) as release:
            service.release_request(held.id)
        Service(other, service.clock).update_pool("gpus", capacity={"gpu": 1})
        with _protocol(tmp_path) as after_other:
            views = [service.create_request("team", demand={"gpu": 1}) for _ in range(2)]
    assert held.status == "allocated"
    executed = sum(fields[:1] + fields[2:3] == ["F", "Execute"] for fields in create)
    # the lock, the generation, the request, its resources, allocation and status, two events
    assert executed >= 8
    assert _round_trips(create) == 1
    assert _round_trips(release) == 1
    assert _round_trips(after_other) > 3
    assert [view.status for view in views] == ["allocated", "queued"]  # the new capacity


def test_a_queued_write_runs_on_the_loop_awaiting_its_one_round_trip(
    url: str, tmp_path: Path
) -> None:
    """``drive_writes_on(loop)``: a write queued from the loop runs there and its round trip
    is awaited on the loop's own connection, when the batch starts from the state the last
    one committed. Otherwise, or when the batch fails, a thread runs it again, as without
    the loop: after another writer's commit the state is read anew, and a refusal is
    decided on the current state."""
    ran_on: list[str] = []
    with team_service(url, gpus=2) as service, Database.open(url) as other:
        db, write = service.db, Api(service, tick=3600.0).write  # as the server's routes
        service.on_pass = lambda *_: ran_on.append(threading.current_thread().name)

        async def main() -> list[RequestView]:
            service.drive_writes_on(asyncio.get_running_loop())
            try:
                first = await write(service.create_request, "team", demand={"gpu": 1})
                second = await write(service.create_request, "team", demand={"gpu": 1})
                assert db._async_writer is not None
                pgconn = db._async_writer.connection.pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
                released = await write(service.release_request, first.id)
                pgconn.untrace()
                Service(other, service.clock).update_pool("gpus", capacity={"gpu": 3})
                # Believed: 1 of 2 units free, one more request to allocate: allocated either
                # way. The one after it would queue on the believed state: it must not.
                third = await write(service.create_request, "team", demand={"gpu": 1})
                fourth = await write(service.create_request, "team", demand={"gpu": 1})
                with pytest.raises(Conflict, match="released, not allocated"):
                    await write(service.release_request, first.id)
                return [first, second, released, third, fourth]
            finally:
                await service.stop_driving()

        with (tmp_path / "libpq.trace").open("w+") as trace:
            views = asyncio.run(asyncio.wait_for(main(), 30))
            trace.seek(0)
            messages = [line.rstrip("\n").split("\t") for line in trace]
        assert db._async_writer is None  # closed by stop_driving
    assert [view.status for view in views] == [
        "allocated", "allocated", "released", "allocated", "allocated"
    ]
    loop, thread = "MainThread", "asyncio_0"
    # After the other writer's commit, the thread; the refused release ran no pass.
    assert ran_on == [loop, loop, loop, thread, loop]
    assert _round_trips(messages) == 1
    # One pipeline: the statements prepared once per connection (here parsed are the two
    # UPDATEs that a release is the first write to run), each one's values bound apart from
    # it, then one Sync.
    sent = [fields[2:] for fields in messages if fields[0] == "F"]
    assert [fields[0] for fields in sent].count("Execute") == 7  # BEGIN ... COMMIT
    assert [fields[0] for fields in sent if fields[0] == "Sync"] == ["Sync"] == sent[-1]
    parsed = [fields[1] for fields in sent if fields[0] == "Parse"]
    assert len(parsed) == 2
    assert "UPDATE allocation" in parsed[0] and "UPDATE request" in parsed[1]
    assert "$1" in parsed[0] and "2026" not in parsed[0]  # the values go apart


def test_a_long_poll_finds_a_request_still_queued_on_the_loop(
    url: str, other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Api.decided``: that a request still waits is read on the loop's own connection, its
    round trip awaited (``Database.scalar_async``); a decided request, a prefix, or a failed
    connection, on a worker thread, which reads the request without its status first. One connection serves the loop's reads, opened
    once however many ask at once, and reopened after it is lost."""
    threaded: list[str] = []
    status_read_by_a_thread: list[str] = []
    with team_service(url, gpus=1) as service:
        api, read_decided = Api(service, tick=3600.0), service.read_decided
        request_status = repo.request_status

        def on_a_thread(ref: str, wait: bool = True) -> Any:
            threaded.append(ref)
            return read_decided(ref, wait)

        def status_on_a_thread(connection: Connection, ref: str) -> Any:
            status_read_by_a_thread.append(ref)
            return request_status(connection, ref)

        monkeypatch.setattr(service, "read_decided", on_a_thread)
        monkeypatch.setattr(repo, "request_status", status_on_a_thread)
        held = service.create_request("team", demand={"gpu": 1})
        queued = service.create_request("team", demand={"gpu": 1})

        async def main() -> list[tuple[str, RequestView | None]]:
            try:
                found = list(await asyncio.gather(*(api.decided(queued.id) for _ in range(4))))
                opened = [pid for pid, in other.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'SELECT request.status%'"
                )]
                assert len(opened) == 1
                found.append(await api.decided(held.id))
                found.append(await api.decided(queued.id[:8]))
                other.execute("SELECT pg_terminate_backend(%s)", opened)
                found.append(await api.decided(queued.id))  # the thread, then reopened
                found.append(await api.decided(queued.id))
                return found
            finally:
                await service.db.close_async()

        found = asyncio.run(asyncio.wait_for(main(), 30))
    assert found[:4] == [(queued.id, None)] * 4
    assert found[4][0] == held.id and found[4][1] is not None
    assert found[4][1].status == "allocated"
    assert found[5:] == [(queued.id, None)] * 3
    assert threaded == [held.id, queued.id[:8], queued.id]
    assert status_read_by_a_thread == []  # the thread does not ask the status again


def terminate(other: psycopg.Connection[Any], pid: int) -> None:
    """End backend ``pid`` and wait until it is gone (its goodbye sent)."""
    other.execute("SELECT pg_terminate_backend(%s)", [pid])
    while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
        time.sleep(0.01)


def test_a_lost_loop_connection_fails_the_write_and_the_next_one_reconnects(
    url: str, other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a COMMIT sent on a lost connection took effect is unknown: the write fails
    (as on the thread's connection) rather than run twice. (Lost as the write goes out: a
    loss while idle is seen before, below.)"""
    monkeypatch.setattr(store_db, "closed_while_idle", lambda pgconn: False)
    with team_service(url, gpus=2) as service:
        db, write = service.db, Api(service, tick=3600.0).write

        async def main() -> tuple[RequestView, RequestView]:
            service.drive_writes_on(asyncio.get_running_loop())
            try:
                for _ in range(2):  # the second runs on the loop's connection
                    held = await write(service.create_request, "team", demand={"gpu": 1})
                assert db._async_writer is not None
                pid = db._async_writer.connection.info.backend_pid
                other.execute("SELECT pg_terminate_backend(%s)", [pid])
                with pytest.raises(OperationalError):
                    await write(service.release_request, held.id)
                return held, await write(service.release_request, held.id)
            finally:
                await service.stop_driving()

        held, released = asyncio.run(asyncio.wait_for(main(), 30))
    assert held.status == "allocated" and released.status == "released"


@pytest.mark.parametrize("needs_the_database", [False, True])
def test_a_lost_writer_connection_fails_a_deferred_write_as_unreachable(
    url: str, db: Database, other: psycopg.Connection[Any], needs_the_database: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As ``Unreachable`` (a 503 the SDK retries), not the ``PendingRollbackError``
    that dropping the lost connection's queue raised over it (a 500), saying whether the
    COMMIT went out with the writes; the next write reconnects. (Lost as the write goes
    out: a loss while idle is seen before, below.)"""
    monkeypatch.setattr(store_db, "closed_while_idle", lambda pgconn: False)
    with db.write() as connection:
        seen = generation(connection)
        pid = connection.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    other.execute("SELECT pg_terminate_backend(%s)", [pid])
    outcome = "nothing was written" if needs_the_database else "a COMMIT sent may have taken"
    with pytest.raises(Unreachable, match=f"^lost the connection .*; {outcome}"), \
            db.write(defer=True, last_seen=seen + 1) as writer:
        repo.insert_events(writer, [repo.event_row("note", "queued", NOW)])
        if needs_the_database:  # sends the queue first
            writer.execute(select(schema.pool.c.id)).all()
    with db.write() as connection:
        repo.insert_events(connection, [repo.event_row("note", "kept", NOW)])
    with db.read() as connection:
        assert [e.message for e in repo.list_events(connection)] == ["kept"]


def test_an_operation_meeting_a_lost_connection_fails_with_its_error(
    url: str, other: psycopg.Connection[Any]
) -> None:
    """An operation that fails in a batch whose state is only believed current sends the
    queued writes to tell a stale state from its own failure; on a lost connection that
    raised PendingRollbackError (a 500) over the lost connection's error (a 503)."""
    with team_service(url, gpus=2) as service:
        service.create_request("team", demand={"gpu": 1})  # the next batch starts believed

        def change(tx: Any) -> None:
            pid = tx.conn.connection.dbapi_connection.info.backend_pid
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
            tx.conn.execute(select(1))  # a read the operation needs: the connection is lost

        with pytest.raises(Unreachable, match=r"; nothing was written$"):
            service._write(change, tracked=True)
        assert service.create_request("team", demand={"gpu": 1}).status == "allocated"


@contextmanager
def out_of_reach(url: str) -> Iterator[None]:
    """The database at ``url`` refuses connections and its sessions are ended (a restart, a
    failover), until the block ends."""
    dbname = make_url(url).database
    with psycopg.connect(POSTGRES_CONNINFO, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = %s", [dbname])
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')


def test_a_wait_on_the_database_rides_out_an_outage_and_says_what_is_left_when_it_gives_up(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Working on the database directly (``--database-url``), a wait polls on while the
    database cannot be reached, as a wait on a server does while the server cannot, and gets
    the units once it is back and they are released; before, the first refused connection
    ended it, leaving its request queued. Out of reach for longer than ``WAIT_OUTAGE``:
    ``Unreachable``, naming the request left queued."""
    caplog.set_level("INFO", logger="fairpool")  # the outage's end is news, not a warning
    with team_service(url, gpus=1) as admin, Client(database_url=url) as client:
        holder = admin.create_request("team", demand={"gpu": 1})
        queued = client.submit({"gpu": 1}, component="team", lease_ttl=None)
        found: list[Any] = []

        def wait() -> None:
            try:
                found.append(client.wait(queued.id, 60))
            except Exception as error:  # the assertion below shows it
                found.append(error)

        waiter = threading.Thread(target=wait)
        with out_of_reach(url):
            waiter.start()
            time.sleep(2)  # several polls refused
        admin.release_request(holder.id)
        waiter.join(timeout=60)
        assert [getattr(r, "status", r) for r in found] == ["allocated"]
        assert "still waiting, for up to 120 s" in caplog.text
        assert "The fairpool database answers again" in caplog.text

        client.release(queued.id)
        admin.create_request("team", demand={"gpu": 1})
        left = client.submit({"gpu": 1}, component="team", lease_ttl=None)
        monkeypatch.setattr("fairpool.outage.WAIT_OUTAGE", 1.0)
        with out_of_reach(url), pytest.raises(
            Unreachable, match=f"resource request `{left.id}` may still be queued there "
                               f".*fairpool resource-request cancel {left.id}"
        ):
            client.wait(left.id, 60)


def test_a_database_host_that_does_not_answer_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that takes the connection and then says nothing (hung, or failing over):
    ``Unreachable`` after ``CONNECT_TIMEOUT``. libpq's default waits for ever, a wait with
    it far past ``WAIT_OUTAGE``."""
    monkeypatch.setattr(store_db, "CONNECT_TIMEOUT", 2)  # libpq's least
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody reads
        port = silent.getsockname()[1]
        failed: list[BaseException] = []

        def open_it() -> None:
            try:
                Database.open(f"postgresql+psycopg://fp@127.0.0.1:{port}/fp").close()
            except BaseException as error:  # the assertion below shows it
                failed.append(error)

        opener = threading.Thread(target=open_it, daemon=True)
        started = time.monotonic()
        opener.start()
        opener.join(timeout=30)
        assert not opener.is_alive(), "still connecting after 30 s"
    assert time.monotonic() - started < 10
    [error] = failed
    assert isinstance(error, Unreachable) and "timeout" in str(error), error


def test_a_writer_connection_lost_while_idle_is_replaced_before_the_next_write(
    url: str, other: psycopg.Connection[Any]
) -> None:
    """A backend terminated between writes (a restart, an idle timeout): the next write on
    the thread, then on the loop, runs on a new connection instead of failing (a 503 while
    ``/readyz`` said ready)."""
    with team_service(url, gpus=2) as service:
        db, write = service.db, Api(service, tick=3600.0).write
        held = service.create_request("team", demand={"gpu": 1})
        assert db._writer is not None
        terminate(other, db._writer.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
        assert service.release_request(held.id).status == "released"

        async def main() -> RequestView:
            service.drive_writes_on(asyncio.get_running_loop())
            try:
                for _ in range(2):  # the second runs on the loop's connection
                    held = await write(service.create_request, "team", demand={"gpu": 1})
                assert db._async_writer is not None
                terminate(other, db._async_writer.connection.info.backend_pid)
                return await write(service.release_request, held.id)
            finally:
                await service.stop_driving()

        assert asyncio.run(asyncio.wait_for(main(), 30)).status == "released"


def terminate_all(other: psycopg.Connection[Any]) -> int:
    """End every other backend on ``other``'s database, as a restart or a failover ends a
    client's connections, and wait until they are gone: how many there were."""
    pids = [pid for pid, in other.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
    )]
    for pid in pids:
        terminate(other, pid)
    return len(pids)


def lose_all(other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, seen: bool) -> int:
    """``terminate_all``; unless ``seen``, the next poll of an idle connection's socket sees
    nothing, as when a connection is closed just as it is handed out (its server's goodbye
    still on its way)."""
    lost = terminate_all(other)
    if not seen:
        polls = itertools.count()
        poll = store_db.closed_while_idle
        monkeypatch.setattr(store_db, "closed_while_idle",
                            lambda pgconn: next(polls) > 0 and poll(pgconn))
    return lost


@pytest.mark.parametrize("seen", [True, False], ids=["seen", "unseen"])
def test_a_read_after_its_connection_was_lost_runs_on_a_new_one(
    db: Database, other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, seen: bool
) -> None:
    """Connections closed by the server between reads: the next read runs on a new one,
    where it raised OperationalError (the SDK's first read after a restart). A connection
    the pool would hand out is polled first; one lost unseen is found by the read's BEGIN,
    sent again on a new connection. A read of one statement has no BEGIN: lost unseen, it
    fails in one line as ``Unreachable``, and the next one reconnects."""
    with db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
    for _ in range(2):
        assert lose_all(other, monkeypatch, seen) >= 1
        with db.read() as connection:
            assert [pool.name for pool in repo.list_pools(connection)] == ["gpus"]
    assert lose_all(other, monkeypatch, seen) == 1
    if not seen:
        with pytest.raises(Unreachable, match=(
            r"^lost the connection to the database postgresql\+psycopg://\S+: "
            "terminating connection due to administrator command$"
        )), db.read(statement=True) as connection:
            repo.list_pools(connection)
    with db.read(statement=True) as connection:
        assert [pool.name for pool in repo.list_pools(connection)] == ["gpus"]


def test_a_read_whose_connection_is_lost_at_its_commit_keeps_its_answer(
    db: Database, other: psycopg.Connection[Any]
) -> None:
    """Everything it read came from one snapshot: its answer stands, where it raised (a
    server's reconciler logged a failed pass)."""
    with db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
    with db.read() as connection:
        pools = repo.list_pools(connection)
        terminate(other, connection.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
    assert [pool.name for pool in pools] == ["gpus"]

@pytest.mark.parametrize("seen", [True, False], ids=["seen", "unseen"])
def test_a_write_after_its_connections_were_lost_runs_on_new_ones(
    db: Database, other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, seen: bool
) -> None:
    """The kept writer connection and the pool's lost between writes: the next write runs
    on a new one. Lost unseen, the first round trip (BEGIN, the lock, the generation,
    nothing that commits) finds it, and it is sent again on a new connection."""
    for defer in (False, False, True):
        with db.write(defer=defer) as connection:  # kept
            repo.insert_events(connection, [repo.event_row("note", f"{defer}", NOW)])
        with db.read() as connection:  # the pool keeps one, idle
            repo.list_events(connection)
        assert lose_all(other, monkeypatch, seen) == 2
    with db.write() as connection:
        repo.insert_events(connection, [repo.event_row("note", "last", NOW)])
    with db.read() as connection:
        assert [e.message for e in repo.list_events(connection)] == [
            "False", "False", "True", "last"]


@pytest.mark.parametrize("believed", [False, True], ids=["begun", "believed"])
def test_a_write_whose_connection_is_lost_while_it_waits_for_the_lock(
    db: Database, other: psycopg.Connection[Any], believed: bool
) -> None:
    """Its backend terminated as it waits for the write lock. Begun alone (BEGIN, the lock
    and the generation: one round trip, no COMMIT) the write runs again on a new connection;
    believed current, its COMMIT went out with them: it fails as ``Unreachable``, saying it
    may have taken effect (a 503 a server's client retries, a heartbeat ``fairpool run``
    rides out), where it raised OperationalError."""
    with db.write() as connection:
        seen = generation(connection)
    outcome: list[object] = []

    def write() -> None:
        try:
            with db.write(defer=believed, last_seen=seen + 1 if believed else None) as writer:
                repo.insert_events(writer, [repo.event_row("note", "written", NOW)])
            outcome.append("written")
        except Exception as error:
            outcome.append(error)

    # Another session holds the lock (``other``'s transaction would keep one snapshot of
    # pg_stat_activity).
    with psycopg.connect(POSTGRES_CONNINFO, dbname=other.info.dbname) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [WRITE_LOCK_KEY])
        thread = threading.Thread(target=write)
        thread.start()
        waiting: list[tuple[int]] = []
        while not waiting:
            time.sleep(0.01)
            waiting = other.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            ).fetchall()
        terminate(other, waiting[0][0])
    thread.join(30)
    if believed:
        assert len(outcome) == 1 and isinstance(outcome[0], Unreachable), outcome
        assert str(outcome[0]).endswith("; a COMMIT sent may have taken effect")
    else:
        assert outcome == ["written"]


def test_writes_whose_connections_are_lost_at_any_moment_fail_as_unreachable(
    url: str, other: psycopg.Connection[Any]
) -> None:
    """Backends terminated at random moments of a stream of writes: each write fails as
    ``Unreachable`` or succeeds. Over a FATAL error met in a pipeline psycopg raised
    "cannot exit pipeline mode while busy" and took the connection for alive, so that a
    quarter of the failures were no lost connection's: an OperationalError (``fairpool
    run`` died of it), and the pool logged an error failing to reset the connection."""
    failures: list[Exception] = []
    stop = threading.Event()

    def writes(service: Service) -> None:
        while not stop.is_set():
            try:
                service.release_request(service.create_request("team", demand={"gpu": 1}).id)
            except Exception as error:
                failures.append(error)

    with team_service(url, gpus=100) as service:  # a release that failed holds its unit
        thread = threading.Thread(target=writes, args=(service,))
        thread.start()
        try:
            while len(failures) < 30:
                time.sleep(0.01)
                other.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        finally:
            stop.set()
            thread.join(30)
        assert [f for f in failures if not isinstance(f, Unreachable)] == []
        assert service.create_request("team", demand={"gpu": 1}).status == "allocated"

def test_the_sdk_on_the_database_rides_out_lost_connections(
    url: str, other: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Client(database_url=...)``: after its connections are lost (a restart, a failover)
    its reads and heartbeats run on new ones, where they raised OperationalError, which also
    ended a held grant's heartbeat thread. A heartbeat whose COMMIT went out on a connection
    lost unseen may have taken effect: it fails as ``Unreachable`` (one line; the grant's
    thread, as ``fairpool run``, goes on), and the next one gets through."""
    with Client(database_url=url) as client:
        client.create_pool("gpus", {"gpu": 2})
        client.attach_policy("gpus", "team")
        held = client.submit({"gpu": 1}, component="team", lease_ttl=60)
        terminate_all(other)
        assert client.get(held.id).status == "allocated"
        terminate_all(other)
        assert client.heartbeat(held.id).status == "allocated"
        lose_all(other, monkeypatch, seen=False)
        with pytest.raises(Unreachable, match=(
            r"^lost the connection to the database \S+: .*; a COMMIT sent may have taken effect$"
        )):
            client.heartbeat(held.id)
        assert client.heartbeat(held.id).status == "allocated"
        with client.acquire({"gpu": 1}, component="team", lease_ttl=2) as grant:
            time.sleep(0.2)
            lose_all(other, monkeypatch, seen=False)  # a heartbeat fails, the next gets through
            time.sleep(1.8)
            grant.check()
            assert grant._thread.is_alive()
        assert client.get(grant.id).status == "released"
        assert client.release(held.id).status == "released"


def test_a_holders_heartbeats_ride_out_the_write_lock_held_past_its_timeout(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat meeting the lock timeout (a long write elsewhere) raised OperationalError,
    which ended the grant's heartbeat thread: the lease then ran out, the units went to
    others, and the block ran on, told only as it ended."""
    monkeypatch.setattr(store_db, "LOCK_TIMEOUT_MS", 200)
    with Client(database_url=url) as client:
        client.create_pool("gpus", {"gpu": 1})
        client.attach_policy("gpus", "team")
        with client.acquire({"gpu": 1}, component="team", lease_ttl=3) as grant:
            with psycopg.connect(url.replace("+psycopg", "")) as holder:
                holder.execute("SELECT pg_advisory_xact_lock(%s)", [WRITE_LOCK_KEY])
                time.sleep(1.6)  # a heartbeat (every 1 s) waits 0.2 s for the lock, fails
                holder.rollback()
            assert grant._thread.is_alive()
            time.sleep(3.5)  # past the lease: the heartbeats after the lock kept it
            grant.check()
        assert client.get(grant.id).status == "released"


def test_a_server_rides_out_lost_connections_and_answers_503_while_the_database_is_away(
    url: str, other: psycopg.Connection[Any]
) -> None:
    """Connections lost between requests: the next request is served on new ones, where
    the first read answered 503. While no connection can be made (a restart), the
    database's ``Unreachable`` is a 503, as its ``OperationalError`` was, not a 400; so is
    every long-poll's, where the loop's own connection could not be opened again (the
    driver's error: a 500, which the SDK and ``fairpool run`` do not ride out; helper-75)."""
    dbname = make_url(url).database

    async def main(service: Service) -> list[int]:
        app = create_app(service, tick=3600.0)
        statuses = []
        service.create_request("team", demand={"gpu": 1})
        queued = service.create_request("team", demand={"gpu": 1})
        wait = f"{PREFIX}/requests/{queued.id}/wait?timeout=0.1"
        async with app.router.lifespan_context(app):
            for _ in range(2):
                terminate_all(other)
                statuses.append((await call(app, "GET", PREFIX + "/pools")).status)
            assert (await call(app, "GET", wait)).status == 200  # the loop's connection
            with psycopg.connect(POSTGRES_CONNINFO, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
                try:
                    terminate_all(other)
                    away = await call(app, "GET", PREFIX + "/pools")
                    statuses.append(away.status)
                    assert away.json()["detail"] == "database busy or unreachable; retry later"
                    waits = [await call(app, "GET", wait) for _ in range(3)]
                    assert [(w.status, w.json()["detail"]) for w in waits] == [
                        (503, "database busy or unreachable; retry later")] * 3
                finally:
                    admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            statuses.append((await call(app, "GET", PREFIX + "/pools")).status)
        return statuses

    with team_service(url, gpus=1) as service:
        assert asyncio.run(asyncio.wait_for(main(service), 30)) == [200, 200, 503, 200]


def test_a_pass_or_a_scrape_while_the_database_is_away_logs_one_line(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each tick logged a traceback of ~75 lines, each scrape three chained ones: 3,785 lines
    in an outage of 12 s. Then one line per step each tick, alike, none naming its step:
    now one as the database goes away, one as the passes work again (helper-90). A failure
    of another kind keeps its traceback."""
    with team_service(url, gpus=1) as service:
        app = create_app(service, tick=3600.0)
        api = app.state.api
        with caplog.at_level(logging.INFO, logger="fairpool.api"):
            with out_of_reach(url):
                reconciler = Reconciler(api.tick, tick=0.05)
                reconciler.start()
                time.sleep(0.3)  # several ticks
                reconciler.stop()
                assert b"fairpool_database_up 0.0" in api.metrics.render()
                # The cause comes last, and a cut at 200 characters lost it behind the URL.
                ready = asyncio.run(call(app, "GET", "/readyz"))
                assert ready.status == 503
                assert ready.json()["detail"].endswith("is not currently accepting connections")
            api.tick()
            api.tick()  # nothing more said
        failing = Reconciler(lambda: 1 / 0, tick=3600.0)
        with caplog.at_level(logging.WARNING, logger="fairpool.api"):
            failing.start()
            failing.stop()
    said = [r.getMessage() for r in caplog.records]
    passes = [m for m in said if not m.startswith("metrics")]
    assert len(passes) == 3, said
    assert passes[0].startswith("reconcile pass failed (requests); tried again each tick, said "
                                "again once it works: database unavailable: ")
    assert re.fullmatch(r"Reconcile passes work again, the database answering \(after \d+ s\)",
                        passes[1]), passes[1]
    for record in caplog.records[:-1]:
        assert record.exc_info is None
    other = caplog.records[-1]
    assert other.getMessage() == "reconcile pass failed"
    assert other.exc_info is not None and other.exc_info[0] is ZeroDivisionError


def test_every_connection_finds_a_peer_gone_without_a_word(url: str) -> None:
    """Without keepalives a connection to a host powered off, or cut off by a partition,
    waited for ever (a read) or ~15 minutes (a write), every later write of the process
    queued behind it. What the URL gives is kept."""
    expected = {name: str(value) for name, value in TCP_DEFAULTS.items()}

    def settings(connection: Any) -> dict[str, str | None]:
        parameters = connection.info.get_parameters()
        return {name: parameters.get(name) for name in TCP_DEFAULTS}

    async def on_loop(db: Database) -> dict[str, str | None]:
        connection = await db._connect_async()
        try:
            return settings(connection)
        finally:
            await connection.close()

    with Database.open(url) as db:
        with db.read() as conn:
            assert settings(conn.connection.dbapi_connection) == expected
        with db.write() as conn:
            assert settings(conn.connection.dbapi_connection) == expected
        assert asyncio.run(on_loop(db)) == expected
        notifier = notifier_for(db)
        assert isinstance(notifier, PostgresChangeNotifier)
        listener = notifier._connect()
        try:
            assert settings(listener) == expected
        finally:
            listener.close()
    with Database.open(url + "?keepalives_idle=60") as db, db.read() as conn:
        assert settings(conn.connection.dbapi_connection) == {**expected, "keepalives_idle": "60"}


def test_reads_do_not_wait_for_a_writer(db: Database) -> None:
    with db.write() as writer:
        repo.insert_pool(writer, "gpus", None, {"gpu": 8}, NOW)
        with db.read() as connection:
            assert repo.list_pools(connection) == []


def test_transactions_are_configured(db: Database) -> None:
    def settings(connection: Connection) -> dict[str, str | None]:
        return {
            name: connection.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("transaction_isolation", "transaction_read_only", "lock_timeout")
        }

    with db.write() as connection:
        assert settings(connection) == {
            "transaction_isolation": "read committed",
            "transaction_read_only": "off",
            "lock_timeout": "30s",
        }
    with db.read() as connection:
        assert settings(connection) == {
            "transaction_isolation": "repeatable read",
            "transaction_read_only": "on",
            "lock_timeout": "30s",
        }
    # The read settings do not stick to the pooled connection.
    with db.write() as connection:
        assert settings(connection)["transaction_isolation"] == "read committed"
        assert connection.dialect.driver == "psycopg"


def test_a_writer_waits_for_the_lock_at_most_lock_timeout(
    url: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_db, "LOCK_TIMEOUT_MS", 200)
    with Database.open(url) as impatient, db.write() as holder:
        repo.insert_pool(holder, "gpus", None, {"gpu": 8}, NOW)
        with pytest.raises(OperationalError, match="lock timeout"), impatient.write() as writer:
            repo.insert_pool(writer, "cpus", None, {"cpu": 8}, NOW)
    with db.read() as connection:
        assert [pool.name for pool in repo.list_pools(connection)] == ["gpus"]


def test_deferred_writes_meeting_the_lock_timeout_fail_with_it(
    url: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not as a failed deferred write (``DeferredWriteFailed``), which the service would run
    again, to wait for the lock as long once more."""
    monkeypatch.setattr(store_db, "LOCK_TIMEOUT_MS", 200)
    with Database.open(url) as impatient:
        with impatient.write() as connection:
            seen = generation(connection)
        with db.write() as holder:
            repo.insert_pool(holder, "gpus", None, {"gpu": 8}, NOW)
            with pytest.raises(OperationalError, match="lock timeout"), impatient.write(
                defer=True, last_seen=seen + 1
            ) as writer:
                repo.insert_events(writer, [repo.event_row("note", "queued", NOW)])
    with db.read() as connection:
        assert repo.list_events(connection) == []


def test_a_plain_postgresql_url_uses_psycopg(url: str) -> None:
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with Database.open(plain) as db, db.read() as connection:
        assert connection.dialect.driver == "psycopg"


def test_concurrent_writers_are_serialized(url: str) -> None:
    assert _run_processes(_count_then_append, url) == ["ok"] * PROCESSES
    with Database.open(url) as db, db.read() as connection:
        count = connection.scalar(select(func.count()).select_from(schema.event))
        events = repo.list_events(connection)
    total = PROCESSES * WRITES_PER_PROCESS
    assert count == total
    # Each transaction saw every earlier commit and none later: no lost or doubled counts.
    assert sorted(e.data["seen"] for e in events) == list(range(total))


def test_processes_opening_a_new_database_at_once(new_database: Callable[..., str]) -> None:
    url = new_database("postgresql")
    assert _run_processes(_open_at_once, url) == ["ok"] * PROCESSES
    with Database.open(url) as db, db.read() as connection:
        assert len(repo.list_events(connection)) == PROCESSES
        head = ScriptDirectory.from_config(migration_config(connection)).get_current_head()
        assert MigrationContext.configure(connection).get_current_revision() == head


def test_names_list_in_code_point_order_whatever_the_databases_collation(
    postgres: PostgresServer, request: pytest.FixtureRequest
) -> None:
    """On a database sorting as en-US does (PostgreSQL's default where the OS's locale is),
    nodes, trees and a tree's pools were listed in its order: ``_x, a, a_b, a-b, A:1, ab, b,
    B, Z1``, where SQLite and a C database list ``A:1, B, Z1, _x, a, a-b, a_b, ab, b`` (found
    by helper-65). Remote and embedded lists then differed."""
    name = postgres.create_collated("en-US")
    request.addfinalizer(lambda: postgres.drop_later(name))
    names = ["b", "B", "a", "_x", "Z1", "a-b", "a_b", "ab", "A:1"]
    with Database.open(postgres.url(name)) as db:
        svc, trees = Service(db), TreesService(db)
        trees.create_tree("t", {"node_tag_filter": "t"})
        for i, each in enumerate(names):
            trees.add_node(each, [], {"cpu": 1})
            trees.create_tree(each, {"node_tag_filter": f"tag{i}"})  # nodes of its own: none
            trees.create_pool("t", each)
            svc.create_pool(each, dict.fromkeys(names, 1))
            svc.attach_policy(names[0], each)
        with db.read() as conn:  # the database's own order differs
            ordered = conn.scalars(select(schema.pool.c.name).order_by(schema.pool.c.name))
            assert list(ordered) != sorted(names)
        assert [node.name for node in trees.list_nodes()] == sorted(names)
        assert [tree.name for tree in trees.list_trees()] == sorted([*names, "t"])
        with db.read() as conn:
            assert [pool.name for pool in store_trees.list_pools(conn, "t")] == sorted(names)
        assert [pool.name for pool in svc.list_pools()] == sorted(names)
        assert [c.name for c in svc.list_components()] == sorted(names)
        assert list(svc.get_pool(names[0]).capacity) == sorted(names)


def test_a_holder_on_postgresql_hears_that_a_newer_fairpool_migrated_the_store(
    url: str, other: psycopg.Connection[Any]
) -> None:
    """Working on the database directly, its heartbeats wrote on, the old way, into a store
    a newer fairpool had migrated: only a server's tick checked on PostgreSQL, and only
    SQLite's writes did. Now a write checks at most once a second."""
    with team_service(url, gpus=1), Client(database_url=url) as client:
        started = time.monotonic()
        with pytest.raises(NotGranted, match=(
            r"lost: heartbeat refused: the database's schema is at revision 9999, and this "
            r"process works with revision \d+: run the fairpool that migrated it$"
        )):
            with client.acquire({"gpu": 1}, component="team", lease_ttl=1):
                other.execute("UPDATE alembic_version SET version_num = '9999'")
                time.sleep(10)  # interrupted
        assert time.monotonic() - started < 5
