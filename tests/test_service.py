"""The service on a real database, SQLite and PostgreSQL: lifecycle, retries, validation,
refusals, events."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from sqlalchemy import func, select

from fairpool import Client
from fairpool.cli.resource_pool import occupied_cell
from fairpool.errors import Conflict, InvalidInput, NotFound, WouldWait
from fairpool.service import Service
from fairpool.store import repo, schema
from fairpool.store.db import Database, read_generation
from fairpool.store.records import ComponentType
from fairpool.views import REQUEST_STATUSES, PassSummary, RequestView
from tests.conftest import walked_pages
from tests.worlds import demand


class Clock:
    """Time the tests move by hand (the engine never reads the wall clock); each reading
    moves it ``step`` on (by default 1 ms, so that records get distinct times)."""

    def __init__(
        self, now: datetime = datetime(2026, 3, 1, tzinfo=UTC),
        step: timedelta = timedelta(milliseconds=1),
    ) -> None:
        self.now = now
        self.step = step

    def __call__(self) -> datetime:
        self.now += self.step
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@contextmanager
def team_service(database_url: str, gpus: int) -> Iterator[Service]:
    """A service on ``database_url`` with one pool of ``gpus`` GPUs, open to the component
    "team"; closed after."""
    service = Service(Database.open(database_url), Clock())
    try:
        service.create_pool("gpus", {"gpu": gpus})
        service.attach_policy("gpus", "team")
        yield service
    finally:
        service.close()


@pytest.fixture
def svc(database_url: str, clock: Clock) -> Iterator[Service]:
    db = Database.open(database_url)
    yield Service(db, clock)
    db.close()


def table_counts(svc: Service) -> dict[str, int]:
    with svc.db.read() as conn:
        return {
            name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for name, table in schema.metadata.tables.items()
        }


def test_preempted_request_with_retries_is_queued_again_as_a_linked_attempt(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 2})
    svc.attach_policy("p", "sandbox", priority=1)
    svc.attach_policy("p", "prod", priority=9)
    low = svc.create_request("sandbox", demand=demand(gpu_count=2), max_retries=1)
    assert low.status == "allocated"
    high = svc.create_request("prod", demand=demand(gpu_count=2))
    assert high.status == "allocated"

    victim = svc.get_request(low.id)
    assert victim.status == "preempted"
    assert victim.preempted_by_id == high.id
    assert victim.status_reason == f"preempted by request {high.id} on pool p (priority 9 > 1)"
    # The preemptor's reason and history name its victims too (they said nothing of them).
    preempting = f"allocated on pool p (policy priority 9), preempting request {low.id}"
    assert high.status_reason == preempting
    assert [e.message for e in svc.request_events(high.id)][-1] == preempting
    assert victim.retried_as_id is not None
    retry = svc.get_request(victim.retried_as_id)
    assert (retry.status, retry.attempt, retry.previous_attempt_id) == ("queued", 2, low.id)
    assert retry.queue[0].position == 1

    # The retry is preempted again only if it runs; it has no retries left after that.
    svc.release_request(high.id)
    assert svc.get_request(retry.id).status == "allocated"
    again = svc.create_request("prod", demand=demand(gpu_count=2))
    assert again.status == "allocated"
    final = svc.get_request(retry.id)
    assert final.status == "preempted" and final.retried_as_id is None


def test_reclaim_is_recorded_with_its_rule(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 4})
    svc.attach_policy("p", "red", priority=5, reserved={"gpu": 2}, limit={"gpu": 4})
    svc.attach_policy("p", "blue", priority=5, reserved={"gpu": 2}, limit={"gpu": 4})
    first = svc.create_request("red", demand=demand(gpu_count=2))
    second = svc.create_request("red", demand=demand(gpu_count=2))
    blue = svc.create_request("blue", demand=demand(gpu_count=2))
    assert blue.status == "allocated"
    assert svc.get_request(first.id).status == "allocated"
    taken = svc.get_request(second.id)
    assert taken.status == "preempted"
    assert "reclaim of borrowed units" in (taken.status_reason or "")
    with svc.db.read() as conn:
        (event,) = [e for e in repo.list_events(conn, request_id=second.id) if e.kind == "preempted"]
    assert event.data == {"rule": "reclaim", "by": blue.id}


def test_every_transition_is_an_event(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch", priority=1)
    a = svc.create_request("orch", demand=demand(gpu_count=1))
    b = svc.create_request("orch", demand=demand(gpu_count=1))
    c = svc.create_request("orch", demand=demand(gpu_count=5))
    svc.release_request(a.id)
    svc.cancel_request(b.id)
    with svc.db.read() as conn:
        kinds = {r: [e.kind for e in repo.list_events(conn, request_id=r)] for r in (a.id, b.id, c.id)}
    assert kinds == {
        a.id: ["created", "allocated", "released"],
        b.id: ["created", "allocated", "cancelled"],
        c.id: ["created", "rejected"],
    }


def test_waiting_reason_is_stored_and_only_rewritten_when_it_changes(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch", priority=1)
    svc.create_request("orch", demand=demand(gpu_count=1))
    waiting = svc.create_request("orch", demand=demand(gpu_count=1))
    assert waiting.status_reason == "waiting: policy orch on p: gpu requested 1, in use 1 of limit 1"
    before = svc.get_request(waiting.id).updated
    svc.reconcile()
    assert svc.get_request(waiting.id).updated == before


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.create_pool("q", {"gpu": 0}), "capacity.gpu"),
        (lambda s: s.create_pool("q", {"gpu": "8"}), "capacity.gpu"),
        (lambda s: s.create_pool("q", {}), "capacity"),
        (lambda s: s.create_pool("", {"gpu": 1}), "name"),
        (lambda s: s.update_pool("p", capacity={"gpu": -1}), "capacity.gpu"),
        (lambda s: s.update_pool("p", capacity={}), "capacity"),  # changes nothing
        (lambda s: s.update_pool("p", capacity={"npu": 0}), "capacity.npu"),  # no such key
        (lambda s: s.create_pool("q", {"gpu": 1, "gpu ": 2}), "capacity key"),  # a second gpu
        (lambda s: s.create_request("orch", demand={" gpu": 1}), "resources key"),
        (lambda s: s.update_pool("p", capacity={"gpu": 0}), "capacity.gpu"),  # reserved: kept
        (lambda s: s.update_pool("p", capacity={"gpu": 3}), "reserved.gpu"),
        (lambda s: s.attach_policy("p", "x", priority=-1), "priority"),
        (lambda s: s.attach_policy("p", "x", reserved={"npu": 1}), "reserved.npu"),
        (lambda s: s.attach_policy("p", "x", limit={"gpu": 9, "npu": 1}), "limit.npu"),
        (lambda s: s.attach_policy("p", "x", reserved={"gpu": 3}, limit={"gpu": 2}), "reserved.gpu"),
        (lambda s: s.attach_policy("p", "x", reserved={"gpu": 5}), "reserved.gpu"),
        (lambda s: s.attach_policy("p", "x", component_type="gpu-box"), "component_type"),
        (lambda s: s.create_request("orch", demand={}), "resources"),
        (lambda s: s.create_request("orch", demand={"gpu": 0}), "resources.gpu"),
        (lambda s: s.create_request("orch", demand={"gpu": 1}, max_retries=-1), "max_retries"),
        (lambda s: s.list_requests(status="sleeping"), "status"),
        # Names print as themselves: a newline forged a table's lines, an escape sequence
        # recoloured the reader's terminal.
        (lambda s: s.create_pool("q\x1b[31m", {"gpu": 1}), "name"),
        (lambda s: s.attach_policy("p", "x\ny", priority=1), "component"),
        (lambda s: s.create_request("orch", demand={"gpu": 1}, labels={"k\t": "v"}), "labels key"),
        (lambda s: s.create_pool("q", {"g\x7fpu": 1}), "capacity key"),
        (lambda s: s.cancel_request("x", reason="line\nforged"), "reason"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(svc: Service, call, field: str) -> None:  # type: ignore[no-untyped-def]
    svc.create_pool("p", {"gpu": 8, "tpu": 2})
    svc.attach_policy("p", "orch", priority=1, reserved={"gpu": 4})
    before = table_counts(svc)
    with pytest.raises(InvalidInput) as raised:
        call(svc)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")
    assert table_counts(svc) == before


def test_names_stored_before_they_had_to_print_stay_usable(svc: Service) -> None:
    """Made before 2026-11-29, when names could hold a newline or a tab: such a pool's key
    can still be removed, and such a component can still ask and be given policies. A new
    name must print."""
    now = datetime.now(UTC)
    with svc.db.write() as conn:
        repo.insert_pool(conn, "old\npool", None, {"g\tpu": 2, "gpu": 2}, now)
        repo.insert_component(conn, "x\ny", ComponentType.ORCHESTRATOR, now)
    svc.attach_policy("old\npool", "x\ny", priority=1, limit={"g\tpu": 1})
    assert svc.create_request("x\ny", demand={"gpu": 1}).status == "allocated"
    assert svc.update_pool("old\npool", capacity={"g\tpu": 0}).capacity == {"gpu": 2}
    with pytest.raises(InvalidInput, match=r"^component: must not contain control"):
        svc.attach_policy("old\npool", "z\nw", priority=1)  # a new component
    with pytest.raises(InvalidInput, match=r"^capacity key: must not contain control"):
        svc.update_pool("old\npool", capacity={"t\tpu": 1})  # a new key
    with pytest.raises(NotFound):  # no such component: nothing to refuse
        svc.create_request("o\u202ez", demand={"gpu": 1})


def test_reserved_total_is_checked_across_policies(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 8})
    svc.attach_policy("p", "a", reserved={"gpu": 5})
    with pytest.raises(InvalidInput, match="reserved totals on pool 'p' would exceed its capacity 8"):
        svc.attach_policy("p", "b", reserved={"gpu": 4})
    svc.attach_policy("p", "b", reserved={"gpu": 3})


def test_a_component_filter_must_name_a_component(svc: Service) -> None:
    """Not an empty list for a typo. A component is kept once known: detached from its last
    pool, it still lists its requests."""
    svc.create_pool("p", {"gpu": 8})
    svc.create_pool("q", {"gpu": 8})
    svc.attach_policy("p", "a")
    svc.attach_policy("q", "b", component_type="step_operator")
    held = svc.create_request("a", demand={"gpu": 1})
    svc.release_request(held.id)
    svc.detach_policy("p", "a")
    assert [r.id for r in svc.list_requests(component="a")] == [held.id]
    assert svc.list_requests(component="b") == [] and svc.list_policies(component="a") == []
    assert [v.pool for v in svc.list_policies(component="b")] == ["q"]
    for listing in (lambda: svc.list_requests(component="aa"),
                    lambda: svc.list_requests(status="released", component="aa", pool="p"),
                    lambda: svc.list_policies(component="aa"),
                    lambda: svc.list_policies("q", component="")):
        with pytest.raises(NotFound, match=r"^no component '(aa)?'$"):
            listing()
    with pytest.raises(InvalidInput, match=r"^component: must be a string \(got 5\)$"):
        svc.list_requests(component=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=r"^pool: must be a string \(got \['p'\]\)$"):
        svc.list_policies(["p"])  # type: ignore[arg-type]


def test_one_policy_per_component_and_pool(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 8})
    svc.attach_policy("p", "a")
    with pytest.raises(Conflict, match=r"already has a policy on resource pool `p`: change it "
                       r"in place \(update-policy\), or detach it first$"):
        svc.attach_policy("p", "a", priority=3)
    # The same name as a step operator is another component.
    svc.attach_policy("p", "a", component_type="step_operator")


def test_a_policy_in_use_is_changed_in_place_and_the_queue_follows_it(svc: Service) -> None:
    """A policy could only be detached and attached again, which is refused while it holds
    units: a team's priority or limit could not change without draining its work."""
    svc.create_pool("p", {"gpu": 4})
    svc.attach_policy("p", "a", priority=1, reserved={"gpu": 4})
    svc.attach_policy("p", "b", priority=5)
    held = svc.create_request("a", demand={"gpu": 4}, preemptible=False)
    assert held.status == "allocated"
    first = svc.create_request("b", demand={"gpu": 1})  # b outranks a: its waiter is first
    second = svc.create_request("a", demand={"gpu": 1})
    assert [r.queue[0].position for r in (first, second)] == [1, 2]

    # A limit lowered below what is held: nothing is taken back (a limit picks no victims).
    lowered = svc.update_policy("p", "a", priority=9, reserved={}, limit={"gpu": 2})
    assert (lowered.priority, lowered.limit, lowered.reserved) == (9, {"gpu": 2}, {"gpu": 0})
    assert svc.get_request(held.id).status == "allocated"
    waiting = svc.get_request(second.id)
    assert waiting.queue[0].reason == "policy a on p: gpu requested 1, in use 4 of limit 2"
    assert waiting.queue[0].position == 1  # a outranks b now
    svc.release_request(held.id)
    assert [svc.get_request(r).status for r in (first.id, second.id)] == ["allocated"] * 2

    # What is not given is kept; reserved and limit each replace their whole map.
    kept = svc.update_policy("p", "a", reserved={"gpu": 1})
    assert (kept.priority, kept.reserved, kept.limit) == (9, {"gpu": 1}, {"gpu": 2})
    assert svc.update_policy("p", "a", limit={}).effective_limit == {"gpu": 4}
    # The pass that follows decides by the new policy: a limit raised grants at once.
    svc.update_policy("p", "b", limit={"gpu": 1})
    capped = svc.create_request("b", demand={"gpu": 1})
    assert capped.status == "queued"
    svc.update_policy("p", "b", limit={"gpu": 2})
    assert svc.get_request(capped.id).status == "allocated"


