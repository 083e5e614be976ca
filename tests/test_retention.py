"""Retention (``fairpool prune``, ``Service.prune``) on a real database, SQLite and
PostgreSQL: what ended before the cutoff goes, with its history; nothing live, nothing recent,
and no decision changes."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from fairpool import Client, retention
from fairpool.api import app
from fairpool.api.app import create_app
from fairpool.errors import InvalidInput, NotFound
from fairpool.scheduling import SchedulingService
from fairpool.service import Service
from fairpool.store import repo, schema
from fairpool.store.db import Database
from fairpool.trees_service import TreesService
from fairpool.views import MAX_RETENTION, PruneView
from tests.servers import API, ApiServer, running, serving
from tests.test_api import poll_until
from tests.test_service import Clock, table_counts

DAY = 24 * 3600
WORKLOADS = "resource_queues: [{name: default}]\nscheduling_rules: [{resource_queue: default}]\n"


class World:
    """The three services on one database, on one clock."""

    def __init__(self, database_url: str) -> None:
        self.clock = Clock()
        db = Database.open(database_url)
        self.requests = Service(db, self.clock)
        self.workloads = SchedulingService(db, self.clock)
        self.trees = TreesService(db, self.clock)

    def later(self, days: float) -> None:
        self.clock.now += timedelta(days=days)

    def live_state(self) -> Any:
        """What decisions are made from: pools' use, queues, live workloads and operations."""
        return (
            [p.as_dict() for p in self.requests.list_pools()],
            *([r.as_dict() for r in self.requests.list_requests(status=status)]
              for status in ("queued", "allocated")),
            [w.id for w in self.workloads.list_workloads(status="admitted")],
            [op.as_dict() for op in self.trees.list_operations(status="running")],
        )


@pytest.fixture
def world(database_url: str) -> Iterator[World]:
    made = World(database_url)
    yield made
    made.requests.close()


def test_what_ended_before_the_cutoff_goes_with_its_history_and_nothing_else(
    world: World,
) -> None:
    svc, sched, trees = world.requests, world.workloads, world.trees
    svc.create_pool("p", {"gpu": 2})
    svc.attach_policy("p", "low", priority=1)
    svc.attach_policy("p", "high", priority=9)
    sched.apply_config(WORKLOADS)
    trees.add_node("n", [], {"cpu": 8})
    trees.create_tree("t")
    trees.create_pool("t", "a")

    def operation() -> str:
        return trees.start_operation(pool="a", user="u", job_resources={"cpu": 1},
                                     job_count=1).id

    def workload() -> str:
        return sched.submit_workload(demand={"cpu": "1"}).id

    # Day 0: some end, some stay live.
    released = svc.create_request("low", demand={"gpu": 1}).id
    svc.release_request(released)
    deleted = svc.create_request("low", demand={"gpu": 1}).id
    svc.delete_request(deleted)  # its history outlives it, until a prune
    # Attempts of one request: the first preempted, so is the second, the third waits.
    first = svc.create_request("low", demand={"gpu": 2}, max_retries=2).id
    ended_high = svc.create_request("high", demand={"gpu": 2}).id
    second = svc.get_request(first).retried_as_id
    assert second is not None
    svc.release_request(ended_high)
    held = svc.create_request("high", demand={"gpu": 2}).id
    third = svc.get_request(second).retried_as_id
    assert third is not None and svc.get_request(third).status == "queued"
    old_workload, live_workload = workload(), workload()
    sched.release_workload(old_workload)
    old_operation, live_operation = operation(), operation()
    trees.complete_operation(old_operation)
    svc.create_pool("old", {"gpu": 1})
    svc.delete_pool("old")  # an event that names no request
    # Day 10: more end, recently.
    world.later(10)
    recent = svc.create_request("low", demand={"gpu": 1}).id
    svc.cancel_request(recent)
    recent_workload = workload()
    sched.cancel_workload(recent_workload)
    recent_operation = operation()
    trees.abort_operation(recent_operation)
    svc.create_pool("recent", {"gpu": 1})
    svc.delete_pool("recent")

    before = world.live_state()
    rows = table_counts(svc)
    would = svc.prune(5 * DAY, dry_run=True)
    assert table_counts(svc) == rows  # a dry run deletes nothing
    assert (would.dry_run, would.before) == (True, world.clock.now - timedelta(days=5))
    # Not the first and second attempts: their retry lives on, and a holder follows it from
    # the attempt it held (the first one was pruned: helper-77).
    assert (would.requests, would.workloads, would.operations) == (2, 1, 1)
    assert would.events == 1 + sum(len(svc.request_events(r))  # and pool old's
                                   for r in (released, deleted, ended_high))

    done = svc.prune(5 * DAY)
    assert done.as_dict() == {**would.as_dict(), "dry_run": False,
                              "before": done.before.isoformat()}
    for gone in (released, ended_high):
        with pytest.raises(NotFound):
            svc.get_request(gone)
    for gone in (released, deleted, ended_high):
        with pytest.raises(NotFound):
            svc.request_events(gone)
    with svc.db.read() as conn:
        assert list(conn.scalars(select(schema.event.c.message).where(
            schema.event.c.request_id.is_(None)))) == ["pool recent deleted"]
    with pytest.raises(NotFound):
        sched.get_workload(old_workload)
    with pytest.raises(NotFound):
        trees.describe_operation(old_operation)
    # The live and the recent stay, each with its whole history.
    assert svc.get_request(held).status == "allocated"
    assert [e.kind for e in svc.request_events(held)] == ["created", "allocated"]
    assert svc.get_request(recent).status == "cancelled"
    kept = svc.get_request(second)
    assert (kept.status, kept.attempt, kept.retried_as_id) == ("preempted", 2, third)
    assert kept.previous_attempt_id == first
    assert svc.get_request(first).retried_as_id == second
    assert len(svc.request_events(first)) > 0
    assert sched.get_workload(live_workload).status == "admitted"
    assert sched.get_workload(recent_workload).status == "cancelled"
    assert trees.describe_operation(live_operation).status == "running"
    assert trees.describe_operation(recent_operation).status == "aborted"
    assert world.live_state() == before
    # No decision changes: the next pass finds nothing to do, and a release still admits.
    assert svc.reconcile().as_dict()["granted"] == []
    svc.release_request(held)
    assert svc.get_request(third).status == "allocated"
    again = svc.prune(5 * DAY)
    assert again.counts() == {"requests": 0, "events": 0, "workloads": 0, "operations": 0}
    # Once the last attempt ended long enough ago, the first and second go with it.
    svc.release_request(third)
    world.later(10)
    svc.prune(5 * DAY)
    assert svc.list_requests() == []


