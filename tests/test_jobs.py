"""The pool-tree job planner (``fairpool.engine.jobs``): operation admission, job grants on
nodes, gangs, limits and starvation preemption. Pure: trees, nodes and operations built in
code, the fair share computed by the real update.

The properties at the end were each seen failing against a planted bug (``docs/trees.md``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.engine.amounts import amount_text
from fairpool.engine.fairshare import ElementKind, FairShareResult, compute_fair_share
from fairpool.engine.jobs import (
    JobPlan,
    NodeState,
    OperationState,
    RunningJob,
    admit_operations,
    plan_jobs,
)
from fairpool.frontends.trees import (
    ClusterNode,
    Pool,
    PoolConfig,
    PoolTree,
    PoolTreeConfig,
    parse_resources,
)


def node(name: str, tags: Sequence[str] = ("gpu",), last: float | None = None, **res: int) -> NodeState:
    return NodeState(ClusterNode(name, frozenset(tags), res), last)


def pool(name: str, parent: str | None = None, **options: object) -> Pool:
    return Pool(name, parent, PoolConfig.from_mapping(options))


def tree(*pools: Pool, **options: object) -> PoolTree:
    return PoolTree.build("physical", PoolTreeConfig.from_mapping(options), pools)


def op(
    op_id: str,
    pool_name: str,
    count: int,
    *,
    jobs: Sequence[tuple[str, float]] = (),
    gang: bool = False,
    running: bool = True,
    start: float = 0.0,
    limits: Mapping[str, int] | None = None,
    **job: int,
) -> OperationState:
    return OperationState(
        op_id,
        pool_name,
        job or {"cpu": 1},
        count,
        gang=gang,
        running=running,
        start_time=start,
        resource_limits=limits or {},
        jobs=tuple(RunningJob(f"{op_id}/{i}", n, t) for i, (n, t) in enumerate(jobs)),
    )


def fair_share(
    t: PoolTree,
    nodes: Sequence[NodeState],
    ops: Sequence[OperationState],
    now: float = 0.0,
    since: Mapping[tuple[ElementKind, str], float] | None = None,
) -> FairShareResult:
    from fairpool.frontends.trees import tree_resources

    total = tree_resources(t.config, (n.node for n in nodes))
    snapshot = t.fair_share_snapshot(total, [o.fair_share_input() for o in ops])
    return compute_fair_share(snapshot, now=now, below_fair_share_since=since)


def plan(
    t: PoolTree,
    nodes: Sequence[NodeState],
    ops: Sequence[OperationState],
    now: float = 0.0,
    since: Mapping[tuple[ElementKind, str], float] | None = None,
) -> JobPlan:
    return plan_jobs(t, nodes, ops, fair_share(t, nodes, ops, now, since), now)


def granted(result: JobPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for grant in result.grants:
        counts[grant.operation] = counts.get(grant.operation, 0) + 1
    return counts


SEED = (
    pool("project-root", strong_guarantee_resources={"cpu": 100}, max_running_operation_count=10),
    pool("project-adhoc", "project-root", strong_guarantee_resources={"cpu": 80}),
    pool("project-batch", "project-root", weight=10, max_running_operation_count=4),
    pool("project-backup", "project-root", strong_guarantee_resources={"cpu": 20}),
)
#: 100 cpu on two nodes.
SEED_NODES = (node("n1", cpu=50), node("n2", cpu=50))


# -- grants: table-driven ------------------------------------------------------------------

A, B = pool("a"), pool("b")

GRANT_CASES = [
    pytest.param(
        tree(A, B), [node("n1", cpu=4)],
        [op("x", "a", 4, jobs=[("n1", 0), ("n1", 0)]), op("y", "b", 4, start=1)],
        {"y": 2}, {"x": "no node of tree physical has room", "y": "has room"},
        id="most-under-served-first",
    ),
    pytest.param(
        tree(A), [node("n1", cpu=2), node("n2", cpu=2)], [op("x", "a", 1, cpu=3)],
        {}, {"x": "no node of tree physical is large enough for one job (cpu 3)"},
        id="a-job-fits-on-one-node",
    ),
    pytest.param(
        tree(A, node_tag_filter="gpu"), [node("cpu-1", ("cpu",), cpu=8), node("gpu-1", cpu=2)],
        [op("x", "a", 4)], {"x": 2}, {"x": "room"},
        id="only-nodes-the-filter-selects",
    ),
    pytest.param(
        tree(A), [node("n1", cpu=2), node("n2", cpu=2)], [op("x", "a", 3, gang=True, cpu=2)],
        {}, {"x": "gang of 3 jobs: only 2 fit on the nodes of tree physical even with nothing "
                  "else running; it waits for nodes to be added (all or nothing)"},
        id="gang-never: said so",
    ),
    pytest.param(
        tree(A, B), [node("n1", cpu=4)],
        [op("x", "a", 3, gang=True, start=1), op("y", "b", 2, jobs=[("n1", 0), ("n1", 0)])],
        {}, {"x": "gang of 3 jobs: only 2 fit on the nodes of tree physical now (all or nothing)"},
        id="gang-not-now",
    ),
    pytest.param(
        tree(A), [node("n1", cpu=2), node("n2", cpu=4)], [op("x", "a", 3, gang=True, cpu=2)],
        {"x": 3}, {}, id="gang-all",
    ),
    pytest.param(
        tree(pool("a", resource_limits={"cpu": 2})), [node("n1", cpu=8)], [op("x", "a", 5)],
        {"x": 2}, {"x": "pool a resource_limits.cpu: usage 2 + 1 > limit 2"},
        id="pool-limit",
    ),
    pytest.param(
        tree(pool("p", resource_limits={"cpu": 3}), pool("a", "p")), [node("n1", cpu=8)],
        [op("x", "a", 5)], {"x": 3}, {"x": "pool p resource_limits.cpu: usage 3 + 1 > limit 3"},
        id="ancestor-limit",
    ),
    pytest.param(
        tree(A), [node("n1", cpu=8)], [op("x", "a", 5, limits={"cpu": 1})],
        {"x": 1}, {"x": "operation x resource_limits.cpu: usage 1 + 1 > limit 1"},
        id="operation-limit",
    ),
    pytest.param(
        tree(A), [node("n1", cpu=8)], [op("x", "a", 5, running=False)],
        {}, {"x": "pending"}, id="pending-operations-get-no-jobs",
    ),
    pytest.param(
        tree(A, B), [node("n1", cpu=8, gpu=1)],
        [op("x", "a", 2, cpu=1, gpu=1), op("y", "b", 8, start=1)],
        {"x": 1, "y": 7}, {"x": "room", "y": "room"}, id="vector-jobs",
    ),
]


@pytest.mark.parametrize(("t", "nodes", "ops", "grants", "reasons"), GRANT_CASES)
def test_grants(
    t: PoolTree,
    nodes: list[NodeState],
    ops: list[OperationState],
    grants: dict[str, int],
    reasons: dict[str, str],
) -> None:
    result = plan(t, nodes, ops)
    assert granted(result) == grants
    assert {o: w.reason for o, w in result.waiting.items() if o in reasons}.keys() == reasons.keys()
    for op_id, needle in reasons.items():
        assert needle in result.waiting[op_id].reason, result.waiting[op_id]
    assert result.preemptions == ()


def test_jobs_running_in_the_operations_other_trees_are_not_pending_here() -> None:
    """YTsaurus pool_trees: one pending count for all the operation's trees."""
    x = replace(op("x", "a", 5), elsewhere=3)
    result = plan(tree(A), [node("n1", cpu=8)], [x])
    assert granted(result) == {"x": 2} and "x" not in result.waiting
    assert x.fair_share_input().pending_job_count == 2


