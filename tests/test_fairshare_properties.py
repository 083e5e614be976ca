"""Invariants of the fair-share update over random pool trees (hypothesis).

Each property was checked to fail against a planted bug (see ``docs/trees.md``).
"""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.engine.fairshare import (
    ROOT,
    ElementShares,
    FairShareResult,
    IntegralGuarantees,
    IntegralGuaranteeType,
    IntegralState,
    OperationSnapshot,
    PoolSnapshot,
    SchedulingMode,
    TreeSnapshot,
    children_of,
    compute_fair_share,
)

RESOURCES = ("cpu", "memory", "gpu")


@st.composite
def snapshots(draw: st.DrawFn) -> TreeSnapshot:
    """Up to 6 pools (FIFO pools are leaves), guarantees that fit their parent's on cpu, random
    limits and weights, up to 8 operations with random job vectors, running and pending jobs,
    and sometimes a heavy competitor."""
    totals = {r: draw(st.integers(1, 64)) for r in RESOURCES}
    pools: list[PoolSnapshot] = []
    spare: dict[str | None, int] = {None: totals["cpu"]}
    for index in range(draw(st.integers(0, 6))):
        parents = [None, *(p.name for p in pools if p.mode is SchedulingMode.FAIR_SHARE)]
        parent = draw(st.sampled_from(parents))
        guarantee = draw(st.integers(0, spare[parent]))
        spare[parent] -= guarantee
        name = f"p{index}"
        spare[name] = guarantee
        limits = draw(st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 64), max_size=2))
        pools.append(
            PoolSnapshot(
                name,
                parent,
                mode=draw(st.sampled_from(SchedulingMode)),
                weight=draw(st.none() | st.integers(1, 5).map(F)),
                strong_guarantee_resources={"cpu": guarantee} if guarantee else {},
                resource_limits=limits,
            )
        )
    holders = [ROOT, *(p.name for p in pools)]
    operations = []
    for index in range(draw(st.integers(0, 8))):
        holder = draw(st.sampled_from(holders))
        if holder == ROOT:
            continue
        job = draw(st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 16), min_size=1))
        operations.append(
            OperationSnapshot(
                f"o{index}",
                holder,
                job,
                running_job_count=draw(st.integers(0, 3)),
                pending_job_count=draw(st.integers(0, 6)),
                # Few distinct weights and start times, so FIFO ties happen.
                weight=F(draw(st.integers(1, 2))),
                start_time=float(draw(st.integers(0, 1))),
            )
        )
    if draw(st.booleans()):
        # A heavy competitor without guarantees, so that guarantees actually matter.
        pools.append(PoolSnapshot("hog", weight=F(5)))
        hog_job = {r: 2 * amount for r, amount in totals.items()}
        operations.append(OperationSnapshot("hog-op", "hog", hog_job, pending_job_count=1))
    multiplier = draw(st.none() | st.just(F(2)))
    return TreeSnapshot(
        totals,
        tuple(pools),
        tuple(operations),
        infer_weight_from_guarantees_share_multiplier=multiplier,
    )


def elements(result: FairShareResult) -> list[ElementShares]:
    return [result.root, *result.pools.values(), *result.operations.values()]


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_fair_shares_sum_to_at_most_one_per_resource(snapshot: TreeSnapshot) -> None:
    result = compute_fair_share(snapshot)
    for resource in result.resources:
        assert result.root.fair_share.total[resource] <= 1
        assert sum(o.fair_share.total[resource] for o in result.operations.values()) <= 1


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_every_element_stays_within_its_demand_and_limits(snapshot: TreeSnapshot) -> None:
    result = compute_fair_share(snapshot)
    for element in elements(result):
        for resource, share in element.fair_share.total.items():
            assert 0 <= share <= element.demand_share[resource], element.name
            assert share <= element.limits_share[resource], element.name


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_children_never_get_more_than_their_parent(snapshot: TreeSnapshot) -> None:
    result = compute_fair_share(snapshot)
    for parent in [result.root, *result.pools.values()]:
        children = children_of(result, parent.name)
        for resource in result.resources:
            given_out = sum(c.fair_share.total[resource] for c in children)
            assert given_out <= parent.fair_share.total[resource], parent.name


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_guarantee_covering_the_demand_is_honoured(snapshot: TreeSnapshot) -> None:
    """A pool whose whole demand fits in its (effective) strong guarantee gets all of it --
    unless a limit inside its subtree keeps part of that demand from ever running."""
    result = compute_fair_share(snapshot)

    def subtree(name: str) -> list[ElementShares]:
        children = children_of(result, name)
        return [*children, *(e for c in children for e in subtree(c.name))]

    for pool in result.pools.values():
        reachable = all(
            element.limits_share[r] >= element.demand_share[r]
            for element in [pool, *subtree(pool.name)] for r in result.resources
        )
        if reachable and all(
            pool.demand_share[r] <= pool.strong_guarantee_share[r] for r in result.resources
        ):
            assert pool.fair_share.total == pool.demand_share, pool.name


