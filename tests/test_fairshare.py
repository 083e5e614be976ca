"""Fair share (vector HDRF) against YTsaurus's published numbers and seed 003's pool example.

Every expected value is exact. Sources: ``reference/yt_slurm.md`` §1.4 and the YTsaurus unit
tests it cites (``library/vector_hdrf/unittests/fair_share_update_ut.cpp``: cluster of 100 cpu,
100 user slots and 1000 MB unless stated), and the seed's "Pool setup example".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction as F

import pytest

from fairpool.engine.fairshare import (
    ROOT,
    ElementKind,
    FifoSortParameter,
    IntegralGuarantees,
    IntegralGuaranteeType,
    IntegralState,
    OperationSnapshot,
    PoolSnapshot,
    SchedulingMode,
    StarvationSettings,
    StarvationStatus,
    TreeSnapshot,
    compute_fair_share,
    is_below_fair_share,
)

CLUSTER = {"user_slots": 100, "cpu": 100, "memory": 1000}
#: TestNonContinuousFairShare's cluster: 100k slots, 100 cpu, 100 "GB", 100 network.
WIDE_CLUSTER = {"user_slots": 100_000, "cpu": 100, "memory": 100, "network": 100}


def demand(op_id: str, pool: str, weight: int = 1, **resources: int) -> OperationSnapshot:
    """An operation whose whole demand is one pending job of ``resources``."""
    return OperationSnapshot(op_id, pool, resources, pending_job_count=1, weight=F(weight))


def vector(**shares: F | int) -> dict[str, F]:
    return {key: F(value) for key, value in shares.items()}


def unit(share: F | str | int, cluster: Mapping[str, int] = CLUSTER) -> dict[str, F]:
    """``Unit * share`` in YTsaurus's tests: the same share of every resource."""
    return dict.fromkeys(cluster, F(share))


def seed_pools(**overrides: PoolSnapshot) -> tuple[PoolSnapshot, ...]:
    """The seed's table: project-root 100 cpu; adhoc 80; batch 0 with weight 10; backup 20."""
    pools = {
        "project-root": PoolSnapshot("project-root", strong_guarantee_resources={"cpu": 100}),
        "project-adhoc": PoolSnapshot(
            "project-adhoc", "project-root", strong_guarantee_resources={"cpu": 80}
        ),
        "project-batch": PoolSnapshot("project-batch", "project-root", weight=F(10)),
        "project-backup": PoolSnapshot(
            "project-backup", "project-root", strong_guarantee_resources={"cpu": 20}
        ),
    }
    pools.update(overrides)
    return tuple(pools.values())


def busy(pool: str, cpu: int = 1000) -> OperationSnapshot:
    return OperationSnapshot(f"{pool}-op", f"project-{pool}", {"cpu": 1}, pending_job_count=cpu)


TWO_POOLS = (PoolSnapshot("A"), PoolSnapshot("B"))
X_HEAVY = demand("x", "A", weight=10, user_slots=10, cpu=10, memory=10, network=40)
Y_LONG = demand("y", "A", user_slots=1000, cpu=1000, memory=1000, network=0)