def test_preemption_weighs_a_running_request_by_its_policys_priority_as_it_now_is(
    svc: Service,
) -> None:
    """Each allocation kept the priority of its grant: a policy raised to 9 let its own
    waiter preempt its running work (9 > 2), and one lowered to 1 kept its work safe."""
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "a", priority=2)
    svc.attach_policy("p", "b", priority=5)
    running = svc.create_request("a", demand={"gpu": 1})
    svc.create_request("a", demand={"gpu": 1})  # waits: a's own, as high as its work
    svc.update_policy("p", "a", priority=9)
    assert svc.get_request(running.id).status == "allocated"
    [active] = svc.get_pool("p").active_requests
    assert (active.id, svc.get_request(running.id).priority) == (running.id, 9)
    # Its reason and history tell the new priority (the reason kept the grant's 2).
    assert svc.get_request(running.id).status_reason == "allocated on pool p (policy priority 9), was 2"
    assert [(e.kind, e.message) for e in svc.request_events(running.id)][-1] == (
        "reprioritized", "allocated on pool p (policy priority 9), was 2")
    svc.update_policy("p", "a", priority=9)  # the same priority: no change to tell
    assert [e.kind for e in svc.request_events(running.id)].count("reprioritized") == 1
    # b (5) waits; lowering a to 1 preempts a's work at once, as attached at 1 it would be.
    waiter = svc.create_request("b", demand={"gpu": 1})
    assert waiter.status == "queued"
    svc.update_policy("p", "a", priority=1)
    assert svc.get_request(running.id).status == "preempted"
    assert svc.get_request(waiter.id).status == "allocated"