def test_grants_go_to_the_first_node_with_room_and_fill_the_cluster() -> None:
    result = plan(tree(A), [node("n2", cpu=2), node("n1", cpu=1)], [op("x", "a", 5)])
    assert [g.node for g in result.grants] == ["n1", "n2", "n2"]
    assert result.waiting["x"].pending_jobs == 2


# -- admission: max_running_operation_count ------------------------------------------------


def test_pending_operations_are_promoted_oldest_first_while_every_level_has_a_slot() -> None:
    t = tree(
        pool("root-pool", max_running_operation_count=3),
        pool("small", "root-pool", max_running_operation_count=1),
        pool("other", "root-pool"),
        max_running_operation_count=10,
    )
    ops = [
        op("o1", "small", 1, running=False, start=1),
        op("o2", "small", 1, running=False, start=2),
        op("o3", "other", 1, running=False, start=3),
        op("o4", "other", 1, running=False, start=4),
        op("o5", "other", 1, start=0),
    ]
    admission = admit_operations(t, ops)
    assert admission.promoted == ("o1", "o3")
    assert admission.running == {"o1", "o3", "o5"}
    assert admission.pending == {
        "o2": "pending: pool small runs 1 operation, its max_running_operation_count is 1",
        "o4": "pending: pool root-pool runs 3 operations, its max_running_operation_count is 3",
    }


def test_the_trees_running_limit_holds_too() -> None:
    t = tree(A, max_running_operation_count=1, max_running_operation_count_per_pool=1)
    admission = admit_operations(t, [op("o1", "a", 1, running=False), op("o2", "a", 1, running=False, start=1)])
    assert admission.promoted == ("o1",)
    assert "pool a runs 1 operation" in admission.pending["o2"]


# -- starvation preemption -----------------------------------------------------------------


def batch_holds_everything(adhoc_running: int = 0) -> list[OperationState]:
    """The seed's story: batch fills both nodes; then adhoc asks for 100 cpu."""
    batch_jobs = [("n1" if i < 50 else "n2", float(i)) for i in range(adhoc_running, 100)]
    adhoc_jobs = [("n1", 200.0)] * adhoc_running
    return [
        op("batch", "project-batch", 100, jobs=batch_jobs),
        op("adhoc", "project-adhoc", 100, jobs=adhoc_jobs, start=100),
    ]


def test_no_preemption_before_the_starvation_timeout() -> None:
    t = tree(*SEED)
    ops = batch_holds_everything()
    since = {(ElementKind.OPERATION, "adhoc"): 100.0}
    result = plan(t, SEED_NODES, ops, now=130.0, since=since)
    assert result.preemptions == () and result.grants == ()
    assert "room" in result.waiting["adhoc"].reason


