"""Writes run ``at_once``: now, or ``WouldWait`` before anything is written
(``GroupCommit.run_now``, ``Database.write(wait=False)``, ``Service.at_once``), and
the server's routes that run such writes on the event loop and fall back to a thread.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fairpool import service as service_module
from fairpool.errors import WouldWait
from fairpool.group_commit import GroupCommit, Pending
from fairpool.service import Service
from fairpool.store import repo
from fairpool.store.db import LOCK_TIMEOUT_MS, Database, generation
from tests.servers import ApiServer
from tests.test_service import Clock, team_service


def test_group_commit_runs_it_alone_or_refuses_while_a_batch_runs() -> None:
    running, finish = threading.Event(), threading.Event()
    batches: list[list[str]] = []

    def run_batch(batch: list[Pending[str]]) -> None:
        batches.append([p.work for p in batch])
        if batch[0].work == "slow":
            running.set()
            assert finish.wait(10)
        for pending in batch:
            pending.succeed(pending.work)

    group: GroupCommit[str] = GroupCommit(run_batch)
    assert group.run_now("alone") == "alone"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(group.submit, "slow")
        assert running.wait(10)
        with pytest.raises(WouldWait):
            group.run_now("refused")
        assert group._queue == []  # not queued either
        finish.set()
        assert slow.result(10) == "slow"
    assert batches == [["alone"], ["slow"]]


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with Database.open(database_url) as database:
        yield database


def _generation(db: Database) -> int:
    with db.write() as connection:
        return generation(connection) - 1  # before this very write


def test_database_write_at_once(db: Database) -> None:
    if not db.embedded:  # PostgreSQL: every statement waits for the network
        with pytest.raises(WouldWait), db.write(wait=False):
            pass
        return
    before = _generation(db)
    with db.write(wait=False) as connection:
        assert generation(connection) == before + 2
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with db.write():
            entered.set()
            assert leave.wait(10)

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold)
        assert entered.wait(10)
        with pytest.raises(WouldWait, match="this process"), db.write(wait=False):
            pass
        leave.set()
        held.result(10)


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


@pytest.fixture
def svc(database_url: str) -> Iterator[Service]:
    with team_service(database_url, gpus=4) as service:
        yield service


def _requests(svc: Service) -> int:
    with svc.db.read() as connection:
        return len(repo.list_requests(connection))


def test_service_writes_at_once_only_on_a_live_state_it_holds(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another service wrote since: the live state this one holds is stale, to be loaded.
    Service(svc.db, Clock()).create_request("team", demand={"gpu": 1})
    with svc.at_once(), pytest.raises(WouldWait):
        svc.create_request("team", demand={"gpu": 1})
    assert _requests(svc) == 1
    if not svc.db.embedded:
        return
    svc.cancel_request(svc.list_requests()[0].id)  # loads it again, and keeps it
    with svc.at_once():
        held = svc.create_request("team", demand={"gpu": 4})
        queued = svc.create_request("team", demand={"gpu": 1})
    assert (held.status, queued.status) == ("allocated", "queued")
    monkeypatch.setattr(service_module, "AT_ONCE_QUEUE_LIMIT", 1)
    svc.create_request("team", demand={"gpu": 1})  # two queued now
    with svc.at_once(), pytest.raises(WouldWait):
        svc.release_request(held.id)
    assert svc.get_request(held.id).status == "allocated"
    with svc.at_once(), pytest.raises(WouldWait):  # and the state is still held, unharmed
        svc.release_request(held.id)
    assert svc.release_request(held.id).status == "released"
    assert svc.get_request(queued.id).status == "allocated"


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
        metrics = httpx.get(server.url + "/metrics", timeout=5.0).text
        # The first submit and the release ran at once; the submit that met the lock did not.
        assert 'fairpool_request_writes_total{path="at_once"} 2.0' in metrics
        assert 'fairpool_request_writes_total{path="queued"} 1.0' in metrics
    finally:
        server.stop()


def test_on_postgresql_the_routes_queue_their_writes(
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
        metrics = httpx.get(server.url + "/metrics", timeout=5.0).text
        assert 'fairpool_request_writes_total{path="queued"} 2.0' in metrics
        assert 'path="at_once"' not in metrics
    finally:
        server.stop()