@pytest.mark.parametrize(("pool", "component", "changes", "error", "message"), [
    ("p", "a", {}, InvalidInput, "policy: nothing to update: give a priority, reserved or limit$"),
    ("p", "a", {"reserved": {"gpu": 3}}, InvalidInput, r"^reserved.gpu: must be <= limit 2 "),
    ("p", "a", {"limit": {"gpu": 1}}, InvalidInput, r"^reserved.gpu: must be <= limit 1 "),
    ("p", "a", {"reserved": {"gpu": 2, "tpu": 1}}, InvalidInput, r"^reserved.tpu: pool 'p' has "
     "no 'tpu'"),
    ("p", "b", {"reserved": {"gpu": 3}}, InvalidInput, "reserved totals on pool 'p' would "
     "exceed its capacity 4"),
    ("p", "a", {"priority": -1}, InvalidInput, r"^priority: "),
    ("p", "a", {"limit": {"gpu": "x"}}, InvalidInput, r"^limit.gpu: "),
    ("q", "a", {"priority": 1}, NotFound, "q"),
    ("p", "nobody", {"priority": 1}, NotFound, "No policy found for orchestrator `nobody` in "
     "resource pool `p`"),
])
def test_a_policy_update_refused_changes_nothing(
    svc: Service, pool: str, component: str, changes: dict[str, object],
    error: type[Exception], message: str,
) -> None:
    svc.create_pool("p", {"gpu": 4})
    svc.attach_policy("p", "a", priority=3, reserved={"gpu": 2}, limit={"gpu": 2})
    svc.attach_policy("p", "b", reserved={"gpu": 1})
    before = svc.list_policies("p")
    with pytest.raises(error, match=message):
        svc.update_policy(pool, component, **changes)  # type: ignore[arg-type]
    assert svc.list_policies("p") == before