def test_a_starving_operation_preempts_the_newest_jobs_above_fair_share() -> None:
    t = tree(*SEED)
    ops = batch_holds_everything()
    since = {(ElementKind.OPERATION, "adhoc"): 100.0}
    shares = fair_share(t, SEED_NODES, ops, 131.0, since)
    adhoc_fair = shares.operations["adhoc"].fair_share.total["cpu"]
    batch_fair = shares.operations["batch"].fair_share.total["cpu"]
    assert (adhoc_fair, batch_fair) == (F(9, 11), F(2, 11))  # guarantee 0.8, then weights 1:10
    result = plan(t, SEED_NODES, ops, now=131.0, since=since)
    # batch keeps 19 jobs: 19/100 >= its fair share 2/11 (0.1818) * threshold 1 > 18/100, so
    # adhoc gets the 81 preemptible ones, newest first (batch job i started at i)
    assert granted(result) == {"adhoc": 81}
    assert [p.job for p in result.preemptions][:3] == ["batch/99", "batch/98", "batch/97"]
    assert {p.job for p in result.preemptions} == {f"batch/{i}" for i in range(19, 100)}
    assert all(p.preemptor == "adhoc" and p.operation == "batch" for p in result.preemptions)
    assert result.preemptions[0].reason == (
        "preempted for starving operation adhoc: operation batch's cpu usage share 1 was above its "
        "fair share 0.1818 * preemption_satisfaction_threshold 1"
    )
    assert result.waiting["adhoc"].pending_jobs == 19
    # What stops it is said (it was "no node can make room" whatever did; helper-71).
    assert result.waiting["adhoc"].reason == (
        "starving, but no job of another operation in tree physical may be preempted: "
        "losing any would take its operation below its fair share * "
        "preemption_satisfaction_threshold, or non_preemptible_resource_usage_threshold "
        "keeps it")
    assert result.waiting["adhoc"].starving
    assert result.preempted_nodes == ("n1", "n2")


def test_a_victim_never_drops_below_fair_share_times_the_threshold() -> None:
    t = tree(*SEED, preemption_satisfaction_threshold=2)
    ops = batch_holds_everything()
    since = {(ElementKind.OPERATION, "adhoc"): 0.0}
    result = plan(t, SEED_NODES, ops, now=131.0, since=since)
    # 2 * 2/11 = 0.3636...: batch keeps 37 jobs, so at most 63 are preempted
    assert len(result.preemptions) == 63
    assert granted(result) == {"adhoc": 63}
    assert "starving, but no job of another operation" in result.waiting["adhoc"].reason


def test_preemptive_scheduling_backoff_leaves_a_node_alone() -> None:
    t = tree(*SEED)
    nodes = (node("n1", cpu=50, last=130.0), node("n2", cpu=50))
    ops = batch_holds_everything()
    result = plan(t, nodes, ops, now=131.0, since={(ElementKind.OPERATION, "adhoc"): 0.0})
    assert {p.node for p in result.preemptions} == {"n2"}
    assert granted(result) == {"adhoc": 50}
    assert result.waiting["adhoc"].reason == (
        "starving, but the nodes of tree physical where preempting would make room preempted "
        "less than preemptive_scheduling_backoff (5000 ms) ago")


def test_non_preemptible_resource_usage_threshold_protects_small_operations() -> None:
    t = tree(*SEED, non_preemptible_resource_usage_threshold={"cpu": 100})
    result = plan(
        t, SEED_NODES, batch_holds_everything(), now=131.0,
        since={(ElementKind.OPERATION, "adhoc"): 0.0},
    )
    assert result.preemptions == ()


def test_non_preemptible_usage_threshold_keeps_the_oldest_jobs_under_it() -> None:
    """As YTsaurus: a job is kept while the jobs before it use strictly less than the
    threshold, and the newer ones may go. It kept an operation's every job or none, by its
    whole usage (found by helper-71)."""
    t = tree(A, B, fair_share_starvation_timeout=0,
             non_preemptible_resource_usage_threshold={"cpu": 5})
    ops = [op("big", "a", 8, jobs=[("n1", float(i)) for i in range(1, 9)]),
           op("small", "b", 8, start=10)]
    result = plan(t, [node("n1", cpu=8)], ops, now=11.0,
                  since={(ElementKind.OPERATION, "small"): 0.0})
    # Down to its fair share (4) it could lose 4; the oldest 5 are kept.
    assert [p.job for p in result.preemptions] == ["big/7", "big/6", "big/5"]
    assert granted(result) == {"small": 3}


def test_only_the_room_needed_is_taken_on_the_cheapest_node() -> None:
    t = tree(A, B, fair_share_starvation_timeout=0)
    nodes = [node("n1", cpu=4), node("n2", cpu=4)]
    ops = [
        op("big", "a", 8, jobs=[("n1", 1), ("n1", 2), ("n1", 3), ("n1", 4), ("n2", 5), ("n2", 6), ("n2", 7), ("n2", 8)]),
        op("small", "b", 1, start=10, cpu=2),
    ]
    result = plan(t, nodes, ops, now=1.0, since={(ElementKind.OPERATION, "small"): 0.0})
    assert [(p.job, p.node) for p in result.preemptions] == [("big/7", "n2"), ("big/6", "n2")]
    assert [(g.operation, g.node) for g in result.grants] == [("small", "n2")]


