"""Writes run at once: now, or ``WouldWait`` before anything is written
(``Database.write(wait=False)``); the batches a server's event loop leads, which run so on
its thread and fall back to a thread that may wait; and the routes that queue their writes
for those batches.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairpool import service as service_module
from fairpool.api.app import Api
from fairpool.errors import Later, NotFound, WouldWait
from fairpool.service import GATHER_TURNS, Service
from fairpool.store.db import LOCK_TIMEOUT_MS, Database, generation
from fairpool.views import RequestView
from tests.servers import ApiServer
from tests.test_service import Clock, team_service
from tests.test_store import checkpointed


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with Database.open(database_url) as database:
        yield database


def _generation(db: Database) -> int:
    with db.write() as connection:
        return generation(connection) - 1  # before this very write


@contextmanager
def _held_elsewhere(transaction: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    """While the block runs, ``transaction()`` is open on another thread."""
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction():
            entered.set()
            assert leave.wait(10)

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold)
        assert entered.wait(10)
        try:
            yield
        finally:
            leave.set()
        held.result(10)


def test_database_write_at_once(db: Database) -> None:
    if not db.embedded:  # PostgreSQL: every statement waits for the network
        with pytest.raises(WouldWait), db.write(wait=False):
            pass
        return
    before = _generation(db)
    with db.write(wait=False) as connection:
        assert generation(connection) == before + 2
    with _held_elsewhere(db.write):
        with pytest.raises(WouldWait, match="this process"), db.write(wait=False):
            pass


def test_sqlite_write_at_once_does_not_wait_for_another_process(tmp_path: Path) -> None:
    path = tmp_path / "fairpool.db"
    with Database.open(f"sqlite:///{path}") as db:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # as another process writing
        started = time.monotonic()
        with pytest.raises(WouldWait, match="another process"), db.write(wait=False):
            pass
        assert time.monotonic() - started < 1.0
        other.execute("ROLLBACK")
        # The connection waits for the lock again as every writer does.
        with db.write() as connection:
            timeout = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
        assert timeout == LOCK_TIMEOUT_MS
        with db.write(wait=False):
            pass
        other.close()
        # One connection, switched between the two timeouts only when a write wants the other.
        for wait, expected in ((False, 0), (True, LOCK_TIMEOUT_MS), (False, 0), (False, 0)):
            with db.write(wait=wait) as connection:
                assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == expected
        # A reader waits, whichever connection the pool gives it (the writer's too, after a
        # write that failed while it did not wait).
        with pytest.raises(RuntimeError), db.write(wait=False):
            raise RuntimeError("the write fails; its connection goes back to the pool")
        for _ in range(3):
            with db.read() as connection:
                timeout = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
            assert timeout == LOCK_TIMEOUT_MS


def test_a_read_that_must_not_wait_refuses_rather_than_wait(db: Database) -> None:
    if not db.embedded:  # PostgreSQL: every statement waits for the network
        with pytest.raises(WouldWait), db.read(wait=False):
            pass
        return
    _generation(db)
    with db.read() as connection:
        expected = connection.exec_driver_sql("SELECT value FROM store_generation").scalar()
    with db.read(wait=False) as connection:
        assert connection.exec_driver_sql("SELECT value FROM store_generation").scalar() == expected
        # SQLite's busy handler would sleep: "database is locked" at once instead.
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 0
    # Kept out of the pool between such reads, also through the block's own error.
    checked_out = db._engine.pool.checkedout()  # type: ignore[attr-defined]
    with pytest.raises(KeyError), db.read(wait=False):
        raise KeyError("the block's own error: an unknown id, say")
    assert db._engine.pool.checkedout() == checked_out  # type: ignore[attr-defined]
    with db.read() as connection:  # other reads wait, as before
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == LOCK_TIMEOUT_MS
    with _held_elsewhere(lambda: db.read(wait=False)):
        with pytest.raises(WouldWait, match="in use"), db.read(wait=False):
            pass
        with db.read():  # a read that may wait takes another connection
            pass


def test_a_long_poll_whose_read_would_wait_reads_on_a_thread(tmp_path: Path) -> None:
    """SQLite: ``Api.decided`` reads on the loop's thread; when that read would wait (its
    connection in use), a worker thread reads instead, and the long-poll still answers."""
    with team_service(f"sqlite:///{tmp_path / 'fairpool.db'}", gpus=1) as service:
        api = Api(service, tick=3600.0)
        held = service.create_request("team", demand={"gpu": 1})
        queued = service.create_request("team", demand={"gpu": 1})
        with _held_elsewhere(lambda: service.db.read(wait=False)):
            found = [asyncio.run(api.decided(ref)) for ref in (queued.id, held.id)]
    assert found[0] == (queued.id, None)
    assert found[1][0] == held.id and found[1][1] is not None
    assert found[1][1].status == "allocated"


@pytest.fixture
def svc(database_url: str) -> Iterator[Service]:
    with team_service(database_url, gpus=4) as service:
        yield service


async def _queued(svc: Service, *writes: Callable[[], object]) -> list[object]:
    """Queue ``writes`` in one turn of the loop, as a server's routes do; their answers (or
    errors) once their batches have run."""
    futures = []
    for write in writes:
        try:
            with svc.later():
                write()
        except Later as queued:
            futures.append(queued.future)
    assert len(futures) == len(writes)  # each queued, none run in place
    answers: list[object] = await asyncio.gather(*futures, return_exceptions=True)
    return answers


def test_writes_queued_in_one_turn_share_a_batch_on_the_loop_when_it_need_not_wait(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, int, bool]] = []  # where, how many operations, on the loop's thread

    async def main() -> None:
        loop_thread = threading.current_thread()
        svc.on_batch = lambda where, size: ran.append(
            (where, size, threading.current_thread() is loop_thread)
        )

        def create() -> Callable[[], object]:
            return lambda: svc.create_request("team", demand={"gpu": 1})

        svc.drive_writes_on(asyncio.get_running_loop())
        try:
            # Another service wrote since: the live state this one holds is stale, to be
            # loaded, which a thread does.
            Service(svc.db, Clock()).create_request("team", demand={"gpu": 1})
            assert _statuses(await _queued(svc, create())) == ["allocated"]
            assert ran == [("thread", 1, False)]
            three = await _queued(svc, create(), create(), create())
            assert _statuses(three) == ["allocated", "allocated", "queued"]  # 4 GPUs
            assert ran[-1] == ("loop", 3, True)
            # One operation fails: undone alone, with the state its transaction changed, so
            # the other runs again where the state is loaded: on a thread. (PostgreSQL runs
            # the whole batch again there, where failures are told apart.)
            failed, made = await _queued(svc, lambda: svc.release_request("nope"), create())
            assert isinstance(failed, NotFound)
            assert _statuses([made]) == ["queued"]
            assert ran[-1] == ("thread", 1 if svc.db.embedded else 2, False)
            # More queued than a pass on the loop may go over: a thread runs it.
            monkeypatch.setattr(service_module, "AT_ONCE_QUEUE_LIMIT", 1)
            held, _, waiting = (view for view in three if isinstance(view, RequestView))
            released = await _queued(svc, lambda: svc.release_request(held.id))
            assert _statuses(released) == ["released"]
            assert ran[-1] == ("thread", 1, False)
            assert svc.get_request(waiting.id).status == "allocated"  # the first in line
        finally:
            await svc.stop_driving()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_on_sqlite_the_loop_turns_gather_turns_times_before_taking_a_batch(svc: Service) -> None:
    """A batch on the loop holds it on SQLite, so the loop first turns ``GATHER_TURNS``
    times: writes the routes queue meanwhile join it. On PostgreSQL, whose batch frees the
    loop for its round trip, it is taken at once."""
    sizes: list[int] = []

    async def main() -> None:
        async def create_after(turns: int) -> list[object]:
            for _ in range(turns):
                await asyncio.sleep(0)
            return await _queued(svc, lambda: svc.create_request("team", demand={"gpu": 1}))

        svc.drive_writes_on(asyncio.get_running_loop())
        try:
            await create_after(0)  # the first batch loads the live state
            svc.on_batch = lambda where, size: sizes.append(size)
            await asyncio.gather(*(create_after(i) for i in range(GATHER_TURNS + 1)))
        finally:
            await svc.stop_driving()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert sizes[0] == (GATHER_TURNS + 1 if svc.db.embedded else 1)
    assert sum(sizes) == GATHER_TURNS + 1


def _statuses(answers: list[object]) -> list[str]:
    return [answer.status if isinstance(answer, RequestView) else repr(answer)
            for answer in answers]


def test_a_route_that_must_wait_waits_on_a_thread_and_the_server_answers_meanwhile(
    tmp_path: Path,
) -> None:
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "home")
    server.start()
    try:
        with httpx.Client(base_url=server.url + "/api/v1", timeout=30.0) as client:
            body = {"component": "team", "resources": {"gpu": 1}}
            for path, setup in (("/pools", {"name": "gpus", "capacity": {"gpu": 2}}),
                                ("/pools/gpus/policies", {"component": "team"}),
                                ("/requests", body)):
                assert client.post(path, json=setup).status_code == 201
            other = sqlite3.connect(tmp_path / "home" / "fairpool.db", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(client.post, "/requests", json=body)
                time.sleep(0.5)
                assert not waiting.done()  # it waits for the lock...
                started = time.monotonic()
                health = httpx.get(server.url + "/healthz", timeout=5.0)
                assert health.status_code == 200
                assert time.monotonic() - started < 1.0  # ...but not on the event loop
                other.execute("ROLLBACK")
                second = waiting.result(10)
            other.close()
            assert second.status_code == 201, second.text
            assert second.json()["status"] == "allocated"
            released = client.post(f"/requests/{second.json()['id']}/release")
            assert released.status_code == 200, released.text
        metrics = _write_batches(server)
        # The submit that met the lock ran on a thread, and the release (its state held) on
        # the loop. (The sync routes' writes and the reconciler's ticks run on threads.)
        assert metrics["thread"] >= 1 and metrics["loop"] >= 1, metrics
        # Each batch held one operation at least (a reconciler tick may join a route's).
        operations = _write_batches(server, "batch_operations")
        assert all(operations[on] >= metrics[on] for on in metrics), (operations, metrics)
    finally:
        server.stop()


def test_a_server_checkpoints_the_wal_on_a_thread_not_in_its_writes(tmp_path: Path) -> None:
    """The server's writes run on its event loop, which a checkpoint would stall: a thread
    copies the WAL into the database file instead (``Database.checkpoint_apart``)."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "home")
    server.start()
    try:
        with httpx.Client(base_url=server.url + "/api/v1", timeout=30.0) as client:
            for path, body in (("/pools", {"name": "gpus", "capacity": {"gpu": 2}}),
                               ("/pools/gpus/policies", {"component": "team"}),
                               ("/requests", {"component": "team", "resources": {"gpu": 1}})):
                assert client.post(path, json=body).status_code == 201
        # Three writes leave the WAL far below the 1,000 pages at which a write would
        # checkpoint it: only the thread copies them into the file.
        checkpointed(tmp_path / "home" / "fairpool.db", "request", 1)
    finally:
        server.stop()