def test_deleting_a_pool_or_detaching_a_policy_with_live_allocations_is_refused(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 8})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand=demand(gpu_count=1))
    with pytest.raises(Conflict, match=f"live allocation.*{held.id[:8]}.*release or cancel"):
        svc.delete_pool("p")
    with pytest.raises(Conflict, match="live allocation"):
        svc.detach_policy("p", "orch")
    svc.release_request(held.id)
    svc.detach_policy("p", "orch")
    svc.delete_pool("p")
    with pytest.raises(NotFound):
        svc.get_pool("p")


def test_queued_requests_left_without_a_pool_are_rejected(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    svc.attach_policy("p", "other")
    svc.create_request("other", demand=demand(gpu_count=1))
    waiting = svc.create_request("orch", demand=demand(gpu_count=1))
    assert waiting.status == "queued"
    svc.detach_policy("p", "orch")
    rejected = svc.get_request(waiting.id)
    assert rejected.status == "rejected"
    assert rejected.status_reason == "orchestrator `orch` has no policy on any pool"


def test_growing_a_pool_admits_and_shrinking_rejects_what_can_never_fit(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 2})
    svc.attach_policy("p", "orch")
    svc.attach_policy("p", "other")
    svc.create_request("other", demand=demand(gpu_count=2))
    small = svc.create_request("orch", demand=demand(gpu_count=1))
    big = svc.create_request("orch", demand=demand(gpu_count=2))
    svc.update_pool("p", capacity={"gpu": 3})
    assert svc.get_request(small.id).status == "allocated"
    assert svc.get_request(big.id).status == "queued"
    svc.update_pool("p", capacity={"gpu": 1})
    gone = svc.get_request(big.id)
    assert gone.status == "rejected"
    assert gone.status_reason == "pool p: gpu requested 2 > capacity 1"


def test_capacity_update_zero_removes_a_key(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 2, "tpu": 4})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand={"gpu": 2})
    updated = svc.update_pool("p", capacity={"tpu": 0})
    assert updated.capacity == {"gpu": 2}
    # The pool as describe shows it (its policies and requests were left out, shown empty).
    assert updated == svc.get_pool("p")
    assert [r.id for r in updated.active_requests] == [held.id]


def test_a_key_removed_while_held_still_shows_its_held_units(svc: Service) -> None:
    """Its units stay held until released (nothing is preempted for a shrink), and are shown
    against a total of 0: they showed nowhere, in the pool's view or its metrics (helper-77)."""
    svc.create_pool("p", {"gpu": 2, "tpu": 4})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand={"tpu": 3})
    svc.update_pool("p", capacity={"tpu": 0})
    assert svc.get_pool("p").occupied == {"gpu": 0, "tpu": 3}  # step_run: not counted here
    assert occupied_cell(svc.get_pool("p").as_dict()) == "gpu 0/2, tpu 3/0"
    svc.release_request(held.id)
    assert occupied_cell(svc.get_pool("p").as_dict()) == "gpu 0/2"


def test_a_removed_key_leaves_the_pools_policies_unless_one_reserves_it(svc: Service) -> None:
    """Policy keys must be pool keys, on every pool update: a limit on a removed key was
    kept, and came back into force when the key was added again."""
    svc.create_pool("p", {"gpu": 2, "tpu": 4})
    svc.attach_policy("p", "orch", reserved={"gpu": 1}, limit={"gpu": 2, "tpu": 1})
    svc.attach_policy("p", "other", reserved={"tpu": 2})
    with pytest.raises(InvalidInput, match=r"^capacity.tpu: policy other on pool 'p' reserves 2 "
                       r"tpu: take it out of the policy's reserved first \(resource-pool "
                       r"update-policy\), or detach the policy \(got 0\)$"):
        svc.update_pool("p", capacity={"tpu": 0})
    assert {(v.component, v.limit.get("tpu")) for v in svc.list_policies("p")} == {
        ("orch", 1), ("other", None)}
    svc.update_policy("p", "other", reserved={})
    svc.update_pool("p", capacity={"tpu": 0})
    assert {v.component: (v.reserved, v.limit) for v in svc.list_policies("p")} == {
        "orch": ({"gpu": 1}, {"gpu": 2}), "other": ({}, {})}
    svc.update_pool("p", capacity={"tpu": 4})
    request = svc.create_request("orch", demand=demand(gpu_count=1, resources={"tpu": 3}))
    assert request.status == "allocated"


def test_every_request_is_one_step_run_however_its_map_is_given(svc: Service) -> None:
    """A pool's step_run caps concurrent steps; a plain map (SDK, API) was not counted."""
    svc.create_pool("p", {"gpu": 8, "step_run": 1})
    svc.attach_policy("p", "orch")
    first = svc.create_request("orch", demand={"gpu": 1})
    assert (first.status, first.resources) == ("allocated", {"gpu": 1, "step_run": 1})
    assert svc.create_request("orch", demand={"gpu": 1}).status == "queued"
    with pytest.raises(InvalidInput, match="resources.step_run: must be 1: a request is one "
                                           r"step run \(got 5\)"):
        svc.create_request("orch", demand={"gpu": 1, "step_run": 5})


