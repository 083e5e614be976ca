"""The store: transactions, repository round trips, references, and several processes at once.

Tests taking ``db`` run on SQLite and on PostgreSQL (see ``database_url`` in conftest.py); the
SQLite-only ones here have their PostgreSQL counterparts in test_postgres.py.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, func, select, text
from sqlalchemy.exc import DBAPIError

from fairpool.errors import AmbiguousReference, NotFound
from fairpool.store import repo, schema, trees
from fairpool.store.db import Database, default_url, fairpool_home, migration_config
from fairpool.store.records import Allocation, ComponentType, Event, RequestStatus, TokenRole
from tests import forked_cli

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
PROCESSES = 8
WRITES_PER_PROCESS = 50


def at(minutes: int) -> datetime:
    return NOW + timedelta(minutes=minutes)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with Database.open(database_url) as database:
        yield database


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    with Database.open(f"sqlite:///{tmp_path / 'fairpool.db'}") as database:
        yield database


@pytest.fixture
def component_id(db: Database) -> str:
    with db.write() as connection:
        return repo.insert_component(connection, "k8s", ComponentType.ORCHESTRATOR, NOW).id


# Transactions


def test_write_rolls_back_when_the_block_raises(db: Database) -> None:
    with pytest.raises(RuntimeError), db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW)
        raise RuntimeError
    with db.read() as connection:
        assert repo.list_pools(connection) == []


def test_read_transactions_cannot_write(db: Database) -> None:
    # SQLite: OperationalError "attempt to write a readonly database";
    # PostgreSQL: InternalError "cannot execute INSERT in a read-only transaction".
    with pytest.raises(DBAPIError, match=r"readonly|read-only"), db.read() as connection:
        repo.insert_pool(connection, "gpus", None, {}, NOW)
    # The connection went back to the pool read-only; the next writer must not inherit that.
    with db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {}, NOW)


def test_read_sees_one_snapshot(db: Database) -> None:
    with db.read() as reader:
        assert repo.list_pools(reader) == []
        with db.write() as writer:
            repo.insert_pool(writer, "gpus", None, {}, NOW)
        assert repo.list_pools(reader) == []
    with db.read() as reader:
        assert [pool.name for pool in repo.list_pools(reader)] == ["gpus"]


def test_connections_are_configured(sqlite_db: Database) -> None:
    with sqlite_db.write() as connection:
        pragmas = {
            name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in (
                "journal_mode", "foreign_keys", "synchronous", "busy_timeout", "journal_size_limit"
            )
        }
    # synchronous: 1 is NORMAL.
    assert pragmas == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "synchronous": 1,
        "busy_timeout": 30000,
        "journal_size_limit": 64 * 1024 * 1024,
    }


def test_write_takes_the_lock_before_its_first_statement(
    sqlite_db: Database, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "fairpool.db", timeout=0, isolation_level=None)
    try:
        with sqlite_db.write():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


def rows_in_the_file_alone(path: Path, table: str, copy: Path) -> int | None:
    """How many rows ``table`` has in the database file at ``path`` without its WAL, i.e.
    as far as checkpoints copied the WAL into it; None if the copy caught one midway."""
    copy.write_bytes(path.read_bytes())
    try:
        with sqlite3.connect(copy) as connection:
            count: int = connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            return count
    except sqlite3.DatabaseError:
        return None
    finally:
        copy.unlink()


def checkpointed(database: Path, table: str, rows: int) -> None:
    """Wait (at most 10 s) until the database file alone, its WAL left aside, holds ``rows``
    rows of ``table``: until a checkpoint has copied them there."""
    deadline = time.monotonic() + 10
    while rows_in_the_file_alone(database, table, database.with_name("copy.db")) != rows:
        assert time.monotonic() < deadline, f"no checkpoint copied {rows} rows of {table}"
        time.sleep(0.05)


def test_a_thread_checkpoints_the_wal_apart_from_the_writes(
    sqlite_db: Database, tmp_path: Path
) -> None:
    """``checkpoint_apart``: the writes no longer checkpoint the WAL (SQLite would at 1,000
    pages), a thread does, every ``every`` seconds; ``checkpoint_with_writes`` undoes it."""

    def autocheckpoint() -> int:
        with sqlite_db.write() as connection:
            pages: int = connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one()
            return pages

    assert autocheckpoint() == 1000
    sqlite_db.checkpoint_apart(every=0.05)
    try:
        assert autocheckpoint() == 0
        for minute in range(3):
            with sqlite_db.write() as connection:
                repo.insert_pool(connection, f"p{minute}", None, {"gpu": 1}, at(minute))
        # A few writes stay in the WAL unless something checkpoints: the thread does.
        checkpointed(tmp_path / "fairpool.db", "pool", 3)
    finally:
        sqlite_db.checkpoint_with_writes()
    assert autocheckpoint() == 1000


def test_closing_the_database_stops_its_checkpoint_thread(tmp_path: Path) -> None:
    """``close`` ends ``checkpoint_apart``'s thread (after its last checkpoint): a process
    that closes its database keeps no thread of it."""

    def checkpointers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "fairpool-checkpoint"]

    db = Database.open(f"sqlite:///{tmp_path / 'fairpool.db'}")
    db.checkpoint_apart(every=0.05)
    assert len(checkpointers()) == 1
    with db.write() as connection:
        repo.insert_pool(connection, "gpus", None, {"gpu": 1}, NOW)
    db.close()
    assert checkpointers() == []
    # Nothing is left behind in the WAL alone: the write is in the database file.
    assert rows_in_the_file_alone(tmp_path / "fairpool.db", "pool", tmp_path / "copy.db") == 1


def test_a_failed_checkpoint_is_logged_and_tried_again(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    checkpoint = sqlite_db.checkpoint
    failures = [sqlite3.OperationalError("disk I/O error")]

    def failing_once() -> None:
        if failures:
            raise failures.pop()
        checkpoint()

    monkeypatch.setattr(sqlite_db, "checkpoint", failing_once)
    sqlite_db.checkpoint_apart(every=0.05)
    try:
        with sqlite_db.write() as connection:
            repo.insert_pool(connection, "gpus", None, {"gpu": 1}, NOW)
        checkpointed(tmp_path / "fairpool.db", "pool", 1)
    finally:
        sqlite_db.checkpoint_with_writes()
    assert not failures
    assert "WAL checkpoint failed" in caplog.text


def wal_restarts(database: Path) -> int:
    """The checkpoint sequence number in the WAL's header: SQLite adds one each time a write
    starts the WAL over from its first frame."""
    header = database.with_name(database.name + "-wal").read_bytes()[:16]
    return int.from_bytes(header[12:16], "big")


def test_the_write_after_a_checkpoint_starts_the_wal_over_though_writes_came_during_it(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under steady writes every copy of the WAL ends with more written behind it, and
    SQLite starts the WAL over only when all of it was copied: it grew without end. A write
    that comes during the copy is taken by a second one, made with the writes held back."""
    database = tmp_path / "fairpool.db"
    copy = sqlite_db._copy_wal

    def copy_during_a_write(dbapi_connection: Any) -> None:
        if sqlite_db._write_lock.locked():  # the writes are held back
            copy(dbapi_connection)
            return
        with sqlite_db.write() as connection:  # began before the copy, commits after it
            repo.insert_pool(connection, "during", None, {"gpu": 1}, NOW)
            copy(dbapi_connection)

    with sqlite_db.write() as connection:
        repo.insert_pool(connection, "before", None, {"gpu": 1}, NOW)
    monkeypatch.setattr(sqlite_db, "_copy_wal", copy_during_a_write)
    restarts = wal_restarts(database)
    sqlite_db.checkpoint()
    with sqlite_db.write() as connection:
        repo.insert_pool(connection, "after", None, {"gpu": 1}, NOW)
    assert wal_restarts(database) == restarts + 1
    assert rows_in_the_file_alone(database, "pool", tmp_path / "copy.db") == 2


