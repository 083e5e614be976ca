"""Engine invariants under random pools, policies and request streams (hypothesis).

A small simulator applies each plan to the world and checks, after every pass: capacity and
limits never exceeded, non-preemptible usage within reserved, one allocation per request,
non-preemptible work never preempted, and the plan is a pure function of the snapshot.
Requests come one per pass, or in bursts ("burst": submitted with the next operation).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.engine.explain import queue_entries
from fairpool.engine.model import Plan, Snapshot
from fairpool.engine.reconcile import reconcile
from tests.worlds import World

KEYS = ("gpu", "step_run", "mcpu", "tpu")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, list[tuple[str, object]]]:
    world = World()
    pool_names = [f"pool{i}" for i in range(draw(st.integers(1, 3)))]
    for name in pool_names:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
        world.pool(name, {k: draw(st.integers(1, 8)) for k in keys})
    components = [f"c{i}" for i in range(draw(st.integers(1, 4)))]
    for component in components:
        for pool in draw(st.lists(st.sampled_from(pool_names), max_size=2, unique=True)):
            capacity = world.pools[pool].capacity
            free = {k: v - sum(p.reserved.get(k, 0) for (_, q), p in world.policies.items()
                               if q == pool) for k, v in capacity.items()}
            reserved = {k: draw(st.integers(0, free[k])) for k in capacity if draw(st.booleans())}
            limit = {k: draw(st.integers(reserved.get(k, 0), capacity[k]))
                     for k in capacity if draw(st.booleans())}
            world.policy(component, pool, draw(st.integers(0, 3)), reserved, limit)
    ops: list[tuple[str, object]] = []
    for i in range(draw(st.integers(1, 25))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(("release", draw(st.integers(0, 1000))))
            continue
        amounts = {k: draw(st.integers(1, 5))
                   for k in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))}
        ops.append((draw(st.sampled_from(["submit", "burst"])),
                    (f"r{i:02d}", draw(st.sampled_from(components)), amounts,
                     draw(st.booleans()), draw(st.integers(0, 2)))))
    return world, ops


@st.composite
def contended(
    draw: st.DrawFn, step_slots: bool = False
) -> tuple[World, list[tuple[str, object]]]:
    """One GPU pool, fully reserved between a few teams: preemption and reserved checks bite.
    ``step_slots``: ZenML's usual pool, where each request takes a step slot too (``step_run``)
    that no team reserves, so that every request borrows one."""
    capacity = draw(st.integers(2, 8))
    slots = {"step_run": draw(st.integers(2, 12))} if step_slots else {}
    world = World().pool("p", {"gpu": capacity, **slots})
    components = [f"c{i}" for i in range(draw(st.integers(2, 3)))]
    left = capacity
    for component in components:
        reserved = draw(st.integers(0, left))
        left -= reserved
        world.policy(component, "p", draw(st.integers(0, 2)), {"gpu": reserved},
                     {"gpu": draw(st.integers(max(reserved, 1), capacity))})
    ops: list[tuple[str, object]] = []
    for i in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 4)) == 0:
            ops.append(("release", draw(st.integers(0, 1000))))
        else:
            ops.append((draw(st.sampled_from(["submit", "burst"])),
                        (f"r{i:02d}", draw(st.sampled_from(components)),
                         {"gpu": draw(st.integers(1, 3)), **dict.fromkeys(slots, 1)},
                         draw(st.booleans()), 0)))
    return world, ops


def check_invariants(world: World, snapshot: Snapshot, plan: Plan) -> None:
    usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    np_usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: set[str] = set()
    for allocation in world.running:
        assert allocation.request_id not in seen, "two allocations for one request"
        seen.add(allocation.request_id)
        (charge,) = allocation.placement.charges
        for key, amount in charge.amounts.items():
            usage[allocation.placement.queue][key] += amount
            usage[charge.leaf][key] += amount
            if not allocation.preemptible:
                np_usage[charge.leaf][key] += amount
    for node in snapshot.nodes.values():
        for key, used in usage[node.id].items():
            cap = node.cap(key)
            assert cap is None or used <= cap, (node.name, key, used, cap)
            limit = node.limit.get(key)
            assert limit is None or used <= limit, (node.name, key, used, limit)
        for key, used in np_usage[node.id].items():
            bounded = any(n.cap(key) is not None or key in n.limit
                          for n in (node, snapshot.nodes[node.parent or node.id]))
            if bounded:
                assert used <= node.guarantee.get(key, 0), (node.name, key, used)
    granted = [g.request_id for g in plan.grants]
    assert len(granted) == len(set(granted))
    preemptible = {a.request_id: a.preemptible for a in snapshot.allocations}
    for preemption in plan.preemptions:
        assert preemptible[preemption.victim_id], "a non-preemptible allocation was preempted"
        assert preemption.preemptor_id in granted, "preempted for a request not granted"


def passes(
    world: World, ops: list[tuple[str, object]], step: float
) -> Iterator[tuple[Snapshot, Plan]]:
    """Each op (a release, a submit) ``step`` seconds after the last, then a pass: its
    snapshot and plan, for the caller to apply. A burst's pass is the next operation's."""
    for number, (op, arg) in enumerate(ops, 1):
        world.now += step
        if op == "release":
            if world.running:
                world.running.pop(int(arg) % len(world.running))  # type: ignore[call-overload]
        else:
            request_id, component, amounts, preemptible, _ = arg  # type: ignore[misc]
            world.wait(request_id, component, amounts, at=world.now, preemptible=preemptible)
            if op == "burst" and number < len(ops):
                continue
        snapshot = world.snapshot()
        yield snapshot, reconcile(snapshot)


@settings(max_examples=150, deadline=None)
@given(st.one_of(worlds(), contended(), contended(step_slots=True)))
def test_invariants_hold_after_every_pass(case: tuple[World, list[tuple[str, object]]]) -> None:
    world, ops = case
    for snapshot, plan in passes(world, ops, 10.0):
        assert reconcile(snapshot) == plan, "same snapshot, different plan"
        world.apply(snapshot, plan)
        check_invariants(world, snapshot, plan)


# The same examples every run: with bursts, about one in 10,000 random worlds finds the known
# exception docs/semantics.md states (a request granted earlier in the pass, exposed by a
# later grant, is a victim only in the next pass).
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(worlds(), contended(), contended(step_slots=True)))
def test_a_pass_is_a_fixed_point_a_second_one_changes_nothing(
    case: tuple[World, list[tuple[str, object]]],
) -> None:
    """Units a preemption freed are not left for the next pass: a pass at the same moment
    over what one left grants and preempts nothing, and explains every waiter the same."""
    world, ops = case
    # 100 s apart: past the default backfill_after now and then, so holders too.
    for snapshot, plan in passes(world, ops, 100.0):
        world.apply(snapshot, plan)
        again = reconcile(world.snapshot())
        assert (again.grants, again.preemptions) == ((), ())
        assert queue_entries(again) == queue_entries(plan)


@settings(max_examples=100, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_input_order(
    case: tuple[World, list[tuple[str, object]]], rng: random.Random
) -> None:
    world, ops = case
    for op, arg in ops:
        if op != "release":
            request_id, component, amounts, preemptible, _ = arg  # type: ignore[misc]
            world.wait(request_id, component, amounts, at=float(len(world.queue) % 3),
                       preemptible=preemptible)
    snapshot = world.snapshot()
    plan = reconcile(snapshot)
    queue = list(snapshot.queue)
    rng.shuffle(queue)
    shuffled = reconcile(replace(snapshot, queue=tuple(queue)))
    assert set(plan.grants) == set(shuffled.grants)
    assert set(plan.rejections) == set(shuffled.rejections)
    assert queue_entries(plan) == queue_entries(shuffled)


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_rejected_requests_could_not_fit_an_empty_system(
    case: tuple[World, list[tuple[str, object]]],
) -> None:
    world, ops = case
    for op, arg in ops:
        if op != "release":
            request_id, component, amounts, preemptible, _ = arg  # type: ignore[misc]
            world.wait(request_id, component, amounts, preemptible=preemptible)
    snapshot = world.snapshot()
    for rejection in reconcile(snapshot).rejections:
        request = next(r for r in snapshot.queue if r.id == rejection.request_id)
        alone = reconcile(replace(snapshot, allocations=(), queue=(request,)))
        assert alone.grants == ()


@settings(max_examples=200, deadline=None)
@given(st.one_of(worlds(), contended(), contended(step_slots=True)),
       st.randoms(use_true_random=False))
def test_amounts_of_an_unmetered_key_change_no_decision(
    case: tuple[World, list[tuple[str, object]]], rng: random.Random
) -> None:
    """Requests are grouped on their metered keys only (``_shape``): a ``memory_mb`` of its
    own given to some waiters (a key no pool here declares: unbounded), after every pass the
    plan decides the same for each, and explains it alike. (A grant's memory made its leaf
    "borrow" and unparked waiters, which then preempted in the same pass: helper-82.)"""
    world, ops = case
    for snapshot, plan in passes(world, ops, step=1.0):
        assert all(n.cap("memory_mb") is None for n in snapshot.nodes.values())
        queue = tuple(
            r if rng.random() < 0.5 else replace(r, placements=tuple(
                replace(p, charges=tuple(
                    replace(c, amounts={**c.amounts, "memory_mb": rng.randint(1, 10**6)})
                    for c in p.charges))
                for p in r.placements))
            for r in snapshot.queue
        )
        apart = reconcile(replace(snapshot, queue=queue))
        assert (plan.grants, plan.rejections, plan.preemptions) == (
            apart.grants, apart.rejections, apart.preemptions)
        assert queue_entries(plan) == queue_entries(apart)
        world.apply(snapshot, plan)