def test_a_gang_victim_loses_all_its_jobs_or_none() -> None:
    t = tree(A, B, fair_share_starvation_timeout=0)
    nodes = [node("n1", cpu=4)]
    ops = [
        op("gang", "a", 4, gang=True, jobs=[("n1", 1)] * 4),
        op("solo", "b", 4, start=10),
    ]
    result = plan(t, nodes, ops, now=1.0, since={(ElementKind.OPERATION, "solo"): 0.0})
    # the gang's fair share is 1/2 > 0: losing everything would drop it below -> untouched
    assert result.preemptions == ()


# -- a starving gang preempts: all its pending jobs, or nothing ----------------------------

#: ``hog`` (pool a, nothing pending) runs 1-cpu jobs started at 1..8 (ids hog/0..hog/7) on two
#: 4-cpu nodes; the gang (pool b) asks for 2-cpu jobs. Equal weights: fair share 1/2 each.
HOG_JOBS = [("n1", 1), ("n1", 2), ("n1", 3), ("n1", 4), ("n2", 5), ("n2", 6), ("n2", 7), ("n2", 8)]

GANG_PREEMPTION_CASES = [
    pytest.param(
        1, HOG_JOBS, 2, ["hog/7", "hog/6", "hog/5", "hog/4"], ["n2", "n2"], None,
        id="placed-by-preemption",
    ),
    pytest.param(
        1, HOG_JOBS[:6], 2, ["hog/5", "hog/4"], ["n2", "n2"], None,
        # the first job takes the free room on n2, the second the newest victims (on n2 again)
        id="free-room-first-then-preemption",
    ),
    pytest.param(
        # hog may lose 4 cpu (down to 1/2 = fair share * 1): 6 needed -> nothing preempted
        1, HOG_JOBS, 3, [], [], "but only 2 fit on the nodes of tree physical even by preempting",
        id="cannot-be-placed-whole",
    ),
    pytest.param(
        # threshold 1.5: hog's floor is 3/4, it may lose 2 cpu; the gang needs 4 -> nothing
        1.5, HOG_JOBS, 2, [], [], "but only 1 fit on the nodes of tree physical even by preempting",
        id="never-below-the-threshold-line",
    ),
]


@pytest.mark.parametrize(("threshold", "hog_jobs", "count", "preempted", "nodes_granted", "reason"), GANG_PREEMPTION_CASES)
def test_a_starving_gang_preempts_for_all_its_jobs_or_nothing(
    threshold: float,
    hog_jobs: list[tuple[str, float]],
    count: int,
    preempted: list[str],
    nodes_granted: list[str],
    reason: str | None,
) -> None:
    t = tree(A, B, fair_share_starvation_timeout=0, preemption_satisfaction_threshold=threshold)
    nodes = [node("n1", cpu=4), node("n2", cpu=4)]
    ops = [op("hog", "a", len(hog_jobs), jobs=hog_jobs), op("gang", "b", count, gang=True, start=10, cpu=2)]
    since = {(ElementKind.OPERATION, "gang"): 0.0}
    shares = fair_share(t, nodes, ops, 1.0, since)
    assert shares.operations["gang"].fair_share.total["cpu"] == F(1, 2)
    result = plan_jobs(t, nodes, ops, shares, 1.0)
    assert [p.job for p in result.preemptions] == preempted
    assert all(p.preemptor == "gang" and p.operation == "hog" for p in result.preemptions)
    assert [(g.operation, g.node) for g in result.grants] == [("gang", n) for n in nodes_granted]
    assert result.preempted_nodes == tuple(sorted({p.node for p in result.preemptions}))
    if reason is None:
        assert "gang" not in result.waiting
    else:
        assert result.waiting["gang"].pending_jobs == count
        assert reason in result.waiting["gang"].reason, result.waiting["gang"]
        assert "nothing preempted" in result.waiting["gang"].reason


def test_a_gang_that_is_not_starving_does_not_preempt() -> None:
    t = tree(A, B)  # fair_share_starvation_timeout 30 s
    nodes = [node("n1", cpu=4), node("n2", cpu=4)]
    ops = [op("hog", "a", 8, jobs=HOG_JOBS), op("gang", "b", 2, gang=True, start=10, cpu=2)]
    result = plan(t, nodes, ops, now=1.0, since={(ElementKind.OPERATION, "gang"): 0.0})
    assert result.preemptions == () and result.grants == ()
    assert "gang of 2 jobs: only 0 fit" in result.waiting["gang"].reason


# -- interruption: allocation_preemption_timeout ------------------------------------------


def applied(ops: Sequence[OperationState], result: JobPlan, now: float) -> list[OperationState]:
    """The operations after ``result`` (as the service stores it): preempted and expired jobs
    gone, interrupted ones marked, grants running."""
    gone = {p.job for p in result.preemptions if p.deadline is None} | set(result.expired)
    interrupted = {p.job: p for p in result.preemptions if p.deadline is not None}
    after = []
    for o in ops:
        jobs = tuple(
            replace(j, interrupted_for=interrupted[j.id].preemptor, interrupt_deadline=interrupted[j.id].deadline)
            if j.id in interrupted else j
            for j in o.jobs if j.id not in gone
        )
        new = tuple(RunningJob(f"{o.id}/new-{now}-{i}", g.node, now) for i, g in enumerate(result.grants) if g.operation == o.id)
        after.append(replace(o, jobs=jobs + new))
    return after