def test_a_waiting_reason_names_its_pools_in_one_order_whatever_the_pass_did(
    svc: Service,
) -> None:
    """Its pools in placement order: a preemption earlier in a pass turned them around
    until the next pass (embedded and served differed a while)."""
    for pool in ("eu-west", "eu-north"):
        svc.create_pool(pool, {"gpu": 4})
        svc.attach_policy(pool, "low", priority=1)
    svc.attach_policy("eu-west", "orch", priority=100)
    svc.attach_policy("eu-north", "orch", priority=50)
    for component in ("orch", "low", "low", "orch"):
        svc.create_request(component, demand={"gpu": 2})
    waiting = svc.create_request("low", demand={"gpu": 2})
    assert waiting.status == "queued"
    svc.create_request("orch", demand={"gpu": 2})  # preempts on eu-north
    reason = svc.get_request(waiting.id).status_reason or ""
    assert reason.index("pool eu-north") < reason.index("pool eu-west"), reason
    svc.reconcile()
    assert svc.get_request(waiting.id).status_reason == reason


def test_references_by_name_prefix_and_id(svc: Service) -> None:
    pool = svc.create_pool("p", {"gpu": 2})
    assert svc.get_pool(pool.id).name == "p"
    assert svc.get_pool(pool.id[:6]).name == "p"
    svc.attach_policy("p", "orch")
    request = svc.create_request("orch", demand=demand(gpu_count=1))
    assert svc.get_request(request.id[:8]).id == request.id
    with pytest.raises(NotFound):
        svc.get_request("zzzz")


def test_unknown_component_is_a_clear_error(svc: Service) -> None:
    with pytest.raises(NotFound, match="no orchestrator named `ghost`: attach a policy first"):
        svc.create_request("ghost", demand=demand(gpu_count=1))


def test_release_and_cancel_guard_their_states(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    svc.create_request("orch", demand=demand(gpu_count=1))
    queued = svc.create_request("orch", demand=demand(gpu_count=1))
    with pytest.raises(Conflict, match="is queued, not allocated: use cancel"):
        svc.release_request(queued.id)
    svc.cancel_request(queued.id)
    with pytest.raises(Conflict, match="already cancelled"):
        svc.cancel_request(queued.id)


def test_a_decided_request_reads_as_a_long_poll_sees_it(svc: Service) -> None:
    """``decided_request``: the id, and no view while the request waits; once it no longer
    waits, the view ``get_request`` gives, its own component's among several."""
    svc.create_pool("p", {"gpu": 1})
    for component in ("a", "orch", "z"):
        svc.attach_policy("p", component)
    held = svc.create_request("orch", demand=demand(gpu_count=1))
    waiting = svc.create_request("z", demand=demand(gpu_count=1))
    for ref in (waiting.id[:8], waiting.id):
        assert svc.decided_request(ref) == (waiting.id, None)
        if svc.db.embedded:  # as a server's event loop reads it, without waiting
            assert svc.decided_request(ref, wait=False) == (waiting.id, None)
    with pytest.raises(NotFound):
        svc.decided_request(str(uuid.uuid4()))
    svc.release_request(held.id)
    for request in (held, waiting):
        request_id, view = svc.decided_request(request.id)
        assert request_id == request.id and view == svc.get_request(request.id)
        if svc.db.embedded:
            assert svc.decided_request(request.id, wait=False) == (request_id, view)
        else:  # every PostgreSQL read waits for the network
            with pytest.raises(WouldWait):
                svc.decided_request(request.id, wait=False)
    assert view is not None and (view.component, view.status) == ("z", "allocated")


def test_deleting_an_allocated_request_returns_its_units(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand=demand(gpu_count=1))
    waiting = svc.create_request("orch", demand=demand(gpu_count=1))
    svc.delete_request(held.id)
    assert svc.get_request(waiting.id).status == "allocated"
    with pytest.raises(NotFound):
        svc.get_request(held.id)


def test_pool_view_counts_occupied_and_queue(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 4, "step_run": 3})
    svc.attach_policy("p", "orch")
    for _ in range(4):
        svc.create_request("orch", demand=demand(gpu_count=1, cpu_count=1))
    (pool,) = svc.list_pools()
    assert pool.occupied == {"gpu": 3, "step_run": 3}
    assert pool.queue_length == 1
    detail = svc.get_pool("p")
    assert [r.state for r in detail.active_requests] == ["active"] * 3
    assert [r.queue[0].position for r in detail.queued_requests] == [1]
    assert [r.state for r in svc.pool_requests("p", "queued")] == ["queued"]


def test_an_expired_lease_returns_the_units_with_an_event(svc: Service, clock: Clock) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand=demand(gpu_count=1), lease_ttl=60)
    assert held.lease_expires_at is not None
    waiting = svc.create_request("orch", demand=demand(gpu_count=1))
    clock.now += timedelta(seconds=50)
    assert svc.heartbeat(held.id).status == "allocated"  # renewed: 60 s from now
    clock.now += timedelta(seconds=50)
    svc.reconcile()
    assert svc.get_request(held.id).status == "allocated"
    clock.now += timedelta(seconds=11)
    summary = svc.reconcile()
    assert summary.expired == [held.id]
    gone = svc.get_request(held.id)
    assert gone.status == "released"
    assert gone.status_reason == "lease expired: no heartbeat for 60 s; units returned"
    granted = svc.get_request(waiting.id)
    assert granted.status == "allocated"
    # Not stamped allocated before the units it got were released (helper-92).
    assert gone.released_at is not None and granted.allocated_at is not None
    assert granted.allocated_at >= gone.released_at
    with svc.db.read() as conn:
        assert [e.kind for e in repo.list_events(conn, request_id=held.id)][-1] == "lease_expired"