def test_home_and_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOOL_HOME", str(tmp_path / "env"))
    assert fairpool_home(str(tmp_path / "explicit")) == tmp_path / "explicit"
    assert fairpool_home(None) == tmp_path / "env"
    monkeypatch.delenv("FAIRPOOL_HOME")
    assert fairpool_home(None).name == "fairpool"
    assert default_url(tmp_path).database == f"{tmp_path}/fairpool.db"


def test_the_store_is_in_its_home_whatever_the_homes_name(tmp_path: Path) -> None:
    """A ``?`` in the home's path began the URL's query: the store was made outside the
    home (the file ``.../q``), and two such homes shared it (helper-78)."""
    from fairpool.service import open_service

    for home in ("q?mark/home", "q?other/home", "a#b/%20 c;'@"):
        open_service(str(tmp_path / home)).db.close()
        assert (tmp_path / home / "fairpool.db").is_file(), home
    assert not (tmp_path / "q").exists()


# Components and pools


def test_components(db: Database) -> None:
    with db.write() as connection:
        orchestrator = repo.insert_component(connection, "k8s", ComponentType.ORCHESTRATOR, NOW)
        operator = repo.insert_component(connection, "k8s", ComponentType.STEP_OPERATOR, NOW)
    with db.read() as connection:
        assert repo.get_component_by_name(connection, "k8s", ComponentType.ORCHESTRATOR) == (
            orchestrator
        )
        assert repo.list_components(connection) == [orchestrator, operator]
        with pytest.raises(NotFound, match="no step_operator component 'sagemaker'"):
            repo.get_component_by_name(connection, "sagemaker", ComponentType.STEP_OPERATOR)
        assert repo.get_component(connection, operator.id) == operator
    with db.write() as connection:
        repo.delete_component(connection, operator.id)
        with pytest.raises(NotFound, match=f"no component '{operator.id}'"):
            repo.get_component(connection, operator.id)
        assert repo.list_components(connection) == [orchestrator]
        with pytest.raises(NotFound):
            repo.delete_component(connection, operator.id)


