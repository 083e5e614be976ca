"""Group commit: writes that queue while a transaction runs share the next one, and one that
fails is undone alone (``fairpool/group_commit.py``, ``Service._write``)."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from fairpool import service as service_module
from fairpool.errors import AmbiguousReference, Conflict, NotFound
from fairpool.group_commit import GroupCommit, Pending
from fairpool.service import Service
from fairpool.store import repo
from fairpool.store.db import Database
from fairpool.views import PassSummary, RequestView
from tests.test_service import team_service


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@contextmanager
def batch_running(svc: Service) -> Iterator[None]:
    """A write batch that changes nothing runs until the block ends: writes submitted in the
    block queue up behind it and form the next batch."""
    running, finish = threading.Event(), threading.Event()

    def blocks(tx: Any) -> Any:
        running.set()
        assert finish.wait(30)
        return lambda tx, passed: None

    thread = threading.Thread(
        target=svc._write, args=(blocks,), kwargs={"passes": False, "tracked": True}
    )
    thread.start()
    try:
        assert running.wait(10)
        yield
    finally:
        finish.set()
        thread.join(30)


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


def test_a_caller_returns_when_its_batch_ends_and_the_first_queued_leads_next() -> None:
    """Callers of a batch return when it ends, even while the next batch runs; the next
    batch is led by the caller queued first, and takes every caller queued by then."""
    gates = {work: threading.Event() for work in ("a", "b1", "b2", "c", "d")}
    started = {work: threading.Event() for work in gates}
    batches: list[list[str]] = []
    leaders: list[str] = []

    def run_batch(batch: list[Pending[str]]) -> None:
        batches.append([p.work for p in batch])
        leaders.append(threading.current_thread().name)
        for pending in batch:
            started[pending.work].set()
        for pending in batch:
            assert gates[pending.work].wait(10)
            pending.succeed(pending.work)

    group: GroupCommit[str] = GroupCommit(run_batch)
    threads: dict[str, Future[tuple[str, str]]] = {}

    def call(work: str) -> tuple[str, str]:
        return threading.current_thread().name, group.submit(work)

    with ThreadPoolExecutor(5, thread_name_prefix="caller") as pool:

        def submit(work: str) -> None:
            threads[work] = pool.submit(call, work)

        submit("a")
        assert started["a"].wait(10)
        submit("b1")
        wait_for(lambda: len(group._queue) == 1)
        submit("b2")
        wait_for(lambda: len(group._queue) == 2)
        gates["a"].set()
        assert started["b1"].wait(10) and started["b2"].wait(10)
        submit("c")
        wait_for(lambda: len(group._queue) == 1)
        submit("d")
        wait_for(lambda: len(group._queue) == 2)
        gates["b1"].set(), gates["b2"].set()
        assert started["c"].wait(10)  # the next batch runs, and waits for its gate
        results = {work: threads[work].result(5) for work in ("a", "b1", "b2")}
        gates["c"].set(), gates["d"].set()
        results |= {work: threads[work].result(10) for work in ("c", "d")}
    assert batches == [["a"], ["b1", "b2"], ["c", "d"]]
    assert all(answer == work for work, (_, answer) in results.items())
    names = {work: name for work, (name, _) in results.items()}
    assert leaders == [names["a"], names["b1"], names["c"]]


def _answer_in_capitals(batch: list[Pending[str]]) -> None:
    """Settle each operation: its work in capitals, or a ValueError for "bad..." work."""
    for pending in batch:
        if pending.work.startswith("bad"):
            pending.fail(ValueError(pending.work))
        else:
            pending.succeed(pending.work.upper())


def test_operations_queued_without_waiting_are_led_by_the_writer_thread() -> None:
    """``submit_later`` returns a future at once; a batch no caller is to lead (the queue was
    idle, or its first operation has no caller waiting) is led by the GroupCommit's thread,
    and callers queued behind it still lead their own batch and get their answers."""
    gate, running = threading.Event(), threading.Event()
    batches: list[tuple[str, list[str]]] = []

    def run_batch(batch: list[Pending[str]]) -> None:
        batches.append((threading.current_thread().name, [p.work for p in batch]))
        if len(batches) == 1:
            running.set()
            assert gate.wait(10)
        _answer_in_capitals(batch)

    group: GroupCommit[str] = GroupCommit(run_batch)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first = group.submit_later("a")
        while not running.is_set():  # led by another thread: this one is free
            await asyncio.sleep(0.001)
        assert not first.done()
        later = [group.submit_later(work) for work in ("b", "bad-c")]
        with ThreadPoolExecutor(1, thread_name_prefix="caller") as pool:
            waiting = loop.run_in_executor(pool, group.submit, "d")
            while len(group._queue) < 3:
                await asyncio.sleep(0.001)
            gate.set()
            assert await first == "A"
            assert await later[0] == "B"
            with pytest.raises(ValueError, match="bad-c"):
                await later[1]
            assert await waiting == "D"
        assert [work for _, work in batches] == [["a"], ["b", "bad-c", "d"]]
        assert {name for name, _ in batches} == {"fairpool-writer"}  # "b" was first in line
        with ThreadPoolExecutor(1, thread_name_prefix="caller") as pool:  # a caller first
            assert await loop.run_in_executor(pool, group.submit, "e") == "E"
            assert await group.submit_later("f") == "F"
        assert batches[2][0].startswith("caller") and batches[3][0] == "fairpool-writer"
        group.close()
        with pytest.raises(RuntimeError, match="closed"):
            group.submit_later("g")

    asyncio.run(asyncio.wait_for(main(), 30))  # a lost hand-off fails, not hangs


def test_queued_operations_are_led_on_the_loop_drive_on_names() -> None:
    """After ``drive_on(loop)``, a batch no caller leads runs as a task on that loop, with
    ``run_batch_async``; a thread's caller first in line behind it leads the next batch, and
    then the loop again; after ``stop_driving``, the thread leads."""
    batches: list[tuple[str, list[str]]] = []
    gate = asyncio.Event()

    def run_batch(batch: list[Pending[str]]) -> None:
        batches.append((threading.current_thread().name, [p.work for p in batch]))
        _answer_in_capitals(batch)

    async def run_batch_async(batch: list[Pending[str]]) -> None:
        batches.append(("loop", [p.work for p in batch]))
        if batch[0].work == "slow":
            await gate.wait()  # the loop is free meanwhile: its round trip, in fairpool
        _answer_in_capitals(batch)

    group: GroupCommit[str] = GroupCommit(run_batch, run_batch_async)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        group.drive_on(loop)
        assert await group.submit_later("a") == "A"
        slow = group.submit_later("slow")
        while not batches or batches[-1][1] != ["slow"]:
            await asyncio.sleep(0.001)
        with ThreadPoolExecutor(1, thread_name_prefix="caller") as pool:
            caller = loop.run_in_executor(pool, group.submit, "b")
            while not group._queue:
                await asyncio.sleep(0.001)
            queued = [group.submit_later(work) for work in ("bad-c", "d")]
            gate.set()
            assert await slow == "SLOW"
            assert await caller == "B"
            with pytest.raises(ValueError, match="bad-c"):
                await queued[0]
            assert await queued[1] == "D"
        assert await group.submit_later("e") == "E"
        await group.stop_driving()
        assert await group.submit_later("f") == "F"

    asyncio.run(asyncio.wait_for(main(), 30))  # a lost hand-off fails, not hangs
    group.close()
    assert batches == [
        ("loop", ["a"]),
        ("loop", ["slow"]),
        ("caller_0", ["b", "bad-c", "d"]),  # "b" was first in line: its caller leads
        ("loop", ["e"]),
        ("fairpool-writer", ["f"]),
    ]


@pytest.mark.parametrize("turns", [0, 1, 3])
def test_the_loop_turns_gather_turns_times_before_its_batch_is_taken(turns: int) -> None:
    """``drive_on(loop, gather_turns=k)``: operations queued up to k turns of the loop after
    the first share its batch; later ones form the next."""
    batches: list[list[str]] = []

    async def run_batch_async(batch: list[Pending[str]]) -> None:
        batches.append([p.work for p in batch])
        _answer_in_capitals(batch)

    group: GroupCommit[str] = GroupCommit(_answer_in_capitals, run_batch_async)

    async def queue_after(turns: int, work: str) -> str:
        for _ in range(turns):
            await asyncio.sleep(0)
        answer: str = await group.submit_later(work)
        return answer

    async def main() -> list[str]:
        group.drive_on(asyncio.get_running_loop(), gather_turns=turns)
        return await asyncio.gather(*(queue_after(i, f"w{i}") for i in range(6)))

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [f"W{i}" for i in range(6)]
    group.close()
    assert batches[0] == [f"w{i}" for i in range(turns + 1)]
    assert sorted(w for batch in batches for w in batch) == [f"w{i}" for i in range(6)]


def test_an_unsettled_operation_fails_instead_of_hanging() -> None:
    group: GroupCommit[str] = GroupCommit(lambda batch: None)
    with pytest.raises(RuntimeError, match="without settling"):
        group.submit("x")


@pytest.fixture
def svc(database_url: str) -> Iterator[Service]:
    with team_service(database_url, gpus=2) as service:
        yield service


def test_a_failing_write_in_a_shared_transaction_is_undone_alone(svc: Service) -> None:
    passes: list[PassSummary] = []
    svc.on_pass = lambda summary, _: passes.append(summary)
    with ThreadPoolExecutor(3) as pool:
        with batch_running(svc):  # the writes below queue up behind it
            futures: list[Future[Any]] = [
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
                pool.submit(svc.release_request, "no-such-request"),
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
            ]
            wait_for(lambda: len(svc._writes._queue) == 3)
        created = [futures[0].result(), futures[2].result()]
        with pytest.raises(NotFound):
            futures[1].result()
    assert [view.status for view in created] == ["allocated", "allocated"]
    assert len(passes) == 1 and sorted(passes[0].granted) == sorted(v.id for v in created)
    assert {r.id for r in svc.list_requests(status="allocated")} == {v.id for v in created}


def test_the_answers_of_a_batch_look_at_the_queue_once(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a request waits takes a sort of the whole queue (``queue_entries``): it is
    worked out once per pass for all the answers of its batch, not once per answer (with
    4,000 requests queued, 8 clients' queued submits took ~21 ms each instead of ~5.5)."""
    for _ in range(2):  # the pool's two units
        svc.create_request("team", demand={"gpu": 1})
    looks = [0]
    entries = service_module.queue_entries

    def counted(plan: Any) -> Any:
        looks[0] += 1
        return entries(plan)

    monkeypatch.setattr(service_module, "queue_entries", counted)
    with ThreadPoolExecutor(3) as pool:
        with batch_running(svc):
            futures = [pool.submit(svc.create_request, "team", demand={"gpu": 1})
                       for _ in range(3)]
            wait_for(lambda: len(svc._writes._queue) == 3)
        views = [future.result() for future in futures]
    assert looks[0] == 1
    assert sorted(view.queue[0].position for view in views) == [1, 2, 3]