def two_holders_and_a_waiter(svc: Service) -> tuple[RequestView, RequestView, RequestView]:
    """Of 2 GPUs, one held on a 60 s lease, one on a 120 s lease; a third request waits."""
    svc.create_pool("p", {"gpu": 2})
    svc.attach_policy("p", "orch")
    return (svc.create_request("orch", demand=demand(gpu_count=1), lease_ttl=60),
            svc.create_request("orch", demand=demand(gpu_count=1), lease_ttl=120),
            svc.create_request("orch", demand=demand(gpu_count=1)))


def test_embedded_reads_and_heartbeats_catch_up_with_expired_leases(
    svc: Service, clock: Clock
) -> None:
    """Embedded (``catch_up``) nobody runs passes between commands. A read found the lease
    run out and showed it allocated until the next write; a heartbeat that expired another
    holder's lease freed its units but granted them to nobody (and then no read was due); a
    request's history left the expiry out until another read (found by helper-66)."""
    svc.catch_up = True
    first, second, waiting = two_holders_and_a_waiter(svc)
    clock.now += timedelta(seconds=61)
    assert svc.heartbeat(second.id).status == "allocated"  # it expires the first's lease
    assert svc.get_request(first.id).status == "released"
    assert svc.get_request(waiting.id).status == "allocated"  # granted then, not later
    clock.now += timedelta(seconds=121)
    # Its history, read first, says so too (it listed no expiry until another read).
    assert svc.request_events(second.id)[-1].kind == "lease_expired"
    assert svc.get_pool("p").occupied == {"gpu": 1}
    assert svc.get_request(second.id).status == "released"


def test_leases_a_heartbeat_expires_on_a_server_are_granted_and_counted_at_once(
    svc: Service, clock: Clock
) -> None:
    """A server's heartbeat runs no pass, so one that expired another holder's lease left its
    units to the next tick, and the pass summaries (the metrics') never counted the
    expiry."""
    passes: list[PassSummary] = []
    svc.on_pass = lambda summary, _: passes.append(summary)
    first, second, waiting = two_holders_and_a_waiter(svc)
    clock.now += timedelta(seconds=30)
    passes.clear()
    assert svc.heartbeat(second.id).status == "allocated"
    assert passes == []  # nothing expired: no pass
    clock.now += timedelta(seconds=31)
    assert svc.heartbeat(second.id).status == "allocated"  # it expires the first's lease
    assert [(p.expired, p.granted) for p in passes] == [([first.id], [waiting.id])]
    assert svc.get_request(waiting.id).status == "allocated"


def test_a_tick_passes_only_when_a_pass_could_change_anything(
    svc: Service, clock: Clock
) -> None:
    """Every tick of every server wrote, idle ones too: three idle replicas moved the store's
    generation 15 times in 5 s, so none could reuse its kept state."""

    def generation_after_tick() -> tuple[PassSummary | None, int]:
        ticked = svc.tick()
        with svc.db.read() as conn:
            return ticked, read_generation(conn)

    first, _, waiting = two_holders_and_a_waiter(svc)
    ticked, before = generation_after_tick()
    assert ticked is not None and ticked.granted == []  # one waits: its decision may change
    svc.cancel_request(waiting.id)
    ticked, idle = generation_after_tick()
    assert ticked is None and generation_after_tick() == (None, idle)  # nothing written
    clock.now += timedelta(seconds=61)  # the first's lease runs out
    ticked, _ = generation_after_tick()
    assert ticked is not None and ticked.expired == [first.id]
    assert svc.get_request(first.id).status == "released"
    assert generation_after_tick()[0] is None
    assert before < idle


def test_without_a_lease_an_allocation_is_held_until_released(svc: Service, clock: Clock) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    held = svc.create_request("orch", demand=demand(gpu_count=1))
    clock.now += timedelta(days=30)
    svc.reconcile()
    assert svc.get_request(held.id).status == "allocated"


def test_heartbeat_tells_the_holder_it_was_preempted(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "low", priority=1)
    svc.attach_policy("p", "high", priority=2)
    held = svc.create_request("low", demand=demand(gpu_count=1), lease_ttl=30)
    svc.create_request("high", demand=demand(gpu_count=1))
    assert svc.heartbeat(held.id).status == "preempted"


def test_a_requests_history_tells_each_change_with_its_reason(
    svc: Service, clock: Clock
) -> None:
    """``request_events``: what ``describe`` shows only the end of (docs/semantics.md: every
    transition is an event with a reason). Once a pool is deleted its events name none."""
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "low", priority=1)
    svc.attach_policy("p", "high", priority=2)
    held = svc.create_request("low", demand={"gpu": 1}, max_retries=1, lease_ttl=30)
    winner = svc.create_request("high", demand={"gpu": 1})
    retry = svc.get_request(held.id).retried_as_id
    assert retry is not None
    svc.release_request(winner.id)
    clock.now += timedelta(seconds=31)
    svc.reconcile()
    history = [(e.kind, e.pool, e.message, e.data) for e in svc.request_events(held.id[:6])]
    assert history == [
        ("created", None, "request created", {}),
        ("allocated", "p", "allocated on pool p (policy priority 1)", {}),
        ("preempted", "p", f"preempted by request {winner.id} on pool p (priority 2 > 1)",
         {"rule": "priority", "by": winner.id}),
    ]
    assert [(e.kind, e.message) for e in svc.request_events(retry)] == [
        ("retried", "attempt 2 of 2 after preemption"),
        ("allocated", "allocated on pool p (policy priority 1)"),
        ("lease_expired", "lease expired: no heartbeat for 30 s; units returned"),
    ]
    assert [e.at for e in svc.request_events(retry)] == sorted(
        e.at for e in svc.request_events(retry))
    svc.delete_request(held.id)
    svc.delete_request(retry)
    svc.delete_pool("p")
    assert [(e.kind, e.pool) for e in svc.request_events(held.id.upper())][-2:] == [
        ("preempted", None), ("deleted", None)]
    with pytest.raises(NotFound):
        svc.request_events(held.id[:6])  # a deleted request is found by its whole id only