def test_pool_round_trip(db: Database) -> None:
    with db.write() as connection:
        pool = repo.insert_pool(connection, "gpus", "the A100s", {"gpu": 8, "cpu": 64}, NOW)
        repo.insert_pool(connection, "cpus", None, {}, NOW)
    with db.read() as connection:
        assert repo.get_pool(connection, "gpus") == pool
        assert [p.name for p in repo.list_pools(connection)] == ["cpus", "gpus"]
    with db.write() as connection:
        repo.set_pool_capacity(connection, pool.id, {"gpu": 4, "memory": 2**40}, at(1))
        repo.update_pool_description(connection, pool.id, None, at(2))
    with db.read() as connection:
        changed = repo.get_pool(connection, pool.id)
    assert changed.capacity == {"gpu": 4, "memory": 2**40}
    assert changed.description is None
    assert (changed.created_at, changed.updated_at) == (NOW, at(2))
    with db.write() as connection:
        repo.delete_pool(connection, pool.id)
        with pytest.raises(NotFound):
            repo.get_pool(connection, "gpus")
        with pytest.raises(NotFound):
            repo.delete_pool(connection, pool.id)
        with pytest.raises(NotFound):
            repo.set_pool_capacity(connection, pool.id, {}, NOW)
        with pytest.raises(NotFound):
            repo.update_pool_description(connection, pool.id, "x", NOW)
        assert connection.scalar(select(func.count()).select_from(schema.pool_resource)) == 0


def _shortest_unique_prefix(target: str, others: list[str]) -> str:
    return next(
        target[:n]
        for n in range(1, len(target) + 1)
        if not any(other.startswith(target[:n]) for other in others if other != target)
    )


def _shared_first_char(ids: list[str]) -> str:
    firsts = [id_[0] for id_ in ids]
    return next(char for char in firsts if firsts.count(char) > 1)