def test_long_polls_are_woken_only_for_requests_that_waited(svc: Service) -> None:
    """A request allocated (or rejected) in the transaction that created it was never seen
    queued by anyone: its creator has the answer, so nobody is woken, and on PostgreSQL no
    NOTIFY is sent. One that waited is, when a later pass takes it out of the queue."""
    passes: list[PassSummary] = []
    handed: list[Mapping[str, RequestView]] = []
    svc.on_pass = lambda summary, views: (passes.append(summary), handed.append(views))[0]
    held = [svc.create_request("team", demand={"gpu": 1}) for _ in range(2)]
    waiting = svc.create_request("team", demand={"gpu": 1})
    refused = svc.create_request("team", demand={"gpu": 3})  # more than the pool has
    svc.release_request(held[0].id)
    assert [p.created for p in passes] == [[held[0].id], [held[1].id], [waiting.id],
                                           [refused.id], []]
    assert refused.status == "rejected"
    assert [p.dequeued() for p in passes] == [set(), set(), set(), set(), {waiting.id}]
    # Each comes with its view as committed, which a long-poll answers with unread.
    assert handed[:4] == [{}] * 4
    assert handed[4] == {waiting.id: svc.get_request(waiting.id)}
    assert handed[4][waiting.id].status == "allocated"