@pytest.mark.parametrize("call", [
    lambda svc: svc.create_pool("a/b", {"gpu": 1}),
    lambda svc: svc.attach_policy("p", "team/a"),
    lambda svc: svc.create_request("team/a", demand={"gpu": 1}),
    lambda svc: svc.create_token("submitter", ["team/a"]),
], ids=["pool", "policy's component", "request's component", "token's component"])
def test_names_the_api_addresses_in_its_paths_refuse_a_slash(
    svc: Service, call: Callable[[Service], object]
) -> None:
    svc.create_pool("p", {"gpu": 1})
    with pytest.raises(InvalidInput, match='must not contain "/": the API addresses it in URL paths'):
        call(svc)
    assert [p.name for p in svc.list_pools()] == ["p"] and svc.list_policies() == []


def test_a_new_pool_or_component_is_not_named_dot_or_dot_dot(svc: Service) -> None:
    """A URL drops such a segment: ``fetch(".../pools/../requests")`` read the request list
    (helper-96). One stored before is still used (made here as an older version would)."""
    svc.create_pool("p", {"gpu": 1})
    for name in (".", ".."):
        with pytest.raises(InvalidInput, match=re.escape('must not be "." or "..": URLs drop such a')):
            svc.create_pool(name, {"gpu": 1})
        with pytest.raises(InvalidInput, match=r"^component: must not be"):
            svc.attach_policy("p", name)
    assert [p.name for p in svc.list_pools()] == ["p"] and svc.list_policies() == []
    with svc.db.write() as connection:
        repo.insert_pool(connection, "..", None, {"gpu": 1}, datetime.now(UTC))
    svc.attach_policy("..", "c")
    assert svc.create_request("c", demand={"gpu": 1}).pool == ".."


def test_a_create_repeated_with_its_idempotency_key_makes_one_request(svc: Service) -> None:
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    first = svc.create_request("orch", demand=demand(gpu_count=1), idempotency_key="k-1")
    again = svc.create_request("orch", demand=demand(gpu_count=1), idempotency_key="k-1")
    assert again.id == first.id
    other = svc.create_request("orch", demand=demand(gpu_count=1), idempotency_key="k-2")
    assert other.id != first.id
    # The same key for another ask: the client's mistake, refused, nothing made.
    with pytest.raises(Conflict, match=rf"idempotency_key 'k-1' already made request "
                       rf"`{first.id}`, which asked otherwise \(resources, lease_ttl\)"):
        svc.create_request("orch", demand=demand(gpu_count=2), idempotency_key="k-1",
                           lease_ttl=30)
    # Another token's key: its request is not named, nor what differs (with auth on, a
    # submitter learns nothing of others' requests).
    token, _ = svc.create_token("submitter", ["orch"])
    with pytest.raises(Conflict) as taken:
        svc.create_request("orch", demand=demand(gpu_count=1), idempotency_key="k-1",
                           created_by=token.id)
    assert str(taken.value) == ("idempotency_key 'k-1' is taken by a request another token "
                                "made; use a key of your own")
    assert len(svc.list_requests()) == 2


def test_a_key_of_a_request_made_before_every_request_got_its_step_run_is_answered(
    svc: Service,
) -> None:
    """A request made through the API before 2026-11-29 holds no step_run; the same ask,
    resent across the upgrade, now gets step_run 1 and was refused as another (helper-92)."""
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "orch")
    first = svc.create_request("orch", demand={"gpu": 1}, idempotency_key="old-key")
    table = schema.request_resource
    with svc.db.write() as conn:  # as it was stored then
        conn.execute(table.delete().where(table.c.request_id == first.id,
                                          table.c.key == "step_run"))
    assert svc.create_request("orch", demand={"gpu": 1}, idempotency_key="old-key").id == first.id
    with pytest.raises(Conflict, match=r"asked otherwise \(resources\)"):
        svc.create_request("orch", demand={"gpu": 2}, idempotency_key="old-key")


@pytest.mark.parametrize(("ref", "refused"), [
    ("a\x00b", r"^ref: must not contain NUL characters \(got 'a\\x00b'\)$"),
    ("a\udcffb", r"^ref: must be valid Unicode text \(got 'a\\udcffb'\)$"),
    (["p"], r"^ref: must be a name or id \(a string\) \(got \['p'\]\)$"),
    ({"a": 1}, r"^ref: must be a name or id \(a string\) \(got \{'a': 1\}\)$"),
], ids=["NUL", "lone surrogate", "a list", "a mapping"])
def test_a_ref_no_name_or_id_can_be_is_refused_in_the_servers_words(
    database_url: str, ref: Any, refused: str
) -> None:
    """The embedded SDK, as a server refuses a path's ref (tests/test_remote.py compares
    the two): not the driver's error (PostgreSQL refuses NUL in text), an encoding error or
    a TypeError."""
    from tests.test_remote import ref_calls, with_seg_and_t

    with Client(database_url=database_url) as client:
        for lookup in ref_calls(with_seg_and_t(client)):
            with pytest.raises(InvalidInput, match=refused):
                lookup(ref)
        assert [p.name for p in client.list_pools()] == ["seg"]
    with Client(database_url=database_url) as client, pytest.raises(
        InvalidInput, match=r"^pool: must be a string \(got \['p'\]\)$"
    ):
        client.trees.start_operation(user="u", job_resources={"cpu": 1}, job_count=1,
                                     trees=["t"], pool=["p"])  # type: ignore[arg-type]