def test_pool_references(db: Database) -> None:
    # 17 ids: at least two share their first hex digit.
    with db.write() as connection:
        pools = [repo.insert_pool(connection, f"pool-{i}", None, {}, NOW) for i in range(17)]
    ids = [pool.id for pool in pools]
    with db.read() as connection:
        for pool in pools:
            assert repo.get_pool(connection, pool.id) == pool
            assert repo.get_pool(connection, pool.name) == pool
            prefix = _shortest_unique_prefix(pool.id, ids)
            assert repo.get_pool(connection, prefix) == pool
            assert repo.get_pool(connection, prefix.upper()) == pool
        shared = _shared_first_char(ids)
        with pytest.raises(AmbiguousReference, match=f"pool id prefix '{shared}' is ambiguous"):
            repo.get_pool(connection, shared)
        for missing in ("", "nope", "%", "_", ids[0] + "0"):
            with pytest.raises(NotFound, match="no resource pool"):
                repo.get_pool(connection, missing)


def test_pool_name_wins_over_id_prefix(db: Database) -> None:
    with db.write() as connection:
        target = repo.insert_pool(connection, "gpus", None, {}, NOW)
        named_like_it = repo.insert_pool(connection, target.id[:4], None, {}, NOW)
    with db.read() as connection:
        assert repo.get_pool(connection, target.id[:4]) == named_like_it


# Policies


def test_policy_round_trip(db: Database, component_id: str) -> None:
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        policy = repo.insert_policy(
            connection, pool_id, component_id, 5, {"gpu": 2}, {"gpu": 4, "cpu": 16}, NOW
        )
    # A key only limited is stored with 0 reserved: both maps come from one row per key.
    assert policy.reserved == {"cpu": 0, "gpu": 2}
    assert policy.limit == {"cpu": 16, "gpu": 4}
    with db.read() as connection:
        assert repo.get_policy(connection, policy.id) == policy
        assert repo.list_policies(connection) == [policy]
        assert repo.list_policies(connection, pool_id=pool_id, component_id=component_id) == [
            policy
        ]
        assert repo.list_policies(connection, pool_id="other") == []
        assert repo.list_policies(connection, component_id="other") == []

    with db.write() as connection:
        priority_only = repo.update_policy(connection, policy.id, at(1), priority=9)
        assert (priority_only.reserved, priority_only.limit) == (policy.reserved, policy.limit)
        unlimited = repo.update_policy(connection, policy.id, at(2), limit={})
        assert (unlimited.reserved, unlimited.limit) == ({"cpu": 0, "gpu": 2}, {})
        reserved = repo.update_policy(connection, policy.id, at(3), reserved={"gpu": 1})
        assert (reserved.priority, reserved.reserved, reserved.limit) == (9, {"gpu": 1}, {})
        assert reserved.updated_at == at(3)
    with db.read() as connection:
        assert repo.get_policy(connection, policy.id) == reserved

    with db.write() as connection:
        repo.delete_policy(connection, policy.id)
        with pytest.raises(NotFound):
            repo.get_policy(connection, policy.id)
        with pytest.raises(NotFound):
            repo.update_policy(connection, policy.id, NOW, priority=1)
        with pytest.raises(NotFound):
            repo.delete_policy(connection, policy.id)
        assert connection.scalar(select(func.count()).select_from(schema.policy_resource)) == 0


def test_deleting_a_pool_keeps_allocation_history(db: Database, component_id: str) -> None:
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        policy_id = repo.insert_policy(connection, pool_id, component_id, 1, {}, {}, NOW).id
        request_id = repo.insert_request(
            connection, component_id, {"gpu": 1}, NOW, preemptible=True
        ).id
        repo.insert_allocation(connection, request_id, pool_id, policy_id, "gpus", 1, NOW)
        repo.delete_pool(connection, pool_id)
        assert repo.list_policies(connection) == []
        assert repo.live_allocations(connection) == [
            Allocation(request_id, None, None, "gpus", 1, NOW, None)
        ]


# Requests and allocations