@settings(max_examples=75, deadline=None)
@given(snapshots(), st.randoms(use_true_random=False))
def test_same_snapshot_same_result_in_any_order(snapshot: TreeSnapshot, rng: random.Random) -> None:
    pools, operations = list(snapshot.pools), list(snapshot.operations)
    rng.shuffle(pools)
    rng.shuffle(operations)
    shuffled = TreeSnapshot(
        snapshot.total_resources,
        tuple(pools),
        tuple(operations),
        infer_weight_from_guarantees_share_multiplier=(
            snapshot.infer_weight_from_guarantees_share_multiplier
        ),
    )
    first = compute_fair_share(snapshot)
    assert compute_fair_share(snapshot) == first
    assert compute_fair_share(shuffled) == first


@st.composite
def integral_snapshots(draw: st.DrawFn, resources: tuple[str, ...] = RESOURCES) -> TreeSnapshot:
    """A random tree (above) in which some pools, never one inside another, are burst or
    relaxed pools with random burst guarantees, flows, volumes, last share ratios and time
    elapsed; kept to ``resources``."""
    snapshot = draw(snapshots())
    parents = {pool.name: pool.parent for pool in snapshot.pools}

    def line(name: str | None) -> set[str]:
        found = set()
        while name is not None:
            found.add(name)
            name = parents.get(name)
        return found

    integral: set[str] = set()
    pools = []
    for pool in snapshot.pools:
        kind = draw(st.sampled_from(IntegralGuaranteeType))
        related = line(pool.name) | {p for p in integral if pool.name in line(p)}
        if kind is not IntegralGuaranteeType.NONE and not related & integral:
            integral.add(pool.name)
            total = snapshot.total_resources
            pool = replace(
                pool,
                integral_guarantees=IntegralGuarantees(
                    kind,
                    {"cpu": draw(st.integers(0, total["cpu"]))},
                    {"cpu": draw(st.integers(0, total["cpu"]))},
                    draw(st.none() | st.integers(1, 10).map(F)),
                ),
                integral_state=IntegralState(
                    {r: F(draw(st.integers(0, 100 * total[r]))) for r in total},
                    F(draw(st.integers(0, 4)), 4),
                    F(draw(st.integers(0, 120))),
                ),
            )
        pools.append(replace(
            pool,
            resource_limits={r: a for r, a in pool.resource_limits.items() if r in resources},
        ))
    operations = [
        replace(
            op,
            job_resources={r: a for r, a in op.job_resources.items() if r in resources},
            resource_limits={r: a for r, a in op.resource_limits.items() if r in resources},
        )
        for op in snapshot.operations
    ]
    return replace(
        snapshot,
        total_resources={r: a for r, a in snapshot.total_resources.items() if r in resources},
        pools=tuple(pools),
        operations=tuple(operations),
    )


@settings(max_examples=150, deadline=None)
@given(integral_snapshots())
def test_integral_pools_keep_the_invariants(snapshot: TreeSnapshot) -> None:
    """With burst and relaxed pools: shares sum to at most 1 per resource, stay within demand
    and limits, children within their parent; volumes stay within [0, max(old, capacity)]."""
    result = compute_fair_share(snapshot)
    for resource in result.resources:
        assert sum(o.fair_share.total[resource] for o in result.operations.values()) <= 1
        assert result.root.fair_share.total[resource] <= 1
    for element in elements(result):
        for resource, share in element.fair_share.total.items():
            assert 0 <= share <= element.demand_share[resource], element.name
            assert share <= element.limits_share[resource], element.name
    for parent in [result.root, *result.pools.values()]:
        for resource in result.resources:
            given_out = sum(c.fair_share.total[resource] for c in children_of(result, parent.name))
            assert given_out <= parent.fair_share.total[resource], parent.name
    saturation = 86_400
    for pool in snapshot.pools:
        shares = result.pools[pool.name]
        if shares.integral is None:
            continue
        flow = shares.integral.specified_resource_flow_ratio
        for resource, volume in shares.integral.state.accumulated_volume.items():
            old = pool.integral_state.accumulated_volume.get(resource, F(0))
            capacity = snapshot.total_resources[resource] * flow * saturation
            assert 0 <= volume <= max(old, capacity), (pool.name, resource)


@settings(max_examples=150, deadline=None)
@given(integral_snapshots(resources=("cpu",)))
def test_integral_pool_gets_its_guarantee_up_to_its_demand(snapshot: TreeSnapshot) -> None:
    """On one resource an integral pool's fair share is at least ``min(strong guarantee +
    integral share, demand)`` (its guarantee at suggestion 0), where no limit in its subtree
    holds its demand back; a burst pool's integral share is at most its burst ratio."""
    result = compute_fair_share(snapshot)

    def subtree(name: str) -> list[ElementShares]:
        children = children_of(result, name)
        return [*children, *(e for c in children for e in subtree(c.name))]

    for pool in result.pools.values():
        if pool.integral is None:
            continue
        integral = pool.proposed_integral_share["cpu"]
        if pool.integral.guarantee_type is IntegralGuaranteeType.BURST:
            assert integral <= pool.integral.burst_ratio
        unlimited = all(e.limits_share["cpu"] == 1 for e in [pool, *subtree(pool.name)])
        if unlimited:
            guaranteed = pool.strong_guarantee_share["cpu"] + integral
            assert pool.fair_share.total["cpu"] >= min(guaranteed, pool.demand_share["cpu"])
