"""Every example of seeds 000-002 (ZenML resource pools), with concrete numbers, on the engine.

Each case builds a world through the real front-end compilation and checks the decision and its
explanation. The same stories run through the CLI in tests/test_cli_seeds.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from fairpool.engine.explain import queue_entries
from fairpool.engine.model import (
    Allocation,
    Charge,
    Check,
    Node,
    Placement,
    Request,
    Rule,
    Snapshot,
)
from fairpool.engine.reconcile import reconcile
from tests.worlds import World, demand, only, outcome

GPU8 = {"gpu": 8}
TEAM = {"reserved": {"gpu": 4}, "limit": {"gpu": 6}}


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], World]
    expect: dict[str, str]
    #: Substring of the first reason of the one rejected or waiting request, if any.
    reason: str | None = None
    check: Check | None = None


def warm_up() -> World:
    return World().pool("training", GPU8).policy("team-ml-orch", "training", 10, **TEAM)


CASES = [
    # -- warm-up: one pool, one policy, only GPUs ------------------------------------------
    Case(
        "preemptible step borrows past reserved",
        lambda: warm_up().wait("r", "team-ml-orch", demand(gpu_count=6)),
        {"r": "allocated:training"},
    ),
    Case(
        "non-preemptible step stays inside reserved",
        lambda: warm_up().wait("r", "team-ml-orch", demand(gpu_count=2), preemptible=False),
        {"r": "allocated:training"},
    ),
    Case(
        "non-preemptible step beyond reserved is rejected at once",
        lambda: warm_up().wait("r", "team-ml-orch", demand(gpu_count=6), preemptible=False),
        {"r": "rejected"},
        "policy team-ml-orch on training: gpu requested 6 > reserved 4 (non-preemptible: reserve more gpu in the policy, or make the request preemptible)",
        Check.RESERVED,
    ),
    # -- CPU, memory and step slots: unbounded vs metered ------------------------------------
    Case(
        "GPU-only pool: CPU and memory are not quota'd, even for non-preemptible work",
        lambda: warm_up().wait(
            "r", "team-ml-orch", demand(gpu_count=1, cpu_count=4, memory="16GiB"),
            preemptible=False,
        ),
        {"r": "allocated:training"},
    ),
    Case(
        "non-preemptible CPU inside policy reserved",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 16000}).policy(
            "orch", "p", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4, "mcpu": 8000},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=2), preemptible=False),
        {"r": "allocated:p"},
    ),
    Case(
        "non-preemptible CPU over policy reserved",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 16000}).policy(
            "orch", "p", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4, "mcpu": 8000},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=8), preemptible=False),
        {"r": "rejected"},
        "mcpu requested 8000 > reserved 4000 (non-preemptible: reserve more mcpu in the policy, or make the request preemptible)",
        Check.RESERVED,
    ),
    Case(
        "preemptible CPU burst up to the policy limit",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 16000}).policy(
            "orch", "p", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4, "mcpu": 8000},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=6)),
        {"r": "allocated:p"},
    ),
    Case(
        "preemptible CPU past the policy limit is rejected",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 16000}).policy(
            "orch", "p", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4, "mcpu": 8000},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=9)),
        {"r": "rejected"},
        "mcpu requested 9000 > limit 8000",
        Check.LIMIT,
    ),
    Case(
        "pool lists mcpu, policy omits it: preemptible uses the pool total as limit",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 8000}).policy(
            "orch", "p", 1, {"gpu": 2}, {"gpu": 4},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=4)),
        {"r": "allocated:p"},
    ),
    Case(
        "pool lists mcpu, policy omits it: preemptible queues while the pool's CPU is busy",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 8000}).policy(
            "orch", "p", 1, {"gpu": 2}, {"gpu": 4},
        ).policy("other", "p", 1).run("busy", "other", "p", {"mcpu": 6000}, preemptible=False)
        .wait("r", "orch", demand(gpu_count=1, cpu_count=4)),
        {"r": "waiting"},
        "pool p: mcpu requested 4000, free 2000 of 8000",
        Check.CAPACITY,
    ),
    Case(
        "pool lists mcpu, policy omits it: non-preemptible is rejected (reserved 0)",
        lambda: World().pool("p", {"gpu": 8, "mcpu": 8000}).policy(
            "orch", "p", 1, {"gpu": 2}, {"gpu": 4},
        ).wait("r", "orch", demand(gpu_count=1, cpu_count=4), preemptible=False),
        {"r": "rejected"},
        "mcpu requested 4000 > reserved 0 (non-preemptible: reserve mcpu in the policy, or make the request preemptible)",
        Check.RESERVED,
    ),
    Case(
        "step_run caps concurrent steps: GPUs free but no slot, so it waits",
        lambda: World().pool("p", {"gpu": 8, "step_run": 2}).policy(
            "orch", "p", 1, {"gpu": 2, "step_run": 1}, {"gpu": 8, "step_run": 2},
        ).run("a", "orch", "p", demand(gpu_count=1), 1.0)
        .run("b", "orch", "p", demand(gpu_count=1), 2.0)
        .wait("r", "orch", demand(gpu_count=1)),
        {"r": "waiting"},
        "step_run requested 1, in use 2 of limit 2",
        Check.LIMIT,
    ),
    Case(
        "step_run pool slots exhausted by another component",
        lambda: World().pool("p", {"gpu": 8, "step_run": 2}).policy("orch", "p", 1)
        .policy("other", "p", 1).run("a", "other", "p", demand(), 1.0, preemptible=False)
        .run("b", "other", "p", demand(), 2.0, preemptible=False)
        .wait("r", "orch", demand(gpu_count=1)),
        {"r": "waiting"},
        "pool p: step_run requested 1, free 0 of 2",
        Check.CAPACITY,
    ),
    # -- custom keys from pool_resources ------------------------------------------------------
    Case(
        "custom key fully configured",
        lambda: World().pool("p", {"gpu": 4, "tensorrt_sessions": 2}).policy(
            "orch", "p", 1, {"gpu": 1, "tensorrt_sessions": 1}, {"gpu": 2, "tensorrt_sessions": 2},
        ).wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1}),
               preemptible=False),
        {"r": "allocated:p"},
    ),
    Case(
        "custom key on pool but missing from policy: non-preemptible rejected",
        lambda: World().pool("p", {"gpu": 4, "tensorrt_sessions": 2}).policy(
            "orch", "p", 1, {"gpu": 1}, {"gpu": 2},
        ).wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1}),
               preemptible=False),
        {"r": "rejected"},
        "tensorrt_sessions requested 1 > reserved 0 (non-preemptible: reserve tensorrt_sessions in the policy, or make the request preemptible)",
        Check.RESERVED,
    ),
    Case(
        "custom key on pool but missing from policy: preemptible may borrow it",
        lambda: World().pool("p", {"gpu": 4, "tensorrt_sessions": 2}).policy(
            "orch", "p", 1, {"gpu": 1}, {"gpu": 2},
        ).wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1})),
        {"r": "allocated:p"},
    ),
    Case(
        "custom key the pool does not list is zero capacity",
        lambda: World().pool("p", {"gpu": 4}).policy("orch", "p", 1, {"gpu": 1}, {"gpu": 2})
        .wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1})),
        {"r": "rejected"},
        "pool p: has no tensorrt_sessions (zero capacity), requested 1",
        Check.CAPACITY,
    ),
    Case(
        "non-preemptible on a key the pool does not list: the pool lacks it, whatever reserved",
        lambda: World().pool("p", {"gpu": 4}).policy("orch", "p", 1, {"gpu": 1}, {"gpu": 2})
        .wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1}),
              preemptible=False),
        {"r": "rejected"},
        "pool p: has no tensorrt_sessions (zero capacity), requested 1",
        Check.CAPACITY,
    ),
    # -- hard rejections -------------------------------------------------------------------
    Case(
        "request exceeds pool capacity",
        lambda: World().pool("p", GPU8).policy("orch", "p", 1, {"gpu": 4}, {"gpu": 8})
        .wait("r", "orch", demand(gpu_count=10)),
        {"r": "rejected"},
        "pool p: gpu requested 10 > capacity 8",
        Check.CAPACITY,
    ),
    Case(
        "request exceeds policy limit although the pool could fit",
        lambda: World().pool("p", GPU8).policy("orch", "p", 1, {"gpu": 2}, {"gpu": 4})
        .wait("r", "orch", demand(gpu_count=6)),
        {"r": "rejected"},
        "policy orch on p: gpu requested 6 > limit 4",
        Check.LIMIT,
    ),
    Case(
        "a component with no policy is rejected",
        lambda: World().pool("p", GPU8).wait("r", "nobody", demand(gpu_count=1)),
        {"r": "rejected"},
    ),
    # -- contention: queues and priorities --------------------------------------------------
    Case(
        "same priority: a waiter within its reserved share goes before an older borrower",
        lambda: World().pool("p", {"gpu": 4})
        .policy("red", "p", 5, {"gpu": 2}, {"gpu": 4}).policy("blue", "p", 5, {"gpu": 2}, {"gpu": 4})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0, preemptible=False)
        .wait("red-2", "red", demand(gpu_count=2), at=2.0)
        .wait("blue-1", "blue", demand(gpu_count=2), at=3.0),
        {"blue-1": "allocated:p", "red-2": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    # A request asks for one step_run: where the pool meters it, a policy that reserves none
    # makes each of its requests a borrower, not a request within its share. Reclaim is for
    # the latter: blue-1, served after red-2 as a borrower, reclaimed red-1 (red-2, granted
    # in the same pass, was no victim): running work evicted, and red-2 started in its stead.
    Case(
        "where the pool meters step_run, reserving none makes a request a borrower",
        lambda: World().pool("p", {"gpu": 4, "step_run": 32})
        .policy("red", "p", 5, {"gpu": 2}, {"gpu": 4}).policy("blue", "p", 5, {"gpu": 2}, {"gpu": 4})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0)
        .wait("red-2", "red", demand(gpu_count=2), at=2.0)
        .wait("blue-1", "blue", demand(gpu_count=2), at=3.0),
        {"red-2": "allocated:p", "blue-1": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    Case(
        "where the pool meters step_run, reserving some makes a request within its share",
        lambda: World().pool("p", {"gpu": 4, "step_run": 32})
        .policy("red", "p", 5, {"gpu": 2, "step_run": 16})
        .policy("blue", "p", 5, {"gpu": 2, "step_run": 16})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0)
        .wait("red-2", "red", demand(gpu_count=2), at=2.0)
        .wait("blue-1", "blue", demand(gpu_count=2), at=3.0),
        {"blue-1": "allocated:p", "red-2": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    Case(
        "no reclaim by a request that must borrow another key the pool meters",
        lambda: World().pool("p", {"gpu": 4, "mcpu": 8000})
        .policy("red", "p", 5, {"gpu": 2, "mcpu": 4000}).policy("blue", "p", 5, {"gpu": 2})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0)
        .wait("red-2", "red", demand(gpu_count=2), at=2.0)
        .wait("blue-1", "blue", demand(gpu_count=2, cpu_count=1), at=3.0),
        {"red-2": "allocated:p", "blue-1": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    Case(
        "a policy without a limit is at the pool total: the wait says so, not that the pool is full",
        lambda: World().pool("p", {"gpu": 4}).policy("w", "p", 1).policy("a", "p", 1)
        .run("w-1", "w", "p", demand(gpu_count=2), 1.0)
        .wait("w-2", "w", demand(gpu_count=3), at=2.0),
        {"w-2": "waiting"},
        "policy w on p: gpu requested 3, in use 2 of limit 4",
        Check.LIMIT,
    ),
    Case(
        "same priority, same share status: oldest first",
        lambda: World().pool("p", {"gpu": 2})
        .policy("red", "p", 5, {"gpu": 2}, {"gpu": 2}).policy("blue", "p", 5)
        .wait("blue-new", "blue", demand(gpu_count=2), at=5.0)
        .wait("blue-old", "blue", demand(gpu_count=2), at=4.0),
        {"blue-old": "allocated:p", "blue-new": "waiting"},
        "policy blue on p: gpu requested 2, in use 2 of limit 2",
        Check.LIMIT,
    ),
    Case(
        "same priority, no reserved headroom: nobody is preempted",
        lambda: World().pool("p", {"gpu": 4})
        .policy("red", "p", 5, {"gpu": 2}, {"gpu": 4}).policy("blue", "p", 5, {"gpu": 2}, {"gpu": 4})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0)
        .run("blue-1", "blue", "p", demand(gpu_count=2), 2.0)
        .wait("red-2", "red", demand(gpu_count=2), at=3.0),
        {"red-2": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    Case(
        "reclaim: a waiter with unused reserved evicts a same-priority borrower",
        lambda: World().pool("p", {"gpu": 4})
        .policy("red", "p", 5, {"gpu": 2}, {"gpu": 4}).policy("blue", "p", 5, {"gpu": 2}, {"gpu": 4})
        .run("red-1", "red", "p", demand(gpu_count=2), 1.0)
        .run("red-2", "red", "p", demand(gpu_count=2), 2.0)
        .wait("blue-1", "blue", demand(gpu_count=2), at=3.0),
        {"blue-1": "allocated:p", "red-2": "preempted:reclaim"},
    ),
    Case(
        "reclaim ignores priority: a low-priority waiter evicts a higher-priority borrower",
        lambda: World().pool("p", {"gpu": 4})
        .policy("sandbox", "p", 100, {"gpu": 0}, {"gpu": 4})
        .policy("team", "p", 1, {"gpu": 2}, {"gpu": 4})
        .run("s-1", "sandbox", "p", demand(gpu_count=2), 1.0)
        .run("s-2", "sandbox", "p", demand(gpu_count=2), 2.0)
        .wait("t-1", "team", demand(gpu_count=1), at=3.0),
        {"t-1": "allocated:p", "s-2": "preempted:reclaim"},
    ),
    Case(
        "higher priority wins: the lower-priority newest run is the one victim",
        lambda: World().pool("p", GPU8)
        .policy("sandbox", "p", 10, {"gpu": 0}, {"gpu": 8})
        .policy("prod", "p", 100, {"gpu": 0}, {"gpu": 8})
        .run("s-1", "sandbox", "p", demand(gpu_count=2), 1.0)
        .run("s-2", "sandbox", "p", demand(gpu_count=2), 2.0)
        .run("s-3", "sandbox", "p", demand(gpu_count=2), 3.0)
        .wait("prod-1", "prod", demand(gpu_count=4), at=4.0),
        {"prod-1": "allocated:p", "s-3": "preempted:priority"},
    ),
    Case(
        "victims: greedy newest first, then a victim that turns out unnecessary is spared",
        lambda: World().pool("p", GPU8)
        .policy("sandbox", "p", 10, {"gpu": 0}, {"gpu": 8})
        .policy("prod", "p", 100, {"gpu": 2}, {"gpu": 8})
        .run("np", "prod", "p", demand(gpu_count=2), 0.5, preemptible=False)
        .run("big", "sandbox", "p", demand(gpu_count=4), 1.0)
        .run("small", "sandbox", "p", demand(gpu_count=1), 3.0)
        .wait("prod-1", "prod", demand(gpu_count=4), at=4.0),
        {"prod-1": "allocated:p", "big": "preempted:priority"},
    ),
    Case(
        "victims: same priority, most recently allocated first",
        lambda: World().pool("p", GPU8)
        .policy("sandbox", "p", 10, {"gpu": 0}, {"gpu": 8})
        .policy("prod", "p", 100, {"gpu": 0}, {"gpu": 8})
        .run("s-1", "sandbox", "p", demand(gpu_count=4), 1.0)
        .run("s-2", "sandbox", "p", demand(gpu_count=2), 2.0)
        .run("s-3", "sandbox", "p", demand(gpu_count=2), 3.0)
        .wait("prod-1", "prod", demand(gpu_count=4), at=4.0),
        {"prod-1": "allocated:p", "s-2": "preempted:priority", "s-3": "preempted:priority"},
    ),
    Case(
        "victims: lowest priority first, whatever the allocation time",
        lambda: World().pool("p", {"gpu": 4})
        .policy("low", "p", 1, {}, {}).policy("mid", "p", 5, {}, {})
        .policy("prod", "p", 100, {}, {})
        .run("mid-1", "mid", "p", demand(gpu_count=2), 1.0)
        .run("low-1", "low", "p", demand(gpu_count=2), 0.5)
        .wait("prod-1", "prod", demand(gpu_count=2), at=4.0),
        {"prod-1": "allocated:p", "low-1": "preempted:priority"},
    ),
    Case(
        "non-preemptible runs are never victims",
        lambda: World().pool("p", {"gpu": 4})
        .policy("sandbox", "p", 1, {"gpu": 4}, {"gpu": 4}).policy("prod", "p", 100, {}, {})
        .run("s-1", "sandbox", "p", demand(gpu_count=4), 1.0, preemptible=False)
        .wait("prod-1", "prod", demand(gpu_count=2), at=4.0),
        {"prod-1": "waiting"},
        "pool p: gpu requested 2, free 0 of 4",
        Check.CAPACITY,
    ),
    Case(
        "a limit never picks victims",
        lambda: World().pool("p", GPU8)
        .policy("sandbox", "p", 1, {}, {}).policy("prod", "p", 100, {}, {"gpu": 4})
        .run("s-1", "sandbox", "p", demand(gpu_count=4), 1.0)
        .run("prod-1", "prod", "p", demand(gpu_count=4), 2.0)
        .wait("prod-2", "prod", demand(gpu_count=2), at=4.0),
        {"prod-2": "waiting"},
        "policy prod on p: gpu requested 2, in use 4 of limit 4",
        Check.LIMIT,
    ),
    Case(
        "production non-preemptible waits on its reserved only, never on sandbox's burst",
        lambda: World().pool("p", GPU8)
        .policy("sandbox", "p", 10, {"gpu": 2}, {"gpu": 8})
        .policy("prod", "p", 100, {"gpu": 2}, {"gpu": 8})
        .run("s-1", "sandbox", "p", demand(gpu_count=4), 1.0)
        .run("prod-np", "prod", "p", demand(gpu_count=2), 2.0, preemptible=False)
        .wait("prod-2", "prod", demand(gpu_count=2), at=3.0, preemptible=False),
        {"prod-2": "waiting"},
        "policy prod on p: gpu requested 2, non-preemptible use 2 of reserved 2",
        Check.RESERVED_IN_USE,
    ),
    Case(
        "production non-preemptible with free reserved may preempt the lower-priority burst",
        lambda: World().pool("p", {"gpu": 4})
        .policy("sandbox", "p", 10, {"gpu": 0}, {"gpu": 4})
        .policy("prod", "p", 100, {"gpu": 2}, {"gpu": 4})
        .run("s-1", "sandbox", "p", demand(gpu_count=4), 1.0)
        .wait("prod-np", "prod", demand(gpu_count=2), at=3.0, preemptible=False),
        {"prod-np": "allocated:p", "s-1": "preempted:priority"},
    ),
    # -- multiple pools and multi-key requests ------------------------------------------------
    Case(
        "two pools on one orchestrator: the higher-priority policy's pool wins",
        lambda: World().pool("eu-west", {"gpu": 4}).pool("eu-north", {"gpu": 4})
        .policy("orch", "eu-west", 10, {"gpu": 2}, {"gpu": 4})
        .policy("orch", "eu-north", 5, {"gpu": 2}, {"gpu": 4})
        .wait("r", "orch", demand(gpu_count=2)),
        {"r": "allocated:eu-west"},
    ),
    Case(
        "two pools: the fallback pool wins when the primary is full, nobody preempted",
        lambda: World().pool("eu-west", {"gpu": 4}).pool("eu-north", {"gpu": 4})
        .policy("orch", "eu-west", 10, {"gpu": 2}, {"gpu": 4})
        .policy("orch", "eu-north", 5, {"gpu": 2}, {"gpu": 4})
        .policy("other", "eu-west", 1, {}, {})
        .run("o-1", "other", "eu-west", demand(gpu_count=4), 1.0)
        .wait("r", "orch", demand(gpu_count=2)),
        {"r": "allocated:eu-north"},
    ),
    Case(
        "one step must satisfy every key in one pool: a GPU-only pool is not eligible",
        lambda: World().pool("a", {"gpu": 4}).pool("b", {"gpu": 4, "tensorrt_sessions": 2})
        .policy("orch", "a", 10, {"gpu": 2}, {"gpu": 4})
        .policy("orch", "b", 5, {"gpu": 2, "tensorrt_sessions": 1}, {"gpu": 4})
        .wait("r", "orch", demand(gpu_count=1, pool_resources={"tensorrt_sessions": 1})),
        {"r": "allocated:b"},
    ),
    Case(
        "metered primary cannot take a big non-preemptible CPU/RAM ask; the GPU-only path can",
        lambda: World().pool("pool-a", {"gpu": 4})
        .pool("pool-b", {"gpu": 4, "mcpu": 16000, "memory_mb": 65536})
        .policy("orch", "pool-a", 5, {"gpu": 2}, {"gpu": 4})
        .policy("orch", "pool-b", 10, {"gpu": 2, "mcpu": 4000, "memory_mb": 8192},
                {"gpu": 4, "mcpu": 16000, "memory_mb": 65536})
        .wait("r", "orch", demand(gpu_count=1, cpu_count=8, memory="32GiB"), preemptible=False),
        {"r": "allocated:pool-a"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_seed_scenario(case: Case) -> None:
    world = case.build()
    snapshot = world.snapshot()
    plan = world.plan()
    assert outcome(plan, snapshot) == case.expect
    if case.reason is not None:
        reasons = [r.reasons[0] for r in plan.rejections] + [
            entries[0].reason for entries in queue_entries(plan).values()
        ]
        reason = only(reasons)
        assert case.reason in reason.message  # type: ignore[attr-defined]
        assert reason.check is case.check  # type: ignore[attr-defined]


def test_multi_pool_request_waiting_in_both_queues_has_a_position_in_each() -> None:
    world = (
        World().pool("a", {"gpu": 2}).pool("b", {"gpu": 2})
        .policy("orch", "a", 10).policy("orch", "b", 5).policy("other", "a").policy("other", "b")
        .run("x", "other", "a", demand(gpu_count=2), preemptible=False)
        .run("y", "other", "b", demand(gpu_count=2), preemptible=False)
        .wait("r", "orch", demand(gpu_count=1))
    )
    entries = only(list(queue_entries(world.plan()).values()))
    assert [(e.queue, e.position) for e in entries] == [("pool a", 1), ("pool b", 1)]  # type: ignore[attr-defined]


def test_ineligible_pool_is_explained_with_position_zero() -> None:
    world = (
        World().pool("a", {"gpu": 4}).pool("b", {"gpu": 1, "tpu": 1})
        .policy("orch", "a", 10).policy("orch", "b", 5).policy("other", "b")
        .run("x", "other", "b", {"tpu": 1}, preemptible=False)
        .wait("r", "orch", demand(gpu_count=1, pool_resources={"tpu": 1}))
    )
    entries = {e.queue: e for e in only(list(queue_entries(world.plan()).values()))}  # type: ignore[attr-defined]
    assert entries["pool a"].position == 0
    assert "has no tpu" in entries["pool a"].reason.message
    assert entries["pool b"].position == 1


def test_preemption_names_preemptor_and_rule() -> None:
    world = (
        World().pool("p", {"gpu": 2}).policy("low", "p", 1).policy("high", "p", 9)
        .run("victim", "low", "p", demand(gpu_count=2), 1.0)
        .wait("boss", "high", demand(gpu_count=2), 2.0)
    )
    preemption = only(world.plan().preemptions)
    assert preemption.preemptor_id == "boss"  # type: ignore[attr-defined]
    assert preemption.rule is Rule.PRIORITY  # type: ignore[attr-defined]
    assert "preempted by request boss on pool p (priority 9 > 1)" == preemption.message  # type: ignore[attr-defined]


def test_small_requests_pass_a_blocked_one_until_it_has_waited_too_long() -> None:
    def world(now: float) -> World:
        w = (
            World().pool("p", {"gpu": 4}).policy("orch", "p").policy("other", "p")
            .run("x", "other", "p", demand(gpu_count=2), preemptible=False)
            .wait("big", "orch", demand(gpu_count=4), at=0.0)
            .wait("small", "orch", demand(gpu_count=1), at=1.0)
        )
        w.now = now
        return w

    early = world(now=10.0)
    assert outcome(early.plan(), early.snapshot()) == {"big": "waiting", "small": "allocated:p"}
    late = world(now=10_000.0)
    plan = late.plan()
    assert outcome(plan, late.snapshot()) == {"big": "waiting", "small": "waiting"}
    holding = {r: entries[0] for r, entries in queue_entries(plan).items()}
    assert holding["big"].holding
    # Free as in unused (it said "free 0 of 4, 4 held": the holder's demand, not what was free).
    assert holding["small"].reason.message == (
        "pool p: gpu requested 1, free 2 of 4, held for an older request")


def test_guaranteed_waiter_is_served_before_a_higher_priority_borrower() -> None:
    # Reclaim would let the team evict the borrower anyway, so the team is served first and
    # nobody is granted units only to lose them.
    world = (
        World().pool("p", {"gpu": 2})
        .policy("burst", "p", 100, {"gpu": 0}, {"gpu": 2})
        .policy("team", "p", 1, {"gpu": 2}, {"gpu": 2})
        .wait("burst-1", "burst", demand(gpu_count=2), at=1.0)
        .wait("team-1", "team", demand(gpu_count=2), at=2.0)
    )
    plan = world.plan()
    assert outcome(plan, world.snapshot()) == {"team-1": "allocated:p", "burst-1": "waiting"}
    assert plan.preemptions == ()


def test_higher_priority_borrower_cannot_evict_units_within_their_owners_reserved() -> None:
    world = (
        World().pool("p", {"gpu": 4})
        .policy("team", "p", 1, {"gpu": 2}, {"gpu": 4})
        .policy("burst", "p", 100, {"gpu": 0}, {"gpu": 4})
        .run("team-1", "team", "p", demand(gpu_count=2), 1.0)
        .run("team-2", "team", "p", demand(gpu_count=2), 2.0)
        .wait("burst-1", "burst", demand(gpu_count=4), at=3.0)
    )
    plan = world.plan()
    # team-2 borrows and may go; team-1 sits within team's reserved 2 and stays, so 4 GPUs
    # cannot be freed and nobody is preempted for nothing.
    assert plan.preemptions == ()
    assert outcome(plan, world.snapshot()) == {"burst-1": "waiting"}


def test_waiting_reason_is_the_final_state_of_the_pass() -> None:
    # "big" is considered first (oldest) when 1 GPU is free; "small" then takes that GPU. The
    # explanation says what big waits for now: no GPU free, not the 1 seen earlier.
    world = (
        World().pool("p", {"gpu": 3}).policy("orch", "p").policy("other", "p")
        .run("x", "other", "p", demand(gpu_count=2), preemptible=False)
        .wait("big", "orch", demand(gpu_count=2), at=1.0)
        .wait("small", "orch", demand(gpu_count=1), at=2.0)
    )
    world.now = 100.0  # nobody has waited long enough to hold units
    plan = world.plan()
    assert outcome(plan, world.snapshot()) == {"big": "waiting", "small": "allocated:p"}
    assert queue_entries(plan)["big"][0].reason.message == "pool p: gpu requested 2, free 0 of 3"


def test_identical_waiters_get_consecutive_positions_in_time_order() -> None:
    world = World().pool("p", {"gpu": 1}).policy("a", "p").policy("b", "p")
    world.run("x", "a", "p", demand(gpu_count=1), preemptible=False)
    for i in range(6):
        world.wait(f"{'ab'[i % 2]}-{i}", "ab"[i % 2], demand(gpu_count=1), at=float(10 - i))
    entries = queue_entries(world.plan())
    order = sorted(entries, key=lambda r: entries[r][0].position)
    assert order == ["b-5", "a-4", "b-3", "a-2", "b-1", "a-0"]
    assert [entries[r][0].position for r in order] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("now", [10.0, 10_000.0], ids=["parked", "holding units"])
def test_a_waiter_ahead_of_a_preemptor_gets_the_units_the_preemption_freed_beyond_its_need(
    now: float,
) -> None:
    # x (priority 50) needs tpu, which v holds within its reserved: x cannot preempt v and
    # waits (parked; or, waiting past backfill_after, holding units). y (priority 20) preempts
    # v for a GPU, freeing v's tpu too: x, ahead of y in the queue, fits now and is served in
    # the same pass (it was left waiting, in no queue, until the next pass).
    world = (
        World().pool("P", {"gpu": 4, "tpu": 2})
        .policy("v", "P", 1, {"tpu": 2})
        .policy("x", "P", 50).policy("y", "P", 20)
        .run("v-1", "v", "P", {"gpu": 4, "tpu": 2}, 1.0)
        .wait("x-1", "x", {"tpu": 1}, at=2.0)
        .wait("y-1", "y", {"gpu": 1}, at=3.0)
    )
    world.now = now
    plan = world.plan()
    assert outcome(plan, world.snapshot()) == {
        "v-1": "preempted:priority", "x-1": "allocated:P", "y-1": "allocated:P"}
    assert plan.waiting == ()


def test_the_next_waiter_holds_the_pool_the_first_one_passed_on() -> None:
    # r-1 and r-2 (2 GPUs each) have waited past backfill_after. a has 1 GPU free and nobody
    # to preempt; b has 2. r-1 takes b; r-2, first in a's queue now, holds a's free GPU, so
    # the younger s does not take it (it did: r-2 was set aside behind r-1 on a). On b it
    # holds nothing: hi is at its limit there (the pool total), and no unit frees that.
    world = (
        World().pool("a", {"gpu": 3}).pool("b", {"gpu": 2})
        .policy("hi", "a", 10).policy("hi", "b", 10).policy("x", "a", 20).policy("s", "a", 1)
        .run("x-1", "x", "a", demand(gpu_count=2), 1.0)
        .wait("r-1", "hi", demand(gpu_count=2), at=2.0)
        .wait("r-2", "hi", demand(gpu_count=2), at=3.0)
        .wait("s-1", "s", demand(gpu_count=1), at=4.0)
    )
    world.now = 10_000.0
    plan = world.plan()
    assert outcome(plan, world.snapshot()) == {
        "r-1": "allocated:b", "r-2": "waiting", "s-1": "waiting"}
    entries = queue_entries(plan)
    assert [(e.queue, e.holding) for e in entries["r-2"]] == [("pool a", True), ("pool b", False)]
    assert "held for an older request" in entries["s-1"][0].reason.message


def test_a_waiter_ahead_of_the_holder_is_not_told_its_units_are_held() -> None:
    # lo-1 has waited past backfill_after and holds what frees on p; two-1 (priority 2) is
    # ahead of it in the queue, and gets a freed GPU first: it was told the units were
    # "held for an older request" (helper-73). lo-2, behind the holder, is told so.
    world = (
        World().pool("p", {"gpu": 4})
        .policy("hi", "p", 100).policy("lo", "p", 1).policy("two", "p", 2)
        .run("hi-1", "hi", "p", demand(gpu_count=4), 1.0)
        .wait("lo-1", "lo", demand(gpu_count=2), at=2.0)
        .wait("two-1", "two", demand(gpu_count=1), at=9_900.0)
        .wait("lo-2", "lo", demand(gpu_count=1), at=9_950.0)
    )
    world.now = 10_000.0
    entries = queue_entries(world.plan())
    assert [(e.position, e.holding) for e in entries["two-1"] + entries["lo-1"]] == [
        (1, False), (2, True)]
    assert entries["two-1"][0].reason.message == "pool p: gpu requested 1, free 0 of 4"
    # None free: what frees is held (it said "free 0 of 4, held for an older request" as if
    # some were, helper-89).
    assert entries["lo-2"][0].reason.message == (
        "pool p: gpu requested 1, free 0 of 4; the next freed are held for an older request")


def test_a_waiter_with_reserved_units_unused_is_told_why_it_does_not_reclaim_them() -> None:
    # The pool meters step_run, which team does not reserve: it is not within its share, so
    # it reclaims nothing from the borrower (docs/semantics.md); it waited with its reserved
    # GPUs idle and nothing said why (helper-89).
    def world(reserved: dict[str, int]) -> World:
        return (
            World().pool("p", {"gpu": 4, "step_run": 8})
            .policy("team", "p", 10, reserved).policy("burst", "p", 10)
            .run("burst-1", "burst", "p", demand(gpu_count=4), 1.0)
            .wait("team-1", "team", demand(gpu_count=1), at=2.0)
        )

    unreserved = world({"gpu": 2})
    entries = queue_entries(unreserved.plan())
    assert entries["team-1"][0].reason.message == (
        "pool p: gpu requested 1, free 0 of 4 (policy team on p does not reclaim its unused "
        "reserved gpu: it reserves no step_run)")
    used_up = world({"gpu": 2, "step_run": 1}).run("team-0", "team", "p", {"step_run": 1}, 1.5)
    assert queue_entries(used_up.plan())["team-1"][0].reason.message == (
        "pool p: gpu requested 1, free 0 of 4 (policy team on p does not reclaim its unused "
        "reserved gpu: its reserved step_run is in use (1 of 1))")
    reserved = world({"gpu": 2, "step_run": 2})
    assert outcome(reserved.plan(), reserved.snapshot()) == {
        "burst-1": "preempted:reclaim", "team-1": "allocated:p"}


def test_a_waiter_short_of_several_keys_is_told_each() -> None:
    # A team that freed the GPU named found it waited on, for CPU (helper-89).
    world = (
        World().pool("p", {"gpu": 4, "mcpu": 8000}).policy("a", "p").policy("b", "p")
        .run("a-1", "a", "p", {"gpu": 4, "mcpu": 8000}, 1.0)
        .wait("b-1", "b", {"gpu": 1, "mcpu": 1000}, at=2.0)
    )
    reason = queue_entries(world.plan())["b-1"][0].reason
    assert reason.message == "pool p: gpu requested 1, free 0 of 4 (also short of mcpu)"
    assert reason.also_short == ("mcpu",)


def test_a_capacity_lowered_below_what_is_held_says_how_far() -> None:
    world = (
        World().pool("p", {"gpu": 2}).policy("a", "p", 0, None, {"gpu": 8})
        .run("a-1", "a", "p", demand(gpu_count=4), 1.0)
        .wait("a-2", "a", demand(gpu_count=1), at=2.0)
    )
    # It said "free 0 of 2" (helper-89).
    assert queue_entries(world.plan())["a-2"][0].reason.message == (
        "pool p: gpu requested 1, in use 4 of 2")


@dataclass(frozen=True)
class OnePass:
    """A pass that left work to the next one with nothing new; now it does it itself."""

    name: str
    build: Callable[[], World]
    now: float
    expect: dict[str, str]


def passed_pool(now: float) -> OnePass:
    # r-1 could preempt x in pool a but does not: pool b has room, and it takes it. r-2, the
    # same request, finds b full: it preempts x. It waited: as if a were blocked for it too,
    # or, past backfill_after, because r-1 held a's units for itself while it took b's.
    return OnePass(
        f"the next of identical requests preempts on the pool the first passed on, now={now:g}",
        lambda: World().pool("a", {"gpu": 1}).pool("b", {"gpu": 1})
        .policy("orch", "a", 10).policy("orch", "b", 10).policy("low", "a", 1)
        .run("x", "low", "a", demand(gpu_count=1), 1.0)
        .wait("r-1", "orch", demand(gpu_count=1), at=2.0)
        .wait("r-2", "orch", demand(gpu_count=1), at=3.0),
        now, {"x": "preempted:priority", "r-1": "allocated:b", "r-2": "allocated:a"},
    )


ONE_PASS = [
    passed_pool(10.0),
    passed_pool(10_000.0),
    # a ranks before b (priority 10 > 5), so hi-1 and hi-2 are both tried on a first, while b
    # has room. hi-1 then takes b; hi-2, finding b full, goes back to a and preempts.
    OnePass(
        "a request back on the pool it passed on, the other one taken meanwhile, preempts",
        lambda: World().pool("a", {"gpu": 2}).pool("b", {"gpu": 1})
        .policy("hi", "a", 10).policy("hi", "b", 5).policy("lo", "a", 1)
        .run("lo-1", "lo", "a", demand(gpu_count=1), 1.0)
        .run("lo-2", "lo", "a", demand(gpu_count=1), 2.0)
        .wait("hi-1", "hi", demand(gpu_count=1), at=3.0)
        .wait("hi-2", "hi", demand(gpu_count=1), at=4.0),
        100.0, {"lo-2": "preempted:priority", "hi-1": "allocated:b", "hi-2": "allocated:a"},
    ),
    # burst-2 (priority 1) comes first but cannot preempt team-1: team uses 2 of its reserved
    # 2. team-2, of lower priority, then takes the last GPU: team borrows now, so team-1 may
    # go, and burst-2 gets its turn again.
    OnePass(
        "a grant that makes a team borrow lets a waiter tried before it preempt the team",
        lambda: World().pool("p", {"gpu": 4})
        .policy("burst", "p", 1, {"gpu": 1}, {"gpu": 3})
        .policy("team", "p", 0, {"gpu": 2}, {"gpu": 3})
        .run("team-1", "team", "p", demand(gpu_count=2), 1.0)
        .run("burst-1", "burst", "p", demand(gpu_count=1), 2.0, preemptible=False)
        .wait("burst-2", "burst", demand(gpu_count=2), at=3.0)
        .wait("team-2", "team", demand(gpu_count=1), at=4.0, preemptible=False),
        100.0,
        {"team-1": "preempted:priority", "burst-2": "allocated:p", "team-2": "allocated:p"},
    ),
    # s-1 preempts x-1 (team borrowed 2 of its reserved 1): w-1, a borrower until then, is
    # within team's reserved now and goes before b-1, who must borrow (b-1 got the last GPU).
    OnePass(
        "a waiter a preemption brings within its reserved goes before the borrowers",
        lambda: World().pool("p", {"gpu": 4})
        .policy("big", "p", 5, {"gpu": 3}, {"gpu": 3})
        .policy("team", "p", 1, {"gpu": 1})
        .policy("burst", "p", 1)
        .run("x-1", "team", "p", demand(gpu_count=2), 1.0)
        .wait("b-1", "burst", demand(gpu_count=1), at=2.0)
        .wait("w-1", "team", demand(gpu_count=1), at=3.0)
        .wait("s-1", "big", demand(gpu_count=3), at=4.0),
        100.0,
        {"x-1": "preempted:priority", "s-1": "allocated:p", "w-1": "allocated:p",
         "b-1": "waiting"},
    ),
    # r-1 and r-2 are first in b's queue (within reserved) but pass on b: a has room. h-1,
    # after them, holds b's units. r-1 takes a; r-2, back on b, reclaims v-1 as it would
    # have in turn, not stopped by h-1's hold.
    OnePass(
        "a request tried again out of turn does not see the holds taken after its turn",
        lambda: World().pool("a", {"gpu": 1}).pool("b", {"gpu": 3})
        .policy("r", "a", 1).policy("r", "b", 1, {"gpu": 2})
        .policy("v", "b", 5)
        .run("v-1", "v", "b", demand(gpu_count=3), 1.0)
        .wait("h-1", "v", demand(gpu_count=3), at=2.0)
        .wait("r-1", "r", demand(gpu_count=1), at=3.0)
        .wait("r-2", "r", demand(gpu_count=1), at=4.0),
        10_000.0,
        {"v-1": "preempted:reclaim", "r-1": "allocated:a", "r-2": "allocated:b",
         "h-1": "waiting"},
    ),
]


@pytest.mark.parametrize("case", ONE_PASS, ids=[c.name for c in ONE_PASS])
def test_one_pass_does_what_the_next_would_have(case: OnePass) -> None:
    world = case.build()
    world.now = case.now
    snapshot = world.snapshot()
    plan = reconcile(snapshot)
    assert outcome(plan, snapshot) == case.expect
    world.apply(snapshot, plan)
    again = world.plan()
    assert (again.grants, again.preemptions) == ((), ())
    assert queue_entries(again) == queue_entries(plan)


def test_a_key_nothing_meters_decides_nothing() -> None:
    """Two grants alike but for a ``memory_mb`` nothing meters (the pool leaves it open):
    grouped together (``_shape``), they decide as they would without it. The memory made the
    second grant's leaf "borrow", which unparked the waiter W, which then preempted V in the
    same pass; without the memory W waited for the next (helper-82). Either way no decision
    may depend on an unmetered amount."""
    open_keys = frozenset({"mcpu", "memory_mb", "step_run"})
    pool = Node("P", "pool p", None, {"gpu": 2, "cpu": 4}, open_keys, backfill_after=None)

    def leaf(name: str, gpu: int) -> Node:
        return Node(name, f"policy {name}", "P", guarantee={"gpu": gpu, "cpu": 0},
                    limit={"gpu": 2, "cpu": 4})

    def placement(leaf_id: str, priority: int, **amounts: int) -> Placement:
        return Placement("P", (Charge(leaf_id, amounts),), priority)

    nodes = {"P": pool, "L1": leaf("L1", 0), "L2": leaf("L2", 2), "L3": leaf("L3", 0)}
    running = (Allocation("V", placement("L2", 0, gpu=2, cpu=1), 10.0),
               Allocation("R3", placement("L3", 0, cpu=1), 11.0))

    def plan_with(queue: tuple[Request, ...]) -> tuple[object, ...]:
        plan = reconcile(Snapshot(100.0, nodes, running, queue))
        return plan.grants, plan.preemptions, queue_entries(plan)

    waiter = Request("W", 0.0, (placement("L1", 5, gpu=1, cpu=1),))
    for memory in ({"memory_mb": 512}, {"memory_mb": 1}):
        # A grant of its own class (before the fix: W granted, V preempted, in this pass)...
        assert plan_with((waiter, Request("G", 1.0, (placement("L3", 0, cpu=2, **memory),)))
                         ) == plan_with((waiter, Request("G", 1.0, (placement("L3", 0, cpu=2),))))
        # ... and one grouped with another that has none (the class's first decides).
        assert plan_with((waiter, Request("G1", 1.0, (placement("L3", 0, cpu=1),)),
                          Request("G2", 2.0, (placement("L3", 0, cpu=1, **memory),)))
                         ) == plan_with((waiter, Request("G1", 1.0, (placement("L3", 0, cpu=1),)),
                                         Request("G2", 2.0, (placement("L3", 0, cpu=1),))))


@pytest.mark.parametrize("collecting", [True, False])
def test_a_pass_pauses_the_garbage_collector_and_leaves_it_as_it_found_it(
    collecting: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused for the pass (a quarter of its time at 100,000 queued requests of one class
    each went to walking the heap), then on again only if it was on: a caller that turned it
    off keeps it off."""
    import gc

    from fairpool.engine import reconcile as module

    seen: list[bool] = []
    run = module._Pass.run
    monkeypatch.setattr(module._Pass, "run", lambda self: (seen.append(gc.isenabled()),
                                                           run(self))[1])
    pool = Node("P", "pool p", None, {"gpu": 1}, frozenset(), backfill_after=None)
    nodes = {"P": pool, "L": Node("L", "policy l", "P", guarantee={"gpu": 0}, limit={})}
    queue = (Request("R", 0.0, (Placement("P", (Charge("L", {"gpu": 1}),), 0),)),)
    (gc.enable if collecting else gc.disable)()
    try:
        assert [g.request_id for g in reconcile(Snapshot(1.0, nodes, (), queue)).grants] == ["R"]
        assert gc.isenabled() is collecting
    finally:
        gc.enable()
    assert seen == [False]