def test_request_round_trip(db: Database, component_id: str) -> None:
    with db.write() as connection:
        request = repo.insert_request(
            connection,
            component_id,
            {"gpu": 2, "memory": 2**35},
            NOW,
            preemptible=False,
            max_retries=3,
            labels={"pipeline": "train", "step": "fit"},
        )
    assert request.status is RequestStatus.QUEUED
    assert (request.attempt, request.previous_attempt_id, request.finished_at) == (1, None, None)
    with db.read() as connection:
        assert repo.get_request(connection, request.id) == request
        assert repo.get_request(connection, request.id[:8]) == request
        assert repo.queued_requests(connection) == [request]

    with db.write() as connection:
        repo.set_request_status(connection, request.id, RequestStatus.ALLOCATED, "fits", at(1))
        allocated = repo.get_request(connection, request.id)
        assert (allocated.status, allocated.status_reason) == (RequestStatus.ALLOCATED, "fits")
        assert (allocated.updated_at, allocated.finished_at) == (at(1), None)
        repo.set_request_status(connection, request.id, RequestStatus.RELEASED, None, at(2))
        released = repo.get_request(connection, request.id)
        assert (released.status, released.finished_at) == (RequestStatus.RELEASED, at(2))
        assert released.created_at == NOW
        with pytest.raises(NotFound):
            repo.set_request_status(connection, "nope", RequestStatus.RELEASED, None, NOW)


def test_request_references(db: Database, component_id: str) -> None:
    with db.write() as connection:
        ids = [
            repo.insert_request(connection, component_id, {}, NOW, preemptible=True).id
            for _ in range(17)
        ]
    with db.read() as connection:
        for id_ in ids:
            assert repo.get_request(connection, _shortest_unique_prefix(id_, ids)).id == id_
        with pytest.raises(AmbiguousReference, match="request id prefix"):
            repo.get_request(connection, _shared_first_char(ids))
        with pytest.raises(NotFound, match="no request 'x'"):
            repo.get_request(connection, "x")
        # Longer than any id: not found, whatever LIKE allows (SQLite refused a pattern of
        # 50,000 bytes, and `_` and `%` count twice, escaped: helper-96).
        for ref in (ids[0] + "0", "a" * 60_000, "_" * 30_000):
            with pytest.raises(NotFound, match="no request"):
                repo.get_request(connection, ref)


def test_preemption_and_retry_links(db: Database, component_id: str) -> None:
    with db.write() as connection:
        victim = repo.insert_request(connection, component_id, {"gpu": 1}, NOW, preemptible=True)
        winner = repo.insert_request(connection, component_id, {"gpu": 1}, NOW, preemptible=True)
        repo.set_request_status(
            connection, victim.id, RequestStatus.PREEMPTED, "priority", at(1), winner.id
        )
        retry = repo.insert_request(
            connection,
            component_id,
            {"gpu": 1},
            at(1),
            preemptible=True,
            attempt=2,
            previous_attempt_id=victim.id,
        )
        preempted = repo.get_request(connection, victim.id)
        assert (preempted.preempted_by_id, preempted.finished_at) == (winner.id, at(1))
        assert repo.get_request(connection, retry.id) == retry

        repo.delete_request(connection, winner.id)
        repo.delete_request(connection, victim.id)
        assert repo.get_request(connection, retry.id).previous_attempt_id is None
        assert connection.scalar(select(func.count()).select_from(schema.request_resource)) == 1
        with pytest.raises(NotFound):
            repo.delete_request(connection, victim.id)


def test_holders_are_the_requests_of_the_live_allocations(
    db: Database, component_id: str
) -> None:
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        requests = [
            repo.insert_request(connection, component_id, {"gpu": i + 1}, at(i), preemptible=True)
            for i in range(4)
        ]
        for request in reversed(requests[1:]):
            repo.insert_allocation(connection, request.id, pool_id, None, "gpus", 0, at(5))
        repo.release_allocation(connection, requests[2].id, at(6))
    with db.read() as connection:
        live = [a.request_id for a in repo.live_allocations(connection)]
        # In queue order, whatever the order asked for; unknown ids are left out.
        assert repo.requests_by_id(connection, [*live, "no-such-id"]) == [requests[1], requests[3]]
        assert repo.requests_by_id(connection, []) == []