def test_an_interruptible_victim_keeps_its_units_until_the_deadline() -> None:
    """batch (interruptible) fills the cluster; adhoc starves at 131 s. Its victims are
    interrupted with deadline 131 + 10 s: until then nobody gets their units and nothing more
    is preempted; at 141 s adhoc gets them."""
    t = tree(*SEED)  # allocation_preemption_timeout: 10000 ms
    batch, adhoc = batch_holds_everything()
    ops = [replace(batch, interruptible=True), adhoc]
    since = {(ElementKind.OPERATION, "adhoc"): 100.0}
    first = plan(t, SEED_NODES, ops, now=131.0, since=since)
    assert len(first.preemptions) == 81 and first.grants == ()
    assert {p.deadline for p in first.preemptions} == {141.0}
    assert first.preemptions[0].reason == (
        "interrupted for starving operation adhoc: operation batch's cpu usage share 1 was above its "
        "fair share 0.1818 * preemption_satisfaction_threshold 1; allocation_preemption_timeout "
        "10000 ms"
    )
    assert first.waiting["adhoc"].reason.startswith(
        "81 wait for interrupted jobs to leave n1, n2 (allocation_preemption_timeout); starving"
    )
    state = applied(ops, first, 131.0)
    before = plan(t, SEED_NODES, state, now=140.9, since=since)
    assert before.preemptions == () and before.grants == () and before.expired == ()
    assert before.waiting["adhoc"].pending_jobs == 100
    at_deadline = plan(t, SEED_NODES, state, now=141.0, since=since)
    assert set(at_deadline.expired) == {p.job for p in first.preemptions}
    assert granted(at_deadline) == {"adhoc": 81}
    assert at_deadline.preemptions == ()  # batch is at its floor now


def test_a_timeout_of_zero_preempts_at_once() -> None:
    t = tree(*SEED, allocation_preemption_timeout=0)
    batch, adhoc = batch_holds_everything()
    result = plan(t, SEED_NODES, [replace(batch, interruptible=True), adhoc], now=131.0,
                  since={(ElementKind.OPERATION, "adhoc"): 100.0})
    assert granted(result) == {"adhoc": 81}
    assert {p.deadline for p in result.preemptions} == {None}


def test_mixed_victims_hold_the_freed_part_too() -> None:
    """On a full 6-cpu node, big needs 2 cpu: the newest victim is interruptible, the next
    one is not. That one is preempted at once, but its cpu is held for big with the other's."""
    t = tree(A, B, pool("c"), fair_share_starvation_timeout=0)
    nodes = [node("n1", cpu=6)]
    ops = [
        op("soft", "a", 3, jobs=[("n1", 4), ("n1", 5), ("n1", 6)]),
        op("hard", "b", 3, jobs=[("n1", 1), ("n1", 2), ("n1", 3)], start=1),
        op("big", "c", 1, start=10, cpu=2),
    ]
    ops[0] = replace(ops[0], interruptible=True)
    since = {(ElementKind.OPERATION, "big"): 0.0}
    first = plan(t, nodes, ops, now=1.0, since=since)
    # fair share 1/3 each: soft and hard may each lose one job, newest first
    assert [(p.job, p.deadline) for p in first.preemptions] == [("soft/2", 11.0), ("hard/2", None)]
    assert first.grants == ()
    # a newcomer finds the freed cpu held for big
    state = [*applied(ops, first, 1.0), op("newcomer", "a", 1, start=5)]
    later = plan(t, nodes, state, now=5.0, since=since)
    assert later.grants == () and later.preemptions == ()
    assert later.waiting["big"].reason == "1 wait for interrupted jobs to leave n1 (allocation_preemption_timeout)"
    done = plan(t, nodes, state, now=11.0, since=since)
    assert done.expired == ("soft/2",) and granted(done) == {"big": 1}


# -- limits: usage above a resource_limits (lowered, or a pool moved) -------------------------

RUNNING_8 = [("n1", float(i)) for i in range(8)]