def test_a_large_prune_goes_in_batches_and_may_leave_the_rest_for_the_next(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH", 3)
    svc = world.requests
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "c")
    for _ in range(10):
        svc.release_request(svc.create_request("c", demand={"gpu": 1}).id)
    live = svc.create_request("c", demand={"gpu": 1}).id
    world.later(1)
    some = svc.prune(0, batches=2)  # as a server's tick does: the rest on the next
    assert (some.requests, some.events, some.complete) == (6, 0, False)
    told: list[tuple[int, int]] = []
    rest = svc.prune(0, progress=lambda so_far: told.append((so_far.requests, so_far.events)))
    assert (rest.requests, rest.events, rest.complete) == (4, 30, True)  # 3 per request
    # After each transaction: the requests left, then their history.
    assert told == [(3, 0), (4, 0), *((4, events) for events in (3, 6, 9, 12, 15, 18, 21, 24, 27, 30))]
    assert [r.id for r in svc.list_requests()] == [live]
    assert svc.prune(0, batches=0).complete  # nothing due: nothing left over


def test_a_servers_prune_takes_a_batch_a_tick_then_waits_an_hour(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Api.prune_if_due``: at most ``PRUNE_BATCHES`` transactions per tick, the rest on
    the next ticks, so that leases still expire on time; once done, none for an hour."""
    monkeypatch.setattr(retention, "BATCH", 2)
    monkeypatch.setattr(app, "PRUNE_BATCHES", 1)
    svc = world.requests
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "c")

    def ended() -> None:
        svc.release_request(svc.create_request("c", demand={"gpu": 1}).id)

    def rows() -> int:
        counts = table_counts(svc)
        return int(counts["request"] + counts["event"])

    for _ in range(3):
        ended()  # 3 requests, 9 events: 6 batches of 2
    world.later(1)
    api = app.Api(svc, tick=1.0, keep_history=3600)
    left = [rows()]
    for _ in range(7):
        api.prune_if_due()
        left.append(rows())
    assert left == [12, 10, 9, 7, 5, 3, 1, 0]  # requests: 2, 1; events: 2, 2, 2, 2, 1
    ended()
    world.later(1)
    api.prune_if_due()  # due again in an hour only
    assert rows() == 4  # its request and 3 events


def test_what_another_replica_pruned_meanwhile_is_not_counted(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = world.requests
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "c")
    for _ in range(3):
        svc.release_request(svc.create_request("c", demand={"gpu": 1}).id)
    delete_ids = repo.delete_ids

    def raced(conn: Any, table: Any, ids: Any) -> int:
        if table is schema.request:  # between the read and the write, another prune's delete
            delete_ids(conn, table, ids[:1])
        return delete_ids(conn, table, ids)

    monkeypatch.setattr(repo, "delete_ids", raced)
    world.later(1)
    assert svc.prune(0).requests == 2


@pytest.mark.parametrize(("older_than", "message"), [
    (-1, "older_than: must be a non-negative integer (got -1)"),
    (True, "older_than: must be an integer (got true)"),
    (1.5, "older_than: must be an integer (got 1.5)"),
    (MAX_RETENTION + 1, f"older_than: must be at most {MAX_RETENTION}"),
])
def test_a_bad_cutoff_is_refused_naming_it(world: World, older_than: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        world.requests.prune(older_than)
    assert str(refused.value).startswith(message)


def test_a_prune_over_http_takes_a_bounded_part_a_call(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However much is due, one ``POST /prune`` takes ``PRUNE_BATCHES_PER_CALL``
    transactions at most and says whether more is; the client calls again until none is
    (one call did all that was due: on PostgreSQL, half a million requests reach the
    client's 75 s read timeout, after which it sent the call again)."""
    monkeypatch.setattr(retention, "BATCH", 3)
    svc = world.requests
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "c")
    for _ in range(30):  # 10 transactions of requests, 30 of their events: 2 calls
        svc.release_request(svc.create_request("c", demand={"gpu": 1}).id)
    world.later(1)
    with serving(create_app(svc, tick=3600.0)) as url:
        with httpx.Client(base_url=url + API, timeout=30.0) as http:
            one = http.post("/prune", json={"older_than": 0, "batches": 2}).json()
            assert (one["requests"], one["events"], one["complete"]) == (6, 0, False)
        told: list[PruneView] = []
        with Client(url) as client:
            done = client.prune(0, progress=told.append)
    assert (done.requests, done.events, done.complete) == (24, 90, True)
    assert [(part.requests, part.events, part.complete) for part in told] == [(24, 36, False)]
    assert done.before > told[0].before  # the last call's cutoff: all before it is gone
    assert svc.list_requests() == []