def test_reason_retry_and_allocation_lookups(db: Database, component_id: str) -> None:
    with db.write() as connection:
        pool_id = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        first = repo.insert_request(connection, component_id, {"gpu": 1}, NOW, preemptible=True)
        repo.set_request_reason(connection, first.id, "waiting: capacity", at(1))
        waiting = repo.get_request(connection, first.id)
        assert (waiting.status, waiting.status_reason) == (
            RequestStatus.QUEUED,
            "waiting: capacity",
        )
        assert waiting.updated_at == at(1)
        with pytest.raises(NotFound):
            repo.set_request_reason(connection, "nope", None, NOW)

        assert repo.allocation_and_retry(connection, first.id) == (None, None)
        allocation = repo.insert_allocation(connection, first.id, pool_id, None, "gpus", 0, at(2))
        assert repo.allocation_and_retry(connection, first.id) == (allocation, None)
        repo.release_allocation(connection, first.id, at(3))
        released = replace(allocation, released_at=at(3))
        assert repo.allocation_and_retry(connection, first.id) == (released, None)

        retry = repo.insert_request(
            connection,
            component_id,
            {"gpu": 1},
            at(4),
            preemptible=True,
            attempt=2,
            previous_attempt_id=first.id,
        )
        assert repo.allocation_and_retry(connection, first.id) == (released, retry.id)
        assert repo.allocation_and_retry(connection, retry.id) == (None, None)
        assert repo.allocations_and_retries(connection, [retry.id, "nope", first.id]) == {
            first.id: (released, retry.id), retry.id: (None, None)
        }
        assert repo.allocations_and_retries(connection, []) == {}


def test_request_page_filters_counts_and_pages_in_queue_order(db: Database, component_id: str) -> None:
    with db.write() as connection:
        other_component = repo.insert_component(
            connection, "sagemaker", ComponentType.STEP_OPERATOR, NOW
        ).id
        pool_id = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        token = repo.insert_token(connection, "t", TokenRole.SUBMITTER, ["x"], "p", "h", NOW)
        # Inserted out of time order: the listing is by (created_at, id), not insertion.
        requests = {
            minute: repo.insert_request(
                connection,
                other_component if minute == 3 else component_id,
                {"gpu": minute},
                at(minute),
                preemptible=True,
                created_by_token_id=token.id if minute in (2, 3) else None,
            )
            for minute in (4, 1, 3, 2, 5)
        }
        for minute in (1, 3):
            repo.set_request_status(
                connection, requests[minute].id, RequestStatus.ALLOCATED, None, at(minute)
            )
            repo.insert_allocation(
                connection, requests[minute].id, pool_id, None, "gpus", 0, at(minute)
            )
        repo.release_allocation(connection, requests[1].id, at(6))
        repo.set_request_status(connection, requests[1].id, RequestStatus.RELEASED, None, at(6))
    minute_of = {request.id: minute for minute, request in requests.items()}
    ids = {minute: request.id for minute, request in requests.items()}

    def minutes(**filters: Any) -> tuple[list[int], int]:
        with db.read() as connection:
            ids, total, _ = repo.request_page(connection, **filters)
        return [minute_of[id_] for id_ in ids], total

    assert minutes() == ([1, 2, 3, 4, 5], 5)
    assert minutes(limit=2, offset=1) == ([2, 3], 5)
    assert minutes(offset=3) == ([4, 5], 5)
    assert minutes(offset=9) == ([], 5)
    assert minutes(status=RequestStatus.QUEUED) == ([2, 4, 5], 3)
    assert minutes(status=RequestStatus.QUEUED, limit=1, offset=1) == ([4], 3)
    assert minutes(component_ids=[other_component]) == ([3], 1)
    assert minutes(component_ids=[component_id, other_component], limit=1) == ([1], 5)
    assert minutes(component_ids=[]) == ([], 0)
    assert minutes(created_by=token.id) == ([2, 3], 2)
    # A pool: allocated there, released or not, and the queued ones the engine says wait there.
    assert minutes(pool_name="gpus") == ([1, 3], 2)
    assert minutes(pool_name="gpus", queued_there=[ids[4], ids[2]]) == ([1, 2, 3, 4], 4)
    assert minutes(pool_name="gpus", status=RequestStatus.RELEASED) == ([1], 1)
    assert minutes(pool_name="cpus", queued_there=[ids[5]], limit=5, offset=0) == ([5], 1)
    # By name, which outlives the pool: a list after the pool is gone still finds its own.
    with db.write() as connection:
        repo.delete_pool(connection, pool_id)
    assert minutes(pool_name="gpus", status=RequestStatus.ALLOCATED) == ([3], 1)