LIMIT_CASES = [
    pytest.param(
        tree(pool("a", resource_limits={"cpu": 4}), pool("b")),
        [op("x", "a", 8, jobs=RUNNING_8), op("y", "b", 4, start=1)],
        ["x/7", "x/6", "x/5", "x/4"], {"y": 4},
        "preempted to bring pool a within its resource_limits.cpu (usage 8 > limit 4)",
        id="pool-limit-lowered: the newest go, the room goes to others",
    ),
    pytest.param(
        tree(pool("a")), [op("x", "a", 8, jobs=RUNNING_8, limits={"cpu": 6})],
        ["x/7", "x/6"], {},
        "preempted to bring operation x within its resource_limits.cpu (usage 8 > limit 6)",
        id="operation-limit",
    ),
    pytest.param(
        tree(pool("p", resource_limits={"cpu": 5}), pool("a", "p"), pool("b", "p")),
        [op("x", "a", 4, jobs=[("n1", float(i)) for i in (0, 2, 4, 6)]),
         op("y", "b", 4, jobs=[("n1", float(i)) for i in (1, 3, 5, 7)], start=1)],
        ["y/3", "x/3"], {},
        "preempted to bring pool p within its resource_limits.cpu (usage 8 > limit 5)",
        # x and y have a fair share of 2.5 cpu each: their third jobs are not wholly above it
        id="an-ancestor's-limit: newest first across its pools, down to their fair shares",
    ),
    pytest.param(
        tree(pool("a", resource_limits={"cpu": 4}), preemption_satisfaction_threshold=1.5),
        [op("x", "a", 8, jobs=RUNNING_8)], ["x/7", "x/6"], {},
        "preempted to bring pool a within its resource_limits.cpu (usage 8 > limit 4)",
        id="jobs-within-fair-share-times-the-threshold-stay",
    ),
    pytest.param(
        tree(pool("a", resource_limits={"gpu": 1}), preemption_satisfaction_threshold=0.5),
        [op("g", "a", 3, jobs=[("n1", 0.0), ("n1", 1.0), ("n1", 2.0)], cpu=1, gpu=1),
         op("c", "a", 2, jobs=[("n1", 5.0), ("n1", 6.0)], start=1)],
        ["g/2", "g/1"], {},
        "preempted to bring pool a within its resource_limits.gpu (usage 3 > limit 1)",
        # c's jobs are newer and preemptible, but hold no gpu: taking one frees nothing
        id="only-jobs-holding-the-key-over-the-limit",
    ),
    pytest.param(
        tree(pool("a", resource_limits={"cpu": 4}), non_preemptible_resource_usage_threshold={"cpu": 8}),
        [op("x", "a", 8, jobs=RUNNING_8)], [], {}, None,
        id="non-preemptible-usage-stays",
    ),
    pytest.param(
        tree(pool("a", resource_limits={"cpu": 4})),
        [op("x", "a", 8, jobs=RUNNING_8, gang=True)], [], {}, None,
        id="a-gang-keeps-all-its-jobs-above-its-fair-share-floor",
    ),
]


@pytest.mark.parametrize(("t", "ops", "preempted", "grants", "reason"), LIMIT_CASES)
def test_usage_above_a_limit_loses_its_newest_preemptible_jobs(
    t: PoolTree, ops: list[OperationState], preempted: list[str], grants: dict[str, int],
    reason: str | None,
) -> None:
    result = plan(t, [node("n1", cpu=8)], ops, now=20.0)
    assert [p.job for p in result.preemptions] == preempted
    assert {p.preemptor for p in result.preemptions} <= {None}
    assert result.preemptions[0].reason == reason if preempted else reason is None
    assert granted(result) == grants
    assert result.preempted_nodes == ()  # no preemptive scheduling: no backoff


def test_a_job_taken_for_a_limit_and_found_unnecessary_stays() -> None:
    """o3 (a gang, newest) was taken for p2's cpu limit, then o1 for its gpu limit, which
    freed enough cpu too: o3 was granted again at once, its jobs moved for nothing (found by
    ``test_gangs_are_all_or_nothing``, about 2 runs in 100)."""
    t = tree(pool("p0"), pool("p1", "p0"), pool("p2", resource_limits={"cpu": 2, "gpu": 0}))
    nodes = [node("n0", cpu=3, gpu=1), node("n1", cpu=1, gpu=0), node("n2", cpu=2, gpu=0)]
    ops = [op("o0", "p0", 1, jobs=[("n0", 0.0)], cpu=1, gpu=0),
           op("o1", "p2", 1, jobs=[("n0", 0.0)], cpu=2, gpu=1),
           op("o2", "p0", 1, jobs=[("n1", 0.0)], cpu=1, gpu=0),
           op("o3", "p2", 2, jobs=[("n2", 0.0), ("n2", 0.01)], gang=True, cpu=1, gpu=0)]
    result = plan(t, nodes, ops, now=1.0)
    assert [(p.job, p.reason) for p in result.preemptions] == [(
        "o1/0", "preempted to bring pool p2 within its resource_limits.gpu (usage 1 > limit 0)")]
    assert granted(result) == {}


def test_an_interrupted_job_counts_as_gone_for_its_limit() -> None:
    """Interrupted for a limit at 20 s (deadline 30 s): the next pass before the deadline takes
    nothing more, and nothing starts in the pool until the units are free."""
    t = tree(pool("a", resource_limits={"cpu": 4}), pool("b"))
    ops = [replace(op("x", "a", 8, jobs=RUNNING_8), interruptible=True), op("y", "b", 4, start=1)]
    first = plan(t, [node("n1", cpu=8)], ops, now=20.0)
    assert [p.deadline for p in first.preemptions] == [30.0] * 4 and first.grants == ()
    assert first.preemptions[0].reason == (
        "interrupted to bring pool a within its resource_limits.cpu (usage 8 > limit 4); "
        "allocation_preemption_timeout 10000 ms"
    )
    state = applied(ops, first, 20.0)
    before = plan(t, [node("n1", cpu=8)], state, now=29.0)
    assert before.preemptions == () and before.grants == ()
    at_deadline = plan(t, [node("n1", cpu=8)], state, now=30.0)
    assert len(at_deadline.expired) == 4 and granted(at_deadline) == {"y": 4}


# -- properties ------------------------------------------------------------------------------