def _write_batches(server: ApiServer, counter: str = "batches") -> dict[str, float]:
    """``fairpool_write_<counter>_total`` (batches, batch_operations) by where they ran,
    from the server's metrics."""
    text = httpx.get(server.url + "/metrics", timeout=5.0).text
    counts = {"loop": 0.0, "thread": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"fairpool_write_{counter}_total":
                counts[sample.labels["on"]] = sample.value
    return counts


def test_on_postgresql_the_loop_leads_the_routes_writes(
    new_database: Callable[..., str], tmp_path: Path
) -> None:
    server = ApiServer(
        tmp_path / "server.log", database_url=new_database("postgresql", migrated=True)
    )
    server.start()
    try:
        with httpx.Client(base_url=server.url + "/api/v1", timeout=30.0) as client:
            for path, body in (("/pools", {"name": "gpus", "capacity": {"gpu": 2}}),
                               ("/pools/gpus/policies", {"component": "team"})):
                assert client.post(path, json=body).status_code == 201
            made = client.post("/requests", json={"component": "team", "resources": {"gpu": 1}})
            assert made.json()["status"] == "allocated", made.text
            assert client.post(f"/requests/{made.json()['id']}/release").status_code == 200
        # The release at least: the submit's batch loaded the state (on a thread) and kept it.
        assert _write_batches(server)["loop"] >= 1
    finally:
        server.stop()