def test_allocations(db: Database, component_id: str) -> None:
    with db.write() as connection:
        gpus = repo.insert_pool(connection, "gpus", None, {"gpu": 8}, NOW).id
        cpus = repo.insert_pool(connection, "cpus", None, {"cpu": 8}, NOW).id
        policy_id = repo.insert_policy(connection, gpus, component_id, 3, {}, {}, NOW).id
        first, second, third = (
            repo.insert_request(connection, component_id, {}, NOW, preemptible=True).id
            for _ in range(3)
        )
        a = repo.insert_allocation(connection, first, gpus, policy_id, "gpus", 3, at(1))
        b = repo.insert_allocation(connection, second, cpus, None, "cpus", 0, at(2))
        c = repo.insert_allocation(connection, third, gpus, policy_id, "gpus", 3, at(3))
        assert repo.live_allocations(connection) == [a, b, c]
        assert repo.live_allocations(connection, pool_id=gpus) == [a, c]

        repo.release_allocation(connection, first, at(4))
        assert repo.live_allocations(connection) == [b, c]
        with pytest.raises(NotFound, match="no live allocation for request"):
            repo.release_allocation(connection, first, at(5))
        released = connection.execute(
            select(schema.allocation).where(schema.allocation.c.request_id == first)
        ).mappings()
        assert Allocation.from_row(released.one()).released_at == at(4)


# Events


def test_events(db: Database) -> None:
    with db.write() as connection:
        repo.insert_events(connection, [])
        repo.insert_events(connection, [
            repo.event_row(
                "granted",
                f"event {i}",
                at(i),
                request_id="r1" if i % 2 else "r2",
                pool_id="p",
                data={"i": i, "nested": {"ok": True}},
            )
            for i in range(5)
        ])
        repo.insert_events(connection, [repo.event_row("note", "no extras", at(9))])
    with db.read() as connection:
        *events, bare = repo.list_events(connection)
        # Numbered in the order given.
        assert [e.message for e in events] == [f"event {i}" for i in range(5)]
        assert events[1] == Event(
            events[1].id, at(1), "granted", "r1", "p", "event 1", {"i": 1, "nested": {"ok": True}}
        )
        assert bare == Event(bare.id, at(9), "note", None, None, "no extras", {})
        assert [e.id for e in events] == sorted(e.id for e in events) and bare.id > events[-1].id
        assert repo.list_events(connection, limit=2) == [events[4], bare]
        assert repo.list_events(connection, request_id="r1") == [events[1], events[3]]
        assert repo.list_events(connection, request_id="r2", limit=1) == [events[4]]


# Bulk loading


def _count_statements(connection: Connection) -> Callable[[], int]:
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(connection, "before_cursor_execute", record)
    return lambda: len(statements)


def test_queued_requests_take_two_queries(db: Database, component_id: str) -> None:
    with db.write() as connection:
        for i in range(200):
            repo.insert_request(
                connection, component_id, {"gpu": 1, "cpu": i + 1}, at(i), preemptible=True
            )
    with db.read() as connection:
        count = _count_statements(connection)
        queue = repo.queued_requests(connection)
        assert count() == 2
    assert len(queue) == 200
    assert [request.demand for request in queue[:2]] == [{"cpu": 1, "gpu": 1}, {"cpu": 2, "gpu": 1}]