@st.composite
def worlds(draw: st.DrawFn, interruptions: bool = False) -> tuple[PoolTree, list[NodeState], list[OperationState], float, dict[tuple[ElementKind, str], float]]:
    """Random trees, nodes and operations; with ``interruptions``, interruptible operations,
    jobs being interrupted (deadlines before, at and after ``now`` = 10) and jobs running in
    the operations' other trees."""
    threshold = draw(st.sampled_from([0.5, 1, 1.5]))
    pools = [pool("p0", strong_guarantee_resources={"cpu": draw(st.integers(0, 4))})]
    pools += [pool("p1", "p0", weight=draw(st.integers(1, 3))), pool("p2", resource_limits={"cpu": draw(st.integers(0, 16) | st.integers(0, 4)), **draw(st.just({}) | st.fixed_dictionaries({"gpu": st.integers(0, 2)}))})]
    timeout = draw(st.sampled_from([0, 5000])) if interruptions else 10_000
    t = tree(*pools, preemption_satisfaction_threshold=threshold, fair_share_starvation_timeout=0,
             allocation_preemption_timeout=timeout)
    nodes = [
        node(f"n{i}", last=draw(st.sampled_from([None, 0.0, 9.0])), cpu=draw(st.integers(1, 6)), gpu=draw(st.integers(0, 2)))
        for i in range(draw(st.integers(1, 3)))
    ]
    room = {n.node.name: dict(n.node.resources) for n in nodes}
    ops = []
    for index in range(draw(st.integers(0, 5))):
        job = {"cpu": draw(st.integers(1, 3)), "gpu": draw(st.integers(0, 1))}
        count = draw(st.integers(1, 6))
        gang = draw(st.booleans())
        jobs = []
        for j in range(draw(st.integers(0, count))):
            fits = [name for name, free in room.items() if all(free[k] >= v for k, v in job.items())]
            if not fits:
                break
            where = draw(st.sampled_from(fits))
            for k, v in job.items():
                room[where][k] -= v
            jobs.append((where, float(draw(st.integers(0, 9)) + j / 100)))
        if gang and jobs and len(jobs) != count:
            gang = False
        # limits below the jobs placed: as after a lowered limit
        limits = draw(st.none() | st.fixed_dictionaries({"cpu": st.integers(0, 6)}))
        ops.append(op(f"o{index}", draw(st.sampled_from(["p0", "p1", "p2"])), count, jobs=jobs, gang=gang, start=float(index), limits=limits, **job))
    if interruptions and ops:
        ids = [o.id for o in ops]
        for index, o in enumerate(ops):
            marked = tuple(
                replace(j, interrupted_for=draw(st.sampled_from([*ids, "ended"])),
                        interrupt_deadline=draw(st.sampled_from([5.0, 10.0, 15.0])))
                if draw(st.booleans()) else j
                for j in o.jobs
            ) if not o.gang else o.jobs
            # jobs in the operation's other trees (pool_trees): not pending here
            elsewhere = 0 if o.gang else draw(st.integers(0, o.job_count - len(o.jobs)))
            ops[index] = replace(o, jobs=marked, interruptible=draw(st.booleans()), elsewhere=elsewhere)
    since = {(ElementKind.OPERATION, o.id): 0.0 for o in ops if draw(st.booleans())}
    return t, nodes, ops, 10.0, since


World = tuple[PoolTree, list[NodeState], list[OperationState], float, dict[tuple[ElementKind, str], float]]


def planned(world: World) -> tuple[FairShareResult, JobPlan]:
    t, nodes, ops, now, since = world
    shares = fair_share(t, nodes, ops, now, since)
    return shares, plan_jobs(t, nodes, ops, shares, now)


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_node_capacity_is_never_exceeded(world: World) -> None:
    _, nodes, ops, _, _ = world
    _, result = planned(world)
    assert_nodes_hold_their_jobs(nodes, ops, result, {p.job for p in result.preemptions})


def assert_nodes_hold_their_jobs(
    nodes: Sequence[NodeState], ops: Sequence[OperationState], result: JobPlan, gone: set[str]
) -> None:
    """After the plan (its grants, without the jobs ``gone``), no node holds more than it has."""
    by_id = {o.id: o for o in ops}
    used: dict[str, dict[str, int]] = {n.node.name: {} for n in nodes}
    placements = [(o, j.node) for o in ops for j in o.jobs if j.id not in gone]
    placements += [(by_id[g.operation], g.node) for g in result.grants]
    for o, where in placements:
        for key, amount in o.job_resources.items():
            used[where][key] = used[where].get(key, 0) + amount
    for n in nodes:
        for key, amount in used[n.node.name].items():
            assert amount <= n.node.resources.get(key, 0), (n, used)