@pytest.mark.parametrize("step", [timedelta(0), timedelta(milliseconds=1)],
                         ids=["made-at-one-time", "made-in-turn"])
def test_a_page_after_a_cursor_goes_on_where_the_last_ended_whatever_was_deleted(
    database_url: str, step: timedelta,
) -> None:
    """A list read a page at a time while what was read is deleted (a prune, a delete):
    after the last page's cursor nothing is skipped, where an offset skips as many as were
    deleted. Made at one time, requests are in the order of their ids."""
    svc = Service(Database.open(database_url), Clock(step=step))
    svc.create_pool("p", {"gpu": 1})
    svc.attach_policy("p", "a")
    for _ in range(6):
        svc.create_request("a", "orchestrator", {"gpu": 1})  # one allocated, five queued
    every = [view.id for view in svc.list_requests()]
    first = svc.request_page(limit=2)
    assert [view.id for view in first.items] == every[:2] and first.next is not None
    for view in first.items:
        svc.delete_request(view.id)
    assert [view.id for view in svc.request_page(limit=2, offset=2).items] == every[4:]
    after = svc.request_page(limit=2, after=first.next)
    assert [view.id for view in after.items] == every[2:4]
    assert (after.total, after.offset) == (4, 0)
    assert [view.id for view in svc.request_page(after=after.next).items] == every[4:]
    assert [view.id for view in svc.request_page(limit=1, offset=1, after=after.next).items] == [
        every[5]]
    for bad in ("", "x", str(first.next)[:20], every[0]):
        with pytest.raises(InvalidInput, match=r"^after: not the cursor of a page "):
            svc.request_page(after=bad)
    with pytest.raises(InvalidInput, match=r"^after: must be a string \(got 5\)$"):
        svc.request_page(after=5)  # type: ignore[arg-type]
    svc.db.close()


def test_a_page_of_requests_is_its_slice_of_every_request_the_filters_match(
    svc: Service,
) -> None:
    """``request_page`` filters, counts and pages in the database. Here against each
    request's own view, filtered as its reader would: a status, a component's name (of any
    type), a pool where it is or was allocated or where it waits now, a token's own."""
    svc.create_pool("p", {"gpu": 2})
    svc.create_pool("q", {"gpu": 2})
    svc.create_pool("gone", {"gpu": 1})
    svc.create_pool("cpus", {"cpu": 1})  # a's GPU requests wait there too, never eligible
    for pool in ("p", "q", "cpus"):
        svc.attach_policy(pool, "a", priority=1)
    svc.attach_policy("p", "b", priority=5)
    svc.attach_policy("q", "a", component_type="step_operator")  # the name again, another type
    svc.attach_policy("gone", "c")
    token, _ = svc.create_token("submitter", ["a"])

    def make(component: str, gpu: int, kind: str = "orchestrator", **options: Any) -> str:
        return svc.create_request(component, kind, {"gpu": gpu}, **options).id

    made = [make("a", 1, created_by=token.id), make("a", 2), make("b", 1)]  # p, q, p: full
    made.append(make("a", 2, created_by=token.id))  # waits on p and q
    made.append(make("a", 1, "step_operator"))  # waits on q
    made.append(make("b", 1))  # preempts the first (priority 5 over 1) on p
    made.append(make("a", 9))  # rejected: no pool holds 9
    made.append(make("c", 1))
    svc.release_request(made[-1])
    svc.delete_pool("gone")
    made.append(make("b", 2))  # waits on p
    svc.cancel_request(made[-1])
    every = sorted(
        (svc.get_request(view.id) for view in svc.list_requests()), key=lambda v: (v.created, v.id)
    )
    assert {v.id for v in every} >= set(made)
    assert {v.status for v in every} == {
        "queued", "allocated", "released", "rejected", "preempted", "cancelled"}
    assert any(len([p for p in v.queue if p.position]) > 1 for v in every)  # on two pools
    assert any(p.pool == "cpus" and not p.position for v in every for p in v.queue)
    own = {made[0], made[3]}

    def wanted(view: RequestView, status: str | None, component: str | None,
               pool: str | None, created_by: str | None) -> bool:
        return (
            status in (None, view.status)
            and component in (None, view.component)
            and (pool is None or view.pool == pool
                 or any(p.pool == pool and p.position for p in view.queue))
            and (created_by is None or view.id in own)
        )

    for status, component, pool, created_by in itertools.product(
        (None, *REQUEST_STATUSES), (None, "a", "b", "c"), (None, "p", "q", "cpus", "gone"),
        (None, token.id),
    ):
        if pool == "gone":  # its name outlives it: a listing names it, a filter cannot
            assert [v.pool for v in every].count("gone") == 1
            continue
        expected = [v for v in every if wanted(v, status, component, pool, created_by)]
        for limit, offset in ((None, 0), (2, 1), (None, 3), (5, 20)):
            page = svc.request_page(status, component, pool, limit=limit, offset=offset,
                                    created_by=created_by)
            end = None if limit is None else offset + limit
            assert (list(page.items), page.total) == (expected[offset:end], len(expected)), (
                status, component, pool, created_by, limit, offset)
        assert walked_pages(partial(
            svc.request_page, status, component, pool, limit=2, created_by=created_by
        ), len(expected)) == expected