# More ids than a statement may bind on PostgreSQL (65535 parameters). This machine's SQLite
# allows 250000 (its default is 32766), so the test is PostgreSQL's.
MANY = 66_000


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_lookups_by_more_ids_than_a_statement_binds(db: Database) -> None:
    """The lookups of operations and jobs by id split their lists (``repo.batches``), as
    those of requests and workloads do: in one IN list they failed ("number of parameters
    must be between 0 and 65535")."""
    operations = [f"op-{i:06d}" for i in range(MANY)]
    with db.write() as connection:
        trees.insert_tree(connection, "physical", {}, NOW)
        # Made by the server: 140,000 inserts from here would take most of the test's time.
        connection.execute(text(
            "INSERT INTO tree_operation (id, user_name, job_resources, job_count, gang,"
            " interruptible, status, created_at, updated_at)"
            " SELECT 'op-' || lpad(i::text, 6, '0'), 'u', '{\"cpu\": 1}', 1, false, false,"
            " 'pending', :now, :now FROM generate_series(0, :last) AS i"
        ), {"now": NOW, "last": MANY - 1})
        connection.execute(text(
            "INSERT INTO tree_operation_placement (operation_id, tree, position, pool, weight,"
            " resource_limits, running) SELECT id, 'physical', 0, 'research', '1', '{}', false"
            " FROM tree_operation"
        ))
        # Started last first: the lists' order is the jobs' start order across batches.
        first, last = operations[0], operations[-1]
        trees.insert_jobs(connection, "physical", [(last, "node-a")], NOW)
        trees.insert_jobs(connection, "physical", [(first, "node-b")], at(1))
    with db.write() as connection:
        listed = trees.list_operations(connection)
        assert [op.id for op in listed] == operations
        assert all(op.placements[0].pool == "research" for op in listed)
        jobs = trees.jobs_of(connection, operations)
        assert [(job.operation_id, job.node) for job in jobs] == [(last, "node-a"), (first, "node-b")]
        trees.preempt_job(connection, jobs[0].id, None, "limits", NOW, deadline=at(5))
        trees.finish_interruptions(connection, [*operations, jobs[0].id], at(5))
        assert trees.jobs_of(connection, [first, last], live=True) == [jobs[1]]


# Several processes


def _report(results: Queue[str], work: Callable[[], None]) -> None:
    try:
        work()
    except BaseException:
        results.put(traceback.format_exc())
        raise
    results.put("ok")


def _count_then_append(url: str, start: Barrier, results: Queue[str]) -> None:
    def work() -> None:
        with Database.open(url) as db:
            start.wait(timeout=60)
            for _ in range(WRITES_PER_PROCESS):
                with db.write() as connection:
                    seen = connection.scalar(select(func.count()).select_from(schema.event))
                    repo.insert_events(
                        connection, [repo.event_row("tick", "tick", NOW, data={"seen": seen})]
                    )

    _report(results, work)


def _open_at_once(url: str, start: Barrier, results: Queue[str]) -> None:
    def work() -> None:
        start.wait(timeout=60)
        with Database.open(url) as db, db.write() as connection:
            repo.insert_events(connection, [repo.event_row("opened", "opened", NOW)])

    _report(results, work)


def _run_processes(target: Callable[[str, Barrier, Queue[str]], None], url: str) -> list[str]:
    # Fresh processes, but forked from one server that imported this module (so SQLAlchemy,
    # Alembic and fairpool) once, instead of each importing them anew: ~1 s each otherwise.
    context = forked_cli.context()  # its server preloads this module too
    start = context.Barrier(PROCESSES)
    results: Queue[str] = context.Queue()
    processes = [
        context.Process(target=target, args=(url, start, results)) for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        return [results.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def test_concurrent_writers_are_serialized(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fairpool.db'}"
    Database.open(url).close()
    assert _run_processes(_count_then_append, url) == ["ok"] * PROCESSES
    with Database.open(url) as db, db.read() as connection:
        events = repo.list_events(connection)
    total = PROCESSES * WRITES_PER_PROCESS
    # Each transaction saw every earlier commit and none later: no lost or doubled counts.
    assert sorted(e.data["seen"] for e in events) == list(range(total))


def test_processes_opening_a_new_database_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fairpool.db'}"
    assert _run_processes(_open_at_once, url) == ["ok"] * PROCESSES
    with Database.open(url) as db, db.read() as connection:
        assert len(repo.list_events(connection)) == PROCESSES
        head = ScriptDirectory.from_config(migration_config(connection)).get_current_head()
        assert MigrationContext.configure(connection).get_current_revision() == head