@settings(max_examples=500, deadline=None)
@given(worlds(interruptions=True))
def test_jobs_being_interrupted_keep_their_units_until_their_deadline(world: World) -> None:
    """No over-commit with interruptions: an interrupted job holds its units until its
    deadline (then it is freed, once), and is never preempted again meanwhile."""
    t, nodes, ops, now, _ = world
    _, result = planned(world)
    jobs = {j.id: j for o in ops for j in o.jobs}
    assert set(result.expired) == {
        j.id for j in jobs.values() if j.interrupt_deadline is not None and j.interrupt_deadline <= now
    }
    for p in result.preemptions:
        assert jobs[p.job].interrupt_deadline is None
        interruptible = next(o for o in ops if o.id == p.operation).interruptible
        assert (p.deadline is not None) == (interruptible and t.config.allocation_preemption_timeout > 0)
        if p.deadline is not None:
            assert p.deadline == now + t.config.allocation_preemption_timeout / 1000
    gone = {p.job for p in result.preemptions if p.deadline is None} | set(result.expired)
    assert_nodes_hold_their_jobs(nodes, ops, result, gone)
    for o in ops:  # never more live jobs (in all its trees) than the operation asks for
        live = sum(1 for j in o.jobs if j.id not in gone) + result.granted(o.id)
        assert live + o.elsewhere <= o.job_count


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_gangs_are_all_or_nothing(world: World) -> None:
    _, _, ops, _, _ = world
    _, result = planned(world)
    for o in ops:
        if o.gang:
            assert result.granted(o.id) in (0, o.pending_job_count)
            lost = sum(1 for p in result.preemptions if p.operation == o.id)
            assert lost in (0, len(o.jobs))
            # a starving gang preempts only when that places every pending job
            if any(p.preemptor == o.id for p in result.preemptions):
                assert result.granted(o.id) == o.pending_job_count


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_never_preempt_an_operation_at_or_below_fair_share_times_threshold(world: World) -> None:
    t, nodes, ops, _, _ = world
    shares, result = planned(world)
    threshold = t.config.preemption_satisfaction_threshold
    from fairpool.frontends.trees import tree_resources

    total = tree_resources(t.config, (n.node for n in nodes))
    for o in ops:
        lost = sum(1 for p in result.preemptions if p.operation == o.id)
        if not lost:
            continue
        element = shares.operations[o.id]
        resource = element.dominant_resource
        floor = element.fair_share.total[resource] * threshold
        before = F(o.job_resources[resource] * len(o.jobs), total[resource])
        after = F(o.job_resources[resource] * (len(o.jobs) - lost), total[resource])
        assert before > floor and after >= floor


@settings(max_examples=1500, deadline=None)
@given(worlds(interruptions=True))
def test_limits_preempt_only_while_exceeded_and_grants_never_exceed_them(world: World) -> None:
    """Replayed in plan order, each preemption for a limit takes a job while its operation or
    a pool above it is still over a resource_limits (jobs being interrupted count as gone);
    and a grant never leaves its operation or a pool above it over a limit on the keys the
    job uses."""
    t, _, ops, _, _ = world
    _, result = planned(world)
    by_id = {o.id: o for o in ops}
    active = {o.id: sum(1 for j in o.jobs if j.interrupt_deadline is None) for o in ops}

    def scopes(o: OperationState) -> list[tuple[Mapping[str, int], set[str]]]:
        """The operation's limits and its pools', each with the operations under it."""
        found = [(o.resource_limits, {o.id})]
        for name in t.ancestors(o.pool):
            under = {x.id for x in ops if name in t.ancestors(x.pool)}
            found.append((t.effective[name].config.resource_limits, under))
        return found

    def over(limits: Mapping[str, int], under: set[str], counts: Mapping[str, int],
             keys: Mapping[str, int]) -> bool:
        """Whether usage exceeds ``limits`` on a key of ``keys`` (a job's) above 0."""
        usage: dict[str, int] = {}
        for x in ops:
            if x.id in under:
                for key, amount in x.job_resources.items():
                    usage[key] = usage.get(key, 0) + amount * counts[x.id]
        return any(usage.get(key, 0) > limit for key, limit in limits.items() if keys.get(key))

    taken: set[str] = set()
    for p in result.preemptions:
        if p.preemptor is not None:
            continue
        o = by_id[p.operation]
        if not (o.gang and o.id in taken):  # a gang's jobs go together
            # ...on a key the job uses: preempting it brings that key down
            assert any(over(limits, under, active, o.job_resources)
                       for limits, under in scopes(o)), p
        taken.add(o.id)
        active[o.id] -= 1
    gone = {p.job for p in result.preemptions if p.deadline is None} | set(result.expired)
    live = {o.id: sum(1 for j in o.jobs if j.id not in gone) + result.granted(o.id) for o in ops}
    for grant in result.grants:
        o = by_id[grant.operation]
        for limits, under in scopes(o):
            assert not over(limits, under, live, o.job_resources), (grant, limits)


@settings(max_examples=100, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_same_state_same_plan_whatever_the_input_order(world: World, rnd: random.Random) -> None:
    t, nodes, ops, now, since = world
    _, result = planned(world)
    shuffled_ops = [
        OperationState(o.id, o.pool, o.job_resources, o.job_count, o.gang, o.running, o.start_time, o.weight, o.resource_limits, tuple(rnd.sample(o.jobs, len(o.jobs))))
        for o in rnd.sample(ops, len(ops))
    ]
    _, again = planned((t, rnd.sample(nodes, len(nodes)), shuffled_ops, now, since))
    assert again == result


@pytest.mark.parametrize(("key", "amount", "text"), [
    ("memory", 6 * 2**30, "6GiB"), ("memory", 16 * 10**9, "16GB"), ("memory", 2**40, "1TiB"),
    ("memory", 3 * 2**29, "1536MiB"), ("memory", 123_457, "123457"), ("memory", 0, "0"),
    ("cpu", 2**30, str(2**30)),  # only memory is bytes
])
def test_memory_is_said_in_the_unit_it_was_likely_written_in(
    key: str, amount: int, text: str
) -> None:
    assert amount_text(key, amount) == text
    if key == "memory":  # and the trees' front-end reads it back
        assert parse_resources("r", {key: text}) == {key: amount}