def test_the_live_state_a_transaction_keeps_is_what_the_database_holds(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operations keep the state in memory instead of reading it again: after every pass it
    equals a fresh load, in the same order, and what they answer equals what is read back."""
    checked = 0
    run_pass = service_module.Service._pass

    def checked_pass(self: Service, tx: Any) -> Any:
        nonlocal checked
        passed = run_pass(self, tx)
        fresh = service_module._State.load(tx.conn)
        for name in ("pools", "policies", "components", "allocations", "queued"):
            assert list(getattr(tx.state, name).items()) == list(getattr(fresh, name).items())
        assert tx.state.holders == fresh.holders
        for request_id, (request, allocation) in tx.finished.items():
            assert request == repo.get_request(tx.conn, request_id)
            assert allocation == repo.allocation_and_retry(tx.conn, request_id)[0]
        checked += 1
        return passed

    monkeypatch.setattr(service_module.Service, "_pass", checked_pass)
    svc.update_pool("gpus", capacity={"gpu": 6})
    svc.attach_policy("gpus", "vip", priority=5)
    for _ in range(2):  # several granted at one moment
        whole = svc.create_request("vip", demand={"gpu": 6})
        small = [svc.create_request(c, demand={"gpu": 1}) for c in ["team", "vip"] * 3]
        svc.release_request(whole.id)
        for view in small:
            if svc.get_request(view.id).status in ("queued", "allocated"):
                svc.cancel_request(view.id)
    rng = random.Random(7)
    made: list[str] = []

    def operation() -> Callable[[], Any]:
        live = [r for r in made if svc.get_request(r).status in ("queued", "allocated")]
        choice = rng.random()
        if choice < 0.4 or not live:
            component = rng.choice(["team", "team", "vip"])
            lease = rng.choice([None, None, 1])
            return lambda: svc.create_request(
                component, demand={"gpu": rng.randint(1, 3)}, max_retries=rng.randint(0, 1),
                lease_ttl=lease,
            )
        target = rng.choice(live)
        return rng.choice([
            lambda: svc.release_request(target), lambda: svc.cancel_request(target),
            lambda: svc.heartbeat(target), svc.reconcile,
            lambda: svc.create_request("team", demand={"gpu": 9}),  # rejected at once
        ])

    def record(result: Any) -> None:
        if isinstance(result, RequestView):
            made.append(result.id)
            read = svc.get_request(result.id)
            assert replace(result, queue=()) == replace(read, queue=())

    for step in range(60):
        # Forward (leases expire), and sometimes back (records come out of order).
        svc.clock.now += timedelta(seconds=rng.choice([0, 0, 2, -1]))  # type: ignore[attr-defined]
        if step % 3:
            try:
                record(operation()())
            except Conflict:
                pass
            continue
        # Several operations in one transaction, one of them failing.
        with ThreadPoolExecutor(4) as pool:
            with batch_running(svc):
                futures = [pool.submit(operation()) for _ in range(3)]
                futures.append(pool.submit(svc.release_request, "no-such-request"))
                wait_for(lambda: len(svc._writes._queue) == 4)
            for future in futures:
                try:
                    record(future.result())
                except (Conflict, NotFound):
                    pass
    assert checked > 40
    with svc.db.read() as conn:  # each request's events, written together, exactly once
        events = repo.list_events(conn)
        ids, _, _ = repo.request_page(conn)
    assert sorted(e.request_id for e in events if e.kind in ("created", "retried")) == sorted(ids)


def _request_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every write of a request's row from now on: (how, its id, its status)."""
    writes: list[tuple[str, str, str]] = []
    insert, update = repo.write_request, repo.set_request_status

    def inserted(conn: Any, request: Any, key: str | None = None) -> None:
        writes.append(("insert", request.id, request.status.value))
        insert(conn, request, key)

    def updated(conn: Any, request_id: str, status: Any, *args: Any, **kwargs: Any) -> None:
        writes.append(("update", request_id, status.value))
        update(conn, request_id, status, *args, **kwargs)

    monkeypatch.setattr(repo, "write_request", inserted)
    monkeypatch.setattr(repo, "set_request_status", updated)
    return writes


# (gpu asked for, with how many of the pool's 2 held: status at once, its reason's start)
NEW_REQUESTS = [
    (1, 0, "allocated", "allocated on pool gpus"),
    (3, 0, "rejected", "pool gpus: gpu requested 3 > capacity 2"),
    (1, 2, "queued", "waiting: policy team on gpus: gpu requested 1, in use 2 of limit 2"),
]


@pytest.mark.parametrize(("gpus", "held", "status", "reason"), NEW_REQUESTS)
def test_a_new_request_is_written_once_with_what_its_pass_decided(
    svc: Service, monkeypatch: pytest.MonkeyPatch, gpus: int, held: int, status: str,
    reason: str,
) -> None:
    """Not inserted queued, then updated: its row is written once the pass of the transaction
    that created it has decided, and reads back as answered."""
    holders = [svc.create_request("team", demand={"gpu": 1}) for _ in range(held)]
    writes = _request_writes(monkeypatch)
    view = svc.create_request("team", demand={"gpu": gpus})
    assert (view.status, writes) == (status, [("insert", view.id, status)])
    assert replace(svc.get_request(view.id), queue=()) == replace(view, queue=())
    assert view.status_reason is not None and view.status_reason.startswith(reason)
    if holders:  # one that waited is updated when a later pass grants it
        svc.release_request(holders[0].id)
        assert svc.get_request(view.id).status == "allocated"
        assert writes[1:] == [("update", holders[0].id, "released"),
                              ("update", view.id, "allocated")]


def test_two_creates_with_one_key_in_one_batch_make_one_request(svc: Service) -> None:
    """The first's row is not written when the second looks its key up: it is then."""
    with ThreadPoolExecutor(2) as pool:
        with batch_running(svc):
            futures = [pool.submit(svc.create_request, "team", demand={"gpu": 1},
                                   idempotency_key="once") for _ in range(2)]
            wait_for(lambda: len(svc._writes._queue) == 2)
        first, second = (future.result() for future in futures)
    assert first.id == second.id and first.status == "allocated"
    assert [r.id for r in svc.list_requests()] == [first.id]


def test_an_operation_that_does_not_keep_the_state_finds_a_new_request_of_its_batch(
    svc: Service,
) -> None:
    """It may read any row, and makes the transaction forget the live state: a request
    created before it in the batch, not yet in the database, is written first."""
    with ThreadPoolExecutor(2) as pool:
        with batch_running(svc):
            made = pool.submit(svc.create_request, "team", demand={"gpu": 1})
            pooled = pool.submit(svc.create_pool, "more", {"gpu": 1})  # not tracked
            wait_for(lambda: len(svc._writes._queue) == 2)
        view = made.result()
        pooled.result()
    assert view.status == "allocated"
    assert [(r.id, r.status) for r in svc.list_requests()] == [(view.id, "allocated")]


def test_a_prefix_naming_a_new_request_of_its_batch_is_ambiguous_as_in_the_database(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix is looked up in the database: a request created earlier in the batch is
    written first, so that the prefix names both, not only the older one."""
    ids = (f"abcd0000-0000-4000-8000-{n:012}" for n in itertools.count())
    monkeypatch.setattr(repo, "new_id", lambda: next(ids))
    older = svc.create_request("team", demand={"gpu": 1})
    with ThreadPoolExecutor(2) as pool:
        with batch_running(svc):
            made = pool.submit(svc.create_request, "team", demand={"gpu": 1})
            released = pool.submit(svc.release_request, "abcd")
            wait_for(lambda: len(svc._writes._queue) == 2)
        newer = made.result()
        with pytest.raises(AmbiguousReference):
            released.result()
    assert newer.id != older.id
    assert {r.id: r.status for r in svc.list_requests()} == {
        older.id: "allocated", newer.id: "allocated"
    }


def test_a_new_request_preempting_in_its_own_transaction_is_named_by_its_victim(
    svc: Service,
) -> None:
    """The victim's row names its preemptor, so the new request's row is written first."""
    svc.attach_policy("gpus", "vip", priority=5)
    victims = [svc.create_request("team", demand={"gpu": 1}) for _ in range(2)]
    winner = svc.create_request("vip", demand={"gpu": 2})
    assert winner.status == "allocated"
    for victim in victims:
        read = svc.get_request(victim.id)
        assert (read.status, read.preempted_by_id) == ("preempted", winner.id)


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    loads = [0]
    load = service_module._State.load

    def counted(conn: Any) -> Any:
        loads[0] += 1
        return load(conn)

    monkeypatch.setattr(service_module._State, "load", staticmethod(counted))
    return loads


def test_a_batch_starts_from_the_state_the_last_one_committed(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests created, granted, released and cancelled one batch after another: the live
    state is loaded once, then carried from commit to commit."""
    svc.reconcile()  # the fixture's pool and policy writes do not track the state
    loads = _count_loads(monkeypatch)
    views = [svc.create_request("team", demand={"gpu": 1}) for _ in range(3)]
    assert [v.status for v in views] == ["allocated", "allocated", "queued"]
    svc.release_request(views[0].id)
    assert svc.get_request(views[2].id).status == "allocated"
    svc.cancel_request(views[1].id)
    svc.heartbeat(views[2].id)
    svc.reconcile()
    assert loads[0] <= 1  # views of waiting requests (get_request) load in their own reads


def test_a_write_by_anyone_else_makes_the_next_batch_load_the_state_again(
    svc: Service, database_url: str
) -> None:
    """Another process (here a second service on the same database) takes the last units,
    then gives them back: the first service's batches see both writes, whatever they kept."""
    first = svc.create_request("team", demand={"gpu": 1})
    other_db = Database.open(database_url)
    try:
        other = Service(other_db, svc.clock)
        taken = other.create_request("team", demand={"gpu": 1})
        assert taken.status == "allocated"
        # Both units are held: a third request waits (over-commit if the state were stale).
        third = svc.create_request("team", demand={"gpu": 1})
        assert third.status == "queued"
        other.release_request(taken.id)
        other.update_pool("gpus", capacity={"gpu": 3})  # an untracked write there too
    finally:
        other_db.close()
    svc.release_request(first.id)
    assert svc.get_request(third.id).status == "allocated"
    fourth = svc.create_request("team", demand={"gpu": 2})
    assert fourth.status == "allocated"  # the capacity of 3 the other one set
    assert svc.create_request("team", demand={"gpu": 1}).status == "queued"


def test_an_operation_refused_on_a_state_another_writer_changed_runs_again(
    svc: Service, database_url: str
) -> None:
    """The first service still holds its state from before the other one's write, in which
    the request waits: releasing it must not be refused ("queued, not allocated"), since the
    other service allocated it. On PostgreSQL the batch learns only when its writes are sent
    that the state was stale; the refusal must wait for that."""
    holders = [svc.create_request("team", demand={"gpu": 1}) for _ in range(2)]
    waiting = svc.create_request("team", demand={"gpu": 1})
    assert waiting.status == "queued"
    other_db = Database.open(database_url)
    try:
        Service(other_db, svc.clock).release_request(holders[0].id)  # and allocates `waiting`
    finally:
        other_db.close()
    assert svc.release_request(waiting.id).status == "released"
    with pytest.raises(Conflict, match="released, not allocated"):
        svc.release_request(waiting.id)  # refused on a current state: refused for good


def test_a_batch_that_rolls_back_leaves_no_state_behind(svc: Service) -> None:
    """A batch of one whose operation fails after changing the state in memory is rolled
    back: the next batch must not start from what it left."""
    held = svc.create_request("team", demand={"gpu": 2})

    def fails_half_way(tx: Any) -> Any:
        svc._finish(tx, svc._request(tx, held.id), service_module.RequestStatus.RELEASED, "x")
        raise RuntimeError("after the release, before the commit")

    with pytest.raises(RuntimeError, match="before the commit"):
        svc._write(fails_half_way, tracked=True)
    assert svc.get_request(held.id).status == "allocated"
    assert svc.create_request("team", demand={"gpu": 1}).status == "queued"


def test_an_operation_failing_half_way_in_a_batch_is_undone_alone(svc: Service) -> None:
    """Its writes and its changes to the state in memory are gone; the operations around it
    commit (the batch runs again without it)."""
    held = svc.create_request("team", demand={"gpu": 2})

    def fails_half_way(tx: Any) -> Any:
        svc._finish(tx, svc._request(tx, held.id), service_module.RequestStatus.RELEASED, "x")
        raise RuntimeError("after the release, before the commit")

    with ThreadPoolExecutor(3) as pool:
        with batch_running(svc):
            futures: list[Future[Any]] = [
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
                pool.submit(svc._write, fails_half_way, tracked=True),
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
            ]
            wait_for(lambda: len(svc._writes._queue) == 3)
        around = [futures[0].result(), futures[2].result()]
        with pytest.raises(RuntimeError, match="before the commit"):
            futures[1].result()
    assert svc.get_request(held.id).status == "allocated"  # the release was undone
    assert [view.status for view in around] == ["queued", "queued"]  # the 2 units stay held
    assert {svc.get_request(v.id).status for v in around} == {"queued"}


def test_an_operation_whose_write_fails_when_sent_is_undone_alone(svc: Service) -> None:
    """On PostgreSQL a batch's writes are sent together after its changes ran, so a failed
    write is not known to be any one operation's: the batch runs again writing as it goes,
    and then only that operation fails, with its own error. Same outcome on SQLite."""
    held = svc.create_request("team", demand={"gpu": 2})

    def fails_when_written(tx: Any) -> Any:
        svc._finish(tx, svc._request(tx, held.id), service_module.RequestStatus.RELEASED, "x")
        repo.renew_lease(tx.conn, "no-such-request", svc.clock())  # changes no row
        return lambda tx, _: None

    with ThreadPoolExecutor(3) as pool:
        with batch_running(svc):
            futures: list[Future[Any]] = [
                pool.submit(svc.create_request, "team", demand={"gpu": 1}),
                pool.submit(svc._write, fails_when_written, tracked=True),
                # It reads (its key): on PostgreSQL the failed write is sent in its change.
                pool.submit(svc.create_request, "team", demand={"gpu": 1}, idempotency_key="k"),
            ]
            wait_for(lambda: len(svc._writes._queue) == 3)
        around = [futures[0].result(), futures[2].result()]
        with pytest.raises(NotFound, match="no-such-request"):
            futures[1].result()
    assert svc.get_request(held.id).status == "allocated"
    assert [view.status for view in around] == ["queued", "queued"]
    assert {svc.get_request(v.id).status for v in around} == {"queued"}