def test_a_server_with_keep_history_prunes_on_its_own(tmp_path: Path) -> None:
    """``--keep-history 1h``: a store whose requests ended days ago (written on a clock set
    back), pruned as the server starts; what it holds now stays. Said in its log and its
    metrics."""
    home = tmp_path / "home"
    home.mkdir()
    old = Service(Database.open(f"sqlite:///{home / 'fairpool.db'}"), Clock())  # March 2026
    try:
        old.create_pool("p", {"gpu": 2})
        old.attach_policy("p", "c")
        ended = old.create_request("c", demand={"gpu": 1}).id
        old.release_request(ended)
        kept = old.create_request("c", demand={"gpu": 1}).id  # held since March, no lease
    finally:
        old.close()
    server = ApiServer(tmp_path / "server.log", home=home, tick=0.2,
                       extra=("--keep-history", "1h", "--log-level", "info"))
    with running(server), httpx.Client(base_url=server.url + API, timeout=30.0) as http:
        poll_until(lambda: http.get(f"/requests/{ended}").status_code == 404)
        assert http.get(f"/requests/{ended}/events").status_code == 404
        assert http.get(f"/requests/{kept}").json()["status"] == "allocated"
        made = http.post("/requests", json={"component": "c", "resources": {"gpu": 1}})
        assert http.post(f"/requests/{made.json()['id']}/release").status_code == 200
        metrics = httpx.get(server.url + "/metrics").text
        assert 'fairpool_pruned_total{kind="requests"} 1.0' in metrics
        assert 'fairpool_pruned_total{kind="events"} 3.0' in metrics
        # Ended a moment ago: kept for the hour (only what ended an hour ago goes).
        assert len(http.get("/requests").json()["items"]) == 2
    assert re.search(r"INFO: +Pruned what ended before \S+: 1 requests, 3 events, "
                     r"0 workloads, 0 operations", server.log()), server.log()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize(("bad", "problem"), [
    ("3x", "is not a duration: a whole number with s, m, h or d (30d, 12h)."),
    ("٣d", "is not a duration: a whole number with s, m, h or d (30d, 12h)."),
    ("36501d", "is longer than 36500 days."),
    ("99999999999999999d", "is longer than 36500 days."),
    # Taken for seconds: meant for days, it kept 30 s of history (helper-83).
    ("30", "has no unit: a whole number with s, m, h or d (30d, 12h; 0 alone needs none)."),
    ("30m", "is shorter than 1h."),  # clients still read what ended a moment ago
])
def test_a_bad_keep_history_is_one_usage_line(bad: str, problem: str) -> None:
    for command in ([sys.executable, "-m", "fairpool.api"],
                    [str(Path(sys.executable).parent / "fairpool"), "server"]):
        run = subprocess.run([*command, "--keep-history", bad],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "--keep-history" in run.stderr, run.stderr
        assert f"{bad!r} {problem}" in run.stderr.strip().splitlines()[-1], run.stderr