CASES: list[tuple[str, TreeSnapshot, dict[str, dict[str, F]]]] = [
    (
        # One operation larger than the cluster: memory (4000/1000) is dominant and saturates.
        "yt-one-large-operation",
        TreeSnapshot(CLUSTER, TWO_POOLS, (demand("x", "A", user_slots=200, cpu=200, memory=4000),)),
        {
            ROOT: vector(user_slots=F(1, 2), cpu=F(1, 2), memory=1),
            "A": vector(user_slots=F(1, 2), cpu=F(1, 2), memory=1),
            "x": vector(user_slots=F(1, 2), cpu=F(1, 2), memory=1),
            "B": unit(0),
        },
    ),
    (
        "yt-one-small-operation",
        TreeSnapshot(CLUSTER, TWO_POOLS, (demand("x", "A", user_slots=30, cpu=30, memory=600),)),
        {
            ROOT: vector(user_slots=F("0.3"), cpu=F("0.3"), memory=F("0.6")),
            "x": vector(user_slots=F("0.3"), cpu=F("0.3"), memory=F("0.6")),
            "B": unit(0),
        },
    ),
    (
        # Two operations with complementary dominant resources share cpu and memory fully.
        "yt-two-complementary-operations",
        TreeSnapshot(
            CLUSTER,
            TWO_POOLS,
            (
                demand("x", "A", user_slots=100, cpu=100, memory=2000),
                demand("y", "A", user_slots=100, cpu=200, memory=1000),
            ),
        ),
        {
            "A": vector(user_slots=F(2, 3), cpu=1, memory=1),
            "x": vector(user_slots=F(1, 3), cpu=F(1, 3), memory=F(2, 3)),
            "y": vector(user_slots=F(1, 3), cpu=F(2, 3), memory=F(1, 3)),
        },
    ),
    (
        # Memory saturates first; numbers in fortieths as in the YTsaurus test.
        "yt-complex-case",
        TreeSnapshot(
            CLUSTER,
            TWO_POOLS,
            (
                demand("x", "A", user_slots=10, cpu=10, memory=200),
                demand("y", "A", user_slots=1000, cpu=3000, memory=10000),
                demand("z", "B", user_slots=2000, cpu=2000, memory=100000),
            ),
        ),
        {
            ROOT: vector(user_slots=F(16, 40), cpu=F(30, 40), memory=1),
            "A": vector(user_slots=F(11, 40), cpu=F(25, 40), memory=F(15, 40)),
            "B": vector(user_slots=F(5, 40), cpu=F(5, 40), memory=F(25, 40)),
            "x": vector(user_slots=F(4, 40), cpu=F(4, 40), memory=F(8, 40)),
            "y": vector(user_slots=F(7, 40), cpu=F(21, 40), memory=F(7, 40)),
            "z": vector(user_slots=F(5, 40), cpu=F(5, 40), memory=F(25, 40)),
        },
    ),
    (
        # x (weight 10) saturates its network-dominant demand, y takes the rest of the cpu.
        "yt-non-continuous-fair-share",
        TreeSnapshot(WIDE_CLUSTER, TWO_POOLS, (X_HEAVY, Y_LONG)),
        {
            "A": vector(user_slots=F("0.001"), cpu=1, memory=1, network=F("0.4")),
            "x": vector(user_slots=F("0.0001"), cpu=F("0.1"), memory=F("0.1"), network=F("0.4")),
            "y": vector(user_slots=F("0.0009"), cpu=F("0.9"), memory=F("0.9"), network=0),
            "B": unit(0, WIDE_CLUSTER),
        },
    ),
    (
        # 0.4 is a discontinuity of A's fair share by suggestion; under a 40-cpu limit A gets
        # the left limit there (0.14 cpu), although the right limit would fit.
        "yt-left-continuous-at-discontinuity",
        TreeSnapshot(
            WIDE_CLUSTER,
            (
                PoolSnapshot("FakeRoot", resource_limits={"cpu": 40}),
                PoolSnapshot("A", "FakeRoot"),
                PoolSnapshot("B", "FakeRoot"),
            ),
            (X_HEAVY, Y_LONG),
        ),
        {
            ROOT: vector(
                user_slots=F("0.00014"), cpu=F("0.14"), memory=F("0.14"), network=F("0.4")
            ),
            "FakeRoot": vector(
                user_slots=F("0.00014"), cpu=F("0.14"), memory=F("0.14"), network=F("0.4")
            ),
            "x": vector(user_slots=F("0.0001"), cpu=F("0.1"), memory=F("0.1"), network=F("0.4")),
            "y": vector(user_slots=F("0.00004"), cpu=F("0.04"), memory=F("0.04"), network=0),
        },
    ),
    (
        # reference §1.4: at the root 0.3 + s each, s = 0.2; inside A (0.1 + s') + s' +
        # min(0.02, s') = 0.5, s' = 0.19.
        "yt-promised-guarantee-fair-share",
        TreeSnapshot(
            CLUSTER,
            (
                PoolSnapshot("A", strong_guarantee_resources={"cpu": 30}),
                PoolSnapshot("A1", "A", strong_guarantee_resources={"cpu": 10}),
                PoolSnapshot("A2", "A"),
                PoolSnapshot("A3", "A"),
                PoolSnapshot("B", strong_guarantee_resources={"cpu": 30}),
            ),
            (
                demand("a1", "A1", **CLUSTER),
                demand("a2", "A2", **CLUSTER),
                demand("a3", "A3", user_slots=2, cpu=2, memory=20),
                demand("b", "B", **CLUSTER),
            ),
        ),
        {
            "A": unit("0.5"),
            "B": unit("0.5"),
            "A1": unit("0.29"),
            "A2": unit("0.19"),
            "A3": unit("0.02"),
            "a1": unit("0.29"),
            "a2": unit("0.19"),
            "a3": unit("0.02"),
            "b": unit("0.5"),
        },
    ),
    (
        # TestSimple: 2 operations in a fair-share pool, 2 in a FIFO pool; all fit.
        "yt-simple-fifo-and-fair-share",
        TreeSnapshot(
            CLUSTER,
            (
                PoolSnapshot("A"),
                PoolSnapshot("B"),
                PoolSnapshot("C", mode=SchedulingMode.FIFO),
                PoolSnapshot("D", mode=SchedulingMode.FIFO),
            ),
            (
                demand("o0", "A", user_slots=10, cpu=10, memory=100),
                demand("o1", "A", user_slots=10, cpu=10, memory=100),
                demand("o2", "C", weight=10, user_slots=10, cpu=10, memory=100),
                demand("o3", "C", user_slots=10, cpu=10, memory=100),
            ),
        ),
        {
            ROOT: unit("0.4"),
            "A": unit("0.2"),
            "C": unit("0.2"),
            "B": unit(0),
            "D": unit(0),
            "o0": unit("0.1"),
            "o3": unit("0.1"),
        },
    ),
    (
        # Seed: everything saturated -> adhoc and backup get their guarantees, batch nothing.
        "seed-all-saturated",
        TreeSnapshot({"cpu": 100}, seed_pools(), (busy("adhoc"), busy("batch"), busy("backup"))),
        {
            "project-root": vector(cpu=1),
            "project-adhoc": vector(cpu=F("0.8")),
            "project-backup": vector(cpu=F("0.2")),
            "project-batch": vector(cpu=0),
        },
    ),
    (
        # Seed: adhoc idle -> batch (weight 10) takes the slack. Weights apply on top of
        # guarantees: batch 10f, backup 0.2 + f, 0.2 + 11f = 1.
        "seed-adhoc-idle",
        TreeSnapshot({"cpu": 100}, seed_pools(), (busy("batch"), busy("backup"))),
        {
            "project-adhoc": vector(cpu=0),
            "project-batch": vector(cpu=F(8, 11)),
            "project-backup": vector(cpu=F(3, 11)),
        },
    ),
    (
        # Seed: adhoc uses 30 of its 80 -> the unclaimed 50 go mostly to batch.
        "seed-adhoc-partly-idle",
        TreeSnapshot(
            {"cpu": 100}, seed_pools(), (busy("adhoc", 30), busy("batch"), busy("backup"))
        ),
        {
            "project-adhoc": vector(cpu=F("0.3")),
            "project-batch": vector(cpu=F(5, 11)),
            "project-backup": vector(cpu=F(27, 110)),
        },
    ),
    (
        # resource_limits cap a pool; the other pool takes what is left.
        "resource-limits-cap",
        TreeSnapshot(
            {"cpu": 100},
            (PoolSnapshot("capped", resource_limits={"cpu": 30}), PoolSnapshot("open")),
            (
                OperationSnapshot("c", "capped", {"cpu": 1}, pending_job_count=1000),
                OperationSnapshot("o", "open", {"cpu": 1}, pending_job_count=1000),
            ),
        ),
        {"capped": vector(cpu=F("0.3")), "open": vector(cpu=F("0.7"))},
    ),
    (
        # An operation's own resource_limits cap it too.
        "operation-resource-limits",
        TreeSnapshot(
            {"cpu": 100},
            (PoolSnapshot("p"),),
            (
                OperationSnapshot(
                    "a", "p", {"cpu": 1}, pending_job_count=1000, resource_limits={"cpu": 10}
                ),
                OperationSnapshot("b", "p", {"cpu": 1}, pending_job_count=1000),
            ),
        ),
        {"a": vector(cpu=F("0.1")), "b": vector(cpu=F("0.9"))},
    ),
    (
        # Guarantee overcommit (80 + 40 > 100): scaled by one factor, 100/120.
        "guarantees-overcommit-scaled",
        TreeSnapshot(
            {"cpu": 100},
            (
                PoolSnapshot("a", strong_guarantee_resources={"cpu": 80}),
                PoolSnapshot("b", strong_guarantee_resources={"cpu": 40}),
            ),
            (
                OperationSnapshot("x", "a", {"cpu": 1}, pending_job_count=1000),
                OperationSnapshot("y", "b", {"cpu": 1}, pending_job_count=1000),
            ),
        ),
        {"a": vector(cpu=F(2, 3)), "b": vector(cpu=F(1, 3))},
    ),
    (
        # Demand below the guarantee: the pool gets its demand, the rest goes to the other.
        "guarantee-above-demand",
        TreeSnapshot(
            {"cpu": 100},
            (PoolSnapshot("g", strong_guarantee_resources={"cpu": 60}), PoolSnapshot("o")),
            (
                OperationSnapshot("x", "g", {"cpu": 1}, pending_job_count=25),
                OperationSnapshot("y", "o", {"cpu": 1}, pending_job_count=1000),
            ),
        ),
        {"g": vector(cpu=F("0.25")), "o": vector(cpu=F("0.75"))},
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_fair_share(snapshot: TreeSnapshot, expected: dict[str, dict[str, F]]) -> None:
    result = compute_fair_share(snapshot)
    for name, shares in expected.items():
        element = result.root if name == ROOT else result.pools.get(name) or result.operations[name]
        assert dict(element.fair_share.total) == shares, name


def test_overcommitted_guarantees_are_reported() -> None:
    snapshot = CASES[[c[0] for c in CASES].index("guarantees-overcommit-scaled")][1]
    (warning,) = compute_fair_share(snapshot).warnings
    assert "exceed the tree total" in warning and "5/6" in warning


def test_a_limit_on_a_resource_no_node_has_is_reported() -> None:
    """Accepted, and silent: a pool's user_slots limit in a tree whose nodes declare none
    limits nothing (helper-71); a limit on what the nodes have is no warning."""
    pools = (PoolSnapshot("A", resource_limits={"user_slots": 2, "cpu": 10}), PoolSnapshot("B"))
    result = compute_fair_share(TreeSnapshot({"cpu": 100}, pools, (busy_op("a", "A"),)))
    assert result.warnings == (
        "pool A: resource_limits.user_slots limits nothing: no node of the tree has user_slots",)


def test_detailed_fair_share_splits_guarantee_and_weight_part() -> None:
    result = compute_fair_share(
        TreeSnapshot({"cpu": 100}, seed_pools(), (busy("batch"), busy("backup")))
    )
    backup = result.pools["project-backup"].fair_share
    assert backup.strong_guarantee == {"cpu": F("0.2")}
    assert backup.weight_proportional == {"cpu": F(3, 11) - F("0.2")}


# -- FIFO ----------------------------------------------------------------------------------


def fifo_pool(*parameters: FifoSortParameter) -> TreeSnapshot:
    """Three operations of 0.5 cpu each in one FIFO pool: only the first two fit."""
    operations = (
        OperationSnapshot("early", "q", {"cpu": 50}, pending_job_count=1, start_time=1.0),
        OperationSnapshot(
            "heavy", "q", {"cpu": 25}, pending_job_count=2, start_time=2.0, weight=F(5)
        ),
        OperationSnapshot("small", "q", {"cpu": 50}, pending_job_count=1, start_time=3.0),
    )
    pool = PoolSnapshot("q", mode=SchedulingMode.FIFO)
    if parameters:
        pool = PoolSnapshot("q", mode=SchedulingMode.FIFO, fifo_sort_parameters=parameters)
    return TreeSnapshot({"cpu": 100}, (pool,), operations)


@pytest.mark.parametrize(
    ("parameters", "order"),
    [
        ((), ["heavy", "early", "small"]),  # default [weight, start_time]
        ((FifoSortParameter.START_TIME,), ["early", "heavy", "small"]),
        (
            (FifoSortParameter.PENDING_JOB_COUNT, FifoSortParameter.START_TIME),
            ["early", "small", "heavy"],
        ),
    ],
)
def test_fifo_pool_fills_operations_in_sort_order(
    parameters: tuple[FifoSortParameter, ...], order: list[str]
) -> None:
    result = compute_fair_share(fifo_pool(*parameters))
    assert [result.operations[o].fifo_index for o in order] == [0, 1, 2]
    shares = [result.operations[o].fair_share.total["cpu"] for o in order]
    assert shares == [F(1, 2), F(1, 2), 0]


# -- guarantees and weights ------------------------------------------------------------------


def test_guarantees_of_other_resources_are_inferred_from_the_main_resource() -> None:
    result = compute_fair_share(
        TreeSnapshot(
            {"cpu": 100, "memory": 1000, "gpu": 8},
            (
                PoolSnapshot("p", strong_guarantee_resources={"cpu": 50}),
                PoolSnapshot("c", "p", strong_guarantee_resources={"cpu": 20, "gpu": 3}),
                PoolSnapshot("d", "p", strong_guarantee_resources={"cpu": 20}),
            ),
        )
    )
    assert dict(result.pools["p"].strong_guarantee_share) == vector(
        cpu=F("0.5"), gpu=F("0.5"), memory=F("0.5")
    )
    # c names gpu itself; d infers 20/50 of p's 4 gpu = 1.6, but only 1 is left after c's 3.
    assert result.pools["c"].strong_guarantee_share["gpu"] == F(3, 8)
    assert result.pools["d"].strong_guarantee_share["gpu"] == F(1, 8)
    assert result.pools["d"].strong_guarantee_share["memory"] == F("0.2")


def weighted_snapshot(multiplier: F | None, b_weight: F | None = None) -> TreeSnapshot:
    return TreeSnapshot(
        {"cpu": 100},
        (
            PoolSnapshot("a", strong_guarantee_resources={"cpu": 20}),
            PoolSnapshot("b", strong_guarantee_resources={"cpu": 10}, weight=b_weight),
        ),
        (
            OperationSnapshot("x", "a", {"cpu": 1}, pending_job_count=1000),
            OperationSnapshot("y", "b", {"cpu": 1}, pending_job_count=1000),
        ),
        infer_weight_from_guarantees_share_multiplier=multiplier,
    )


@pytest.mark.parametrize(
    ("multiplier", "b_weight", "weights", "shares"),
    [
        # No inference: weight 1 each; 0.2 + f + 0.1 + f = 1.
        (None, None, (1, 1), (F("0.55"), F("0.45"))),
        # Inference: weight = multiplier * own / parent's guarantee share (0.3 at the root).
        (F(3), None, (2, 1), (F(2, 3), F(1, 3))),
        # An explicit weight is never inferred.
        (F(3), F(2), (2, 2), (F("0.55"), F("0.45"))),
    ],
)
def test_weight_inference_from_guarantees(
    multiplier: F | None, b_weight: F | None, weights: tuple[int, int], shares: tuple[F, F]
) -> None:
    result = compute_fair_share(weighted_snapshot(multiplier, b_weight))
    assert (result.pools["a"].weight, result.pools["b"].weight) == tuple(map(F, weights))
    assert (
        result.pools["a"].fair_share.total["cpu"],
        result.pools["b"].fair_share.total["cpu"],
    ) == shares


# -- usage, demand, dominant resource ------------------------------------------------------


def test_usage_demand_and_dominant_resource() -> None:
    operation = OperationSnapshot(
        "op",
        "p",
        {"cpu": 2, "memory": 100, "user_slots": 1},
        running_job_count=3,
        pending_job_count=2,
    )
    result = compute_fair_share(
        TreeSnapshot(
            {"cpu": 100, "memory": 1000, "user_slots": 100}, (PoolSnapshot("p"),), (operation,)
        )
    )
    shares = result.operations["op"]
    assert dict(shares.usage_share) == vector(user_slots=F("0.03"), cpu=F("0.06"), memory=F("0.3"))
    assert dict(shares.demand_share) == vector(user_slots=F("0.05"), cpu=F("0.1"), memory=F("0.5"))
    assert shares.dominant_resource == "memory"
    assert shares.dominant_usage_share == F("0.3") and shares.dominant_demand_share == F("0.5")
    assert shares.dominant_fair_share == F("0.5")
    assert result.pools["p"].usage_share == shares.usage_share


def test_pending_operation_demands_only_its_usage() -> None:
    waiting = OperationSnapshot("w", "p", {"cpu": 1}, pending_job_count=50, running=False)
    result = compute_fair_share(TreeSnapshot({"cpu": 100}, (PoolSnapshot("p"),), (waiting,)))
    assert result.operations["w"].demand_share == {"cpu": 0}
    assert result.operations["w"].fair_share.total == {"cpu": 0}


def test_resource_missing_from_the_tree_gets_no_share() -> None:
    gpu_job = OperationSnapshot("g", "p", {"cpu": 1, "gpu": 1}, pending_job_count=4)
    result = compute_fair_share(TreeSnapshot({"cpu": 100}, (PoolSnapshot("p"),), (gpu_job,)))
    # x/0 counts as the whole cluster (YTsaurus's FromJobResources); nothing can be given.
    assert result.operations["g"].demand_share["gpu"] == 1
    assert result.operations["g"].fair_share.total == {"cpu": 0, "gpu": 0}


# -- starvation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fair", "usage", "demand_", "tolerance", "below"),
    [
        ((F("0.5"),), (F("0.3"),), (F(1),), F("0.8"), True),
        # usage must be strictly under fair share * tolerance
        ((F("0.5"),), (F("0.4"),), (F(1),), F("0.8"), False),
        # bound is min(fair * tolerance, demand)
        ((F("0.5"),), (F("0.35"),), (F("0.36"),), F(1), True),
        # every non-blocked resource must be under its bound; cpu is, memory is not
        ((F("0.5"), F("0.5")), (F("0.1"), F("0.45")), (F(1), F(1)), F("0.8"), False),
        # memory is blocked (fair >= demand): only cpu counts
        ((F("0.5"), F("0.2")), (F("0.1"), F("0.2")), (F(1), F("0.2")), F("0.8"), True),
        # all blocked: one resource under its bound suffices
        ((F("0.2"), F("0.2")), (F("0.1"), F("0.2")), (F("0.2"), F("0.2")), F("0.8"), True),
    ],
)
def test_below_fair_share_status(
    fair: tuple[F, ...], usage: tuple[F, ...], demand_: tuple[F, ...], tolerance: F, below: bool
) -> None:
    assert is_below_fair_share(fair, usage, demand_, tolerance) is below


def starving_seed(adhoc_running: int) -> TreeSnapshot:
    """Seed tree after adhoc submits work while batch holds the whole cluster."""
    adhoc = OperationSnapshot(
        "adhoc-op",
        "project-adhoc",
        {"cpu": 1},
        running_job_count=adhoc_running,
        pending_job_count=1000 - adhoc_running,
    )
    batch = OperationSnapshot(
        "batch-op",
        "project-batch",
        {"cpu": 1},
        running_job_count=100 - adhoc_running,
        pending_job_count=900,
    )
    return TreeSnapshot({"cpu": 100}, seed_pools(), (adhoc, batch))


def test_starvation_timeline_with_injected_clock() -> None:
    key = (ElementKind.OPERATION, "adhoc-op")
    since: dict[tuple[ElementKind, str], float] = {}
    timeline = []
    for now, running in [(100.0, 0), (130.0, 0), (130.5, 0), (131.0, 70), (140.0, 80)]:
        result = compute_fair_share(starving_seed(running), now=now, below_fair_share_since=since)
        state = result.operations[key[1]].starvation
        assert state is not None
        since = {} if state.below_fair_share_since is None else {key: state.below_fair_share_since}
        timeline.append((now, state.below_fair_share, state.below_fair_share_since, state.status))
    assert timeline == [
        (100.0, True, 100.0, StarvationStatus.NON_STARVING),
        # timeout 30 s (tree default) has not *passed* yet at exactly 130
        (130.0, True, 100.0, StarvationStatus.NON_STARVING),
        (130.5, True, 100.0, StarvationStatus.STARVING),
        # usage 0.7 is not under 0.8 * fair share 0.8 = 0.64: back to normal, the clock resets
        (131.0, False, None, StarvationStatus.NON_STARVING),
        (140.0, False, None, StarvationStatus.NON_STARVING),
    ]


def test_pool_starvation_uses_the_pools_settings_and_can_be_disabled() -> None:
    snapshot = starving_seed(0)
    pools = tuple(
        PoolSnapshot(
            p.name,
            p.parent,
            weight=p.weight,
            strong_guarantee_resources=p.strong_guarantee_resources,
            starvation=StarvationSettings(F("0.5"), 1_000),
        )
        for p in snapshot.pools
    )
    tuned = TreeSnapshot(snapshot.total_resources, pools, snapshot.operations)
    since = {(ElementKind.POOL, "project-adhoc"): 0.0}
    result = compute_fair_share(tuned, now=1.5, below_fair_share_since=since)
    adhoc = result.pools["project-adhoc"].starvation
    assert adhoc is not None and adhoc.status is StarvationStatus.STARVING
    assert result.root.starvation is None  # the root never starves
    off = TreeSnapshot(
        snapshot.total_resources, pools, snapshot.operations, enable_pool_starvation=False
    )
    assert compute_fair_share(off, now=1.5).pools["project-adhoc"].starvation is None


def test_operation_with_fair_share_equal_to_demand_uses_tolerance_one() -> None:
    # fair share = demand = 0.2; usage 0.18 is not under 0.8 * 0.2 but is under 1.0 * 0.2.
    operation = OperationSnapshot(
        "small", "p", {"cpu": 1}, running_job_count=18, pending_job_count=2
    )
    result = compute_fair_share(
        TreeSnapshot({"cpu": 100}, (PoolSnapshot("p"),), (operation,)), now=0.0
    )
    state = result.operations["small"].starvation
    assert state is not None and state.below_fair_share


# -- determinism -----------------------------------------------------------------------------


def test_same_snapshot_in_any_input_order_gives_the_same_result() -> None:
    snapshot = CASES[[c[0] for c in CASES].index("yt-complex-case")][1]
    shuffled = TreeSnapshot(
        snapshot.total_resources,
        tuple(reversed(snapshot.pools)),
        tuple(reversed(snapshot.operations)),
    )
    assert compute_fair_share(snapshot) == compute_fair_share(shuffled)


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        (TreeSnapshot({"cpu": 1}, (PoolSnapshot("a", "nowhere"),)), "unknown parent"),
        (TreeSnapshot({"cpu": 1}, (PoolSnapshot("a", "b"), PoolSnapshot("b", "a"))), "cycle"),
        (
            TreeSnapshot(
                {"cpu": 1}, (PoolSnapshot("f", mode=SchedulingMode.FIFO), PoolSnapshot("c", "f"))
            ),
            "FIFO pool holds operations only",
        ),
        (TreeSnapshot({"cpu": 1}, (), (OperationSnapshot("o", "p", {}),)), "unknown pool"),
        # The operations are checked as columns first: the message still names the one at fault.
        (
            TreeSnapshot(
                {"cpu": 1},
                (PoolSnapshot("p"),),
                (OperationSnapshot("a", "p", {}), OperationSnapshot("b", "p", {}, weight=F(0))),
            ),
            "operation 'b': weight must be positive",
        ),
        (
            TreeSnapshot(
                {"cpu": 1},
                (PoolSnapshot("p"),),
                (OperationSnapshot("a", "p", {}, weight=F(-1, 2)),),
            ),
            "operation 'a': weight must be positive",
        ),
        (
            TreeSnapshot(
                {"cpu": 1}, (PoolSnapshot("p"),), (OperationSnapshot("a", "p", {}, -1, 2),)
            ),
            "operation 'a': job counts must be non-negative",
        ),
        (
            TreeSnapshot(
                {"cpu": 1}, (PoolSnapshot("p"),), (OperationSnapshot("a", "p", {}, 2, -1),)
            ),
            "operation 'a': job counts must be non-negative",
        ),
        (
            TreeSnapshot(
                {"cpu": 1},
                (PoolSnapshot("p"),),
                (OperationSnapshot("a", "p", {}), OperationSnapshot("a", "p", {})),
            ),
            "operation ids must be unique",
        ),
    ],
)
def test_broken_snapshots_are_refused(snapshot: TreeSnapshot, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_fair_share(snapshot)


# -- integral guarantees (reference/yt_slurm.md §1.6) ------------------------------------------

BURST, RELAXED = IntegralGuaranteeType.BURST, IntegralGuaranteeType.RELAXED


def integral_pool(
    name: str,
    kind: IntegralGuaranteeType,
    volume: int,
    *,
    burst: int = 0,
    flow: int = 10,
    elapsed: int = 0,
    last: F = F(0),
    strong: int = 0,
) -> PoolSnapshot:
    """An integral pool on a 100-cpu tree: ``volume`` cpu-seconds, ``elapsed`` seconds since
    the update that left it, which gave it ``last`` of the tree."""
    return PoolSnapshot(
        name,
        strong_guarantee_resources={"cpu": strong} if strong else {},
        integral_guarantees=IntegralGuarantees(
            kind, {"cpu": burst} if burst else {}, {"cpu": flow}
        ),
        integral_state=IntegralState({"cpu": F(volume)}, last, F(elapsed)),
    )


def burst_against_weight_3(volume: int, elapsed: int = 0, last: F = F(0)) -> TreeSnapshot:
    """Burst pool B (burst 50 cpu, flow 10) and W of weight 3, both demanding everything."""
    b = integral_pool("B", BURST, volume, burst=50, elapsed=elapsed, last=last)
    return TreeSnapshot(
        {"cpu": 100},
        (b, PoolSnapshot("W", weight=F(3))),
        (busy_op("b", "B"), busy_op("w", "W")),
    )


def busy_op(op_id: str, pool: str) -> OperationSnapshot:
    return OperationSnapshot(op_id, pool, {"cpu": 1}, pending_job_count=1000)


INTEGRAL_CASES: list[tuple[str, TreeSnapshot, dict[str, F], F, F]] = [
    # (case, snapshot, fair shares, B's integral share, B's volume after the update)
    # Without volume, weights alone: B 1/4, W 3/4.
    ("burst-without-volume", burst_against_weight_3(volume=0), {"B": F(1, 4), "W": F(3, 4)},
     F(0), F(0)),
    # 6000 cpu-s = 60 share-s: over smooth_period 60 s that pays for a share of 1 >= burst 1/2.
    # B is guaranteed 1/2, then weights split the rest: 1/2 + f + 3f = 1, f = 1/8.
    ("burst-with-volume", burst_against_weight_3(volume=6000), {"B": F(5, 8), "W": F(3, 8)},
     F(1, 2), F(6000)),
    # 100 s at 1/2 of the tree, refilled at 1/10: 6000 + 100 * 100 * (1/10 - 1/2) = 2000 cpu-s,
    # a share of 20/60 = 1/3: 1/3 + 4f = 1, f = 1/6.
    ("burst-volume-draining", burst_against_weight_3(volume=6000, elapsed=100, last=F(1, 2)),
     {"B": F(1, 2), "W": F(1, 2)}, F(1, 3), F(2000)),
    # 150 s more: 6000 - 150 * 40 = 0: the burst guarantee is gone, weights alone again.
    ("burst-volume-ran-out", burst_against_weight_3(volume=6000, elapsed=150, last=F(1, 2)),
     {"B": F(1, 4), "W": F(3, 4)}, F(0), F(0)),
    # Relaxed, alone with 6000 cpu-s: capped at flow 1/10 * relaxed_share_multiplier_limit 3;
    # 3/10 + 4f = 1, f = 7/40.
    ("relaxed-capped-by-flow", TreeSnapshot(
        {"cpu": 100},
        (integral_pool("B", RELAXED, 6000), PoolSnapshot("W", weight=F(3))),
        (busy_op("b", "B"), busy_op("w", "W")),
     ), {"B": F(19, 40), "W": F(21, 40)}, F(3, 10), F(6000)),
]


@pytest.mark.parametrize("numeric", ["exact", "float"])
@pytest.mark.parametrize(
    ("snapshot", "shares", "integral", "volume"),
    [c[1:] for c in INTEGRAL_CASES],
    ids=[c[0] for c in INTEGRAL_CASES],
)
def test_burst_and_relaxed_pools(
    snapshot: TreeSnapshot, shares: dict[str, F], integral: F, volume: F, numeric: str
) -> None:
    result = compute_fair_share(snapshot, numeric="exact" if numeric == "exact" else "float")
    for name, share in shares.items():
        assert abs(result.pools[name].fair_share.total["cpu"] - share) <= 1e-12, name
    b = result.pools["B"]
    assert abs(b.fair_share.integral_guarantee["cpu"] - integral) <= 1e-12
    assert abs(b.proposed_integral_share["cpu"] - integral) <= 1e-12
    assert b.integral is not None
    assert b.integral.state.accumulated_volume == {"cpu": volume}
    assert abs(b.integral.state.last_share_ratio - integral) <= 1e-12
    if numeric == "exact":  # the root carries the integral share up
        assert result.root.proposed_integral_share == {"cpu": integral}


def test_relaxed_pools_share_what_is_left_in_proportion_to_their_volume() -> None:
    """S's strong guarantee leaves 1/5; R1 (1200 cpu-s, a ratio of 1/5) and R2 (600 cpu-s,
    1/10) are suggested 2f and f: 2f + f = 1/5, so 2/15 and 1/15."""
    snapshot = TreeSnapshot(
        {"cpu": 100},
        (
            PoolSnapshot("S", strong_guarantee_resources={"cpu": 80}),
            integral_pool("R1", RELAXED, 1200),
            integral_pool("R2", RELAXED, 600),
        ),
        (busy_op("s", "S"), busy_op("r1", "R1"), busy_op("r2", "R2")),
    )
    result = compute_fair_share(snapshot)
    assert {name: p.fair_share.total["cpu"] for name, p in result.pools.items()} == {
        "S": F(4, 5), "R1": F(2, 15), "R2": F(1, 15)
    }
    assert result.pools["R1"].fair_share.integral_guarantee == {"cpu": F(2, 15)}
    assert result.pools["R2"].fair_share.weight_proportional == {"cpu": F(0)}
    assert not result.warnings


@pytest.mark.parametrize(
    ("volume", "elapsed", "last", "after"),
    [
        (0, 3600, F(0), 36_000),  # idle: 100 cpu * 3600 s * 1/10
        (863_000, 3600, F(0), 864_000),  # capped at 100 * 1/10 * 86400 s
        (900_000, 3600, F(0), 900_000),  # above a lowered capacity: never grows
        (900_000, 100, F(1, 5), 899_000),  # ... but drains: 100 * 100 * (1/10 - 1/5)
        (5_000, 0, F(1), 5_000),  # nothing elapsed: nothing refilled or consumed
    ],
)
def test_volume_accrues_at_the_flow_and_saturates(
    volume: int, elapsed: int, last: F, after: int
) -> None:
    idle = integral_pool("B", BURST, volume, burst=50, elapsed=elapsed, last=last)
    result = compute_fair_share(TreeSnapshot({"cpu": 100}, (idle,)))
    b = result.pools["B"]
    assert b.integral is not None
    assert b.integral.state.accumulated_volume == {"cpu": F(after)}
    assert b.integral.accumulated_resource_ratio_volume == F(after, 100)
    assert b.integral.integral_pool_capacity == F(8640)  # share-seconds: 1/10 * 86400
    # Nothing to run: the pool takes no integral share, so the next update consumes nothing.
    assert b.integral.state.last_share_ratio == 0
    # At burst 1/2 with a flow of 1/10 the volume lasts ratio volume / (1/2 - 1/10) seconds.
    assert b.integral.estimated_burst_usage_duration_seconds == F(after, 100) / F(2, 5)


def test_overcommitting_burst_guarantees_scales_them_with_strong_guarantees() -> None:
    """Strong 60 + burst 60 > 100: both scaled by 100/120 (a warning, as YTsaurus alerts);
    S is then guaranteed 1/2 and B a burst share of 1/2."""
    snapshot = TreeSnapshot(
        {"cpu": 100},
        (
            PoolSnapshot("S", strong_guarantee_resources={"cpu": 60}),
            integral_pool("B", BURST, 10**6, burst=60, flow=10),
        ),
        (busy_op("s", "S"), busy_op("b", "B")),
    )
    result = compute_fair_share(snapshot)
    assert [w for w in result.warnings if "burst" in w] == [
        "strong guarantees and burst guarantees exceed the tree total (burst ratio 3/5); "
        "both scaled by 5/6"
    ]
    assert result.pools["S"].strong_guarantee_share == {"cpu": F(1, 2)}
    b = result.pools["B"]
    assert b.integral is not None and b.integral.burst_ratio == F(1, 2)
    assert b.fair_share.total == {"cpu": F(1, 2)} == b.fair_share.integral_guarantee


def test_nested_integral_pools_are_refused() -> None:
    snapshot = TreeSnapshot(
        {"cpu": 100},
        (integral_pool("A", BURST, 0, burst=10), replace(integral_pool("B", RELAXED, 0),
                                                          parent="A")),
    )
    with pytest.raises(ValueError, match="integral pools do not nest"):
        compute_fair_share(snapshot)
