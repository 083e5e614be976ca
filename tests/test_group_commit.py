"""Group commit: writes that queue while a transaction runs share the next one, and one that
fails is undone alone (``fairpool/group_commit.py``, ``Service._write``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from fairpool.errors import NotFound
from fairpool.group_commit import GroupCommit, Pending
from fairpool.service import Service
from fairpool.store.db import Database
from fairpool.views import PassSummary
from tests.test_service import Clock


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_operations_queued_during_a_batch_form_the_next_batch() -> None:
    batches: list[list[str]] = []
    first_running, release_first = threading.Event(), threading.Event()

    def run_batch(batch: list[Pending[str]]) -> None:
        batches.append([p.work for p in batch])
        if len(batches) == 1:
            first_running.set()
            release_first.wait(10)
        for pending in batch:
            if pending.work == "bad":
                pending.fail(ValueError("bad"))
            else:
                pending.succeed(pending.work.upper())

    group: GroupCommit[str] = GroupCommit(run_batch)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(group.submit, "a")
        assert first_running.wait(10)
        rest = [pool.submit(group.submit, work) for work in ("b", "bad", "c")]
        wait_for(lambda: len(group._queue) == 3)
        release_first.set()
        assert first.result() == "A"
        assert [rest[0].result(), rest[2].result()] == ["B", "C"]
        with pytest.raises(ValueError, match="bad"):
            rest[1].result()
    assert batches[0] == ["a"]
    assert sorted(batches[1]) == ["b", "bad", "c"]  # one batch for the three that waited


def test_an_unsettled_operation_fails_instead_of_hanging() -> None:
    group: GroupCommit[str] = GroupCommit(lambda batch: None)
    with pytest.raises(RuntimeError, match="without settling"):
        group.submit("x")


@pytest.fixture
def svc(database_url: str) -> Iterator[Service]:
    db = Database.open(database_url)
    service = Service(db, Clock())
    service.create_pool("gpus", {"gpu": 2})
    service.attach_policy("gpus", "team")
    yield service
    db.close()


def test_a_failing_write_in_a_shared_transaction_is_undone_alone(svc: Service) -> None:
    passes: list[PassSummary] = []
    svc.on_pass = passes.append
    leader = svc._writes._leader
    leader.acquire()  # as if a batch were running: the writes below queue up behind it
    try:
        with ThreadPoolExecutor(3) as pool:
            futures: list[Future[Any]] = [
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
                pool.submit(svc.release_request, "no-such-request"),
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
            ]
            wait_for(lambda: len(svc._writes._queue) == 3)
            leader.release()
            leader = None
            created = [futures[0].result(), futures[2].result()]
            with pytest.raises(NotFound):
                futures[1].result()
    finally:
        if leader is not None:
            leader.release()
    assert [view.status for view in created] == ["allocated", "allocated"]
    assert len(passes) == 1 and sorted(passes[0].granted) == sorted(v.id for v in created)
    assert {r.id for r in svc.list_requests(status="allocated")} == {v.id for v in created}
