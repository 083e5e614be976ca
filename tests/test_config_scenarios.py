"""Scheduler config (seed 004), issue 4 items 3 and 4: routing, flavor assignment, quotas, preemption.

Table-driven: each case is a config, what runs and what waits, and the outcome of one pass
through the real engine (``workloads.schedule``). The seed's three examples come first, with
exactly the outcomes the seed states; then one case per routing, flavor and preemption rule.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace

import pytest

from fairpool.errors import InvalidInput
from fairpool.frontends.config import MatchExpression, Operator, load_config
from fairpool.frontends.workloads import (
    Admission,
    Outcome,
    QuotaUsage,
    RunningWorkload,
    Status,
    Workload,
    compile_snapshot,
    explain,
    queue_usage,
    schedule,
    selector_mismatch,
    validate_workload,
)
from tests.test_config_validation import COMPLETE_EXAMPLE, M5_CAP_EXAMPLE, RESERVATION_EXAMPLE

NOW = 1_000.0


def wl(
    workload_id: str,
    at: float = 0.0,
    *,
    priority: int | None = None,
    tags: dict[str, str] | None = None,
    instance: str | None = None,
    accel: str | None = None,
    market: str | None = None,
    **demand: float,
) -> Workload:
    return validate_workload(
        workload_id, labels=tags, instance_type=instance, accelerator_type=accel,
        market_type=market, priority=priority, demand=demand, submitted_at=at,
    )


def run(
    workload: Workload, queue: str | None, *flavors: str, priority: int = 0, at: float = 0.0
) -> RunningWorkload:
    """Running at the priority it asked for: preempted, it is routed at that priority again."""
    return RunningWorkload(replace(workload, priority=priority),
                           Admission(queue, flavors, priority, at))


RESEARCH = {"team": "research"}


def spot(workload_id: str, at: float = 0.0, *, priority: int | None = None, gpu: float = 8) -> Workload:
    """A research workload on an A100 spot instance (matches both ml_training flavors)."""
    return wl(workload_id, at, priority=priority, tags=RESEARCH, accel="A100", market="SPOT",
              gpu=gpu, cpu=32)


def m5(workload_id: str, at: float = 0.0, *, priority: int | None = None) -> Workload:
    """One m5.2xlarge: 8 vCPU, 32 GiB."""
    return wl(workload_id, at, priority=priority, instance="m5.2xlarge", cpu=8, memory_gb=32)


def a4(workload_id: str, at: float = 0.0) -> Workload:
    """One a4-highgpu-8g opted in to the reservation."""
    return wl(workload_id, at, tags={"use-reservation": "true"}, instance="a4-highgpu-8g",
              gpu=8, cpu=224, memory_gb=3968)


def full_ml_training(priority: int = 10) -> list[RunningWorkload]:
    """ml_training at its quotas: 8 x 8 GPUs on gpu_a100_spot, 2 x 8 on research_gpu_pool."""
    return [
        *(run(spot(f"r{i}"), "ml_training", "gpu_a100_spot", priority=priority, at=i)
          for i in range(8)),
        *(run(spot(f"p{i}"), "ml_training", "research_gpu_pool", priority=priority, at=i)
          for i in range(2)),
    ]


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    waiting: list[Workload]
    #: id -> summary (see ``summary``), for every waiting workload.
    expect: dict[str, str]
    running: list[RunningWorkload] = field(default_factory=list)
    #: victim id -> preemptor id.
    evicted: dict[str, str] = field(default_factory=dict)
    #: id -> a substring of the decision's reason or one of its notes.
    says: dict[str, str] = field(default_factory=dict)


def summary(outcome: Outcome, workload_id: str) -> str:
    decision = outcome.decisions[workload_id]
    if decision.status is Status.ADMITTED:
        assert decision.admission is not None
        where = "/".join(
            [decision.admission.queue or "(no rules)", "+".join(decision.admission.flavors)]
        ).rstrip("/")
        return f"admitted {where} p{decision.admission.priority}"
    if decision.status is Status.QUEUED:
        return f"queued {decision.queue} #{decision.position}"
    return decision.status.value  # rejected, or failed: no rule routes it


def config(text: str) -> str:
    return textwrap.dedent(text)


TWO_TEAMS = config("""
    resource_queues:
      - name: qa
      - name: qb
      - name: default
    scheduling_rules:
      - selector: [{ key: team, operator: in, values: [a] }]
        resource_queue: qa
      - selector: [{ key: team, operator: in, values: [b] }]
        resource_queue: qb
      - resource_queue: default
""")

SELECTIVE = config("""
    resource_queues:
      - name: qa
    scheduling_rules:
      - selector: [{ key: team, operator: in, values: [a] }]
        resource_queue: qa
      - selector: [{ key: workload-type, operator: exists }]
        resource_queue: qa
""")


def policy_config(policy: str) -> str:
    """One rule with ``policy`` routing to ``bounded``, then a catch-all to ``default``."""
    return config(f"""
        resource_queues:
          - name: bounded
          - name: default
        scheduling_rules:
          - resource_queue: bounded
            priority_policy: {policy}
          - resource_queue: default
    """)


def one_queue(flavors: str, preemption: str = "never", covered: str = "[gpu]") -> str:
    """Catch-all flavors a, b, c and one queue ``q`` with the given group flavors."""
    return config(f"""
        resource_flavors: [{{ name: a }}, {{ name: b }}, {{ name: c }}]
        resource_queues:
          - name: q
            preemption: {{ within_resource_queue: {preemption} }}
            resource_groups:
              - covered_resources: {covered}
                flavors: {flavors}
        scheduling_rules:
          - resource_queue: q
    """)


ONE_SLOT = one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 1 }] }]")

TWO_QUEUES = config("""
    resource_flavors: [{ name: a }]
    resource_queues:
      - name: qa
        preemption: { within_resource_queue: lower_priority }
        resource_groups:
          - covered_resources: [gpu]
            flavors: [{ name: a, resources: [{ name: gpu, nominal_quota: 8 }] }]
      - name: qb
        preemption: { within_resource_queue: lower_priority }
        resource_groups:
          - covered_resources: [gpu]
            flavors: [{ name: a, resources: [{ name: gpu, nominal_quota: 8 }] }]
    scheduling_rules:
      - selector: [{ key: team, operator: in, values: [a] }]
        resource_queue: qa
      - resource_queue: qb
""")

TWO_GROUPS = config("""
    resource_flavors:
      - { name: g1 }
      - { name: g2 }
      - { name: c1 }
      - name: c2
        selector: [{ key: market-type, operator: in, values: [SPOT] }]
    resource_queues:
      - name: q
        resource_groups:
          - covered_resources: [gpu]
            flavors:
              - { name: g1, resources: [{ name: gpu, nominal_quota: 8 }] }
              - { name: g2, resources: [{ name: gpu, nominal_quota: 8 }] }
          - covered_resources: [cpu, memory_gb]
            flavors:
              - { name: c1, resources: [{ name: cpu, nominal_quota: 4 }] }
              - { name: c2, resources: [{ name: cpu, nominal_quota: 100 }] }
    scheduling_rules:
      - resource_queue: q
""")


def spot_and_any(**gpus: int) -> str:
    """Flavors ``spot`` (selected by market-type SPOT) and ``any``, tried in the order of
    ``gpus`` (their quotas), in one queue ``q`` that preempts lower priorities."""
    flavors = "\n".join(
        f"              - {{ name: {name}, resources: [{{ name: gpu, nominal_quota: {n} }}] }}"
        for name, n in gpus.items()
    )
    return config(f"""
    resource_flavors:
      - name: spot
        selector: [{{ key: market-type, operator: in, values: [SPOT] }}]
      - {{ name: any }}
    resource_queues:
      - name: q
        preemption: {{ within_resource_queue: lower_priority }}
        resource_groups:
          - covered_resources: [gpu]
            flavors:
{flavors}
    scheduling_rules:
      - resource_queue: q
""")


def a_then_b(a: int, b: int, *, preempts: bool = True) -> str:
    """Flavors a then b with ``a`` and ``b`` gpus, in one queue q that preempts lower
    priorities (or not)."""
    preemption = "\n        preemption: { within_resource_queue: lower_priority }" if preempts else ""
    return config(f"""
    resource_flavors: [{{ name: a }}, {{ name: b }}]
    resource_queues:
      - name: q{preemption}
        resource_groups:
          - covered_resources: [gpu]
            flavors:
              - {{ name: a, resources: [{{ name: gpu, nominal_quota: {a} }}] }}
              - {{ name: b, resources: [{{ name: gpu, nominal_quota: {b} }}] }}
    scheduling_rules:
      - resource_queue: q
""")


A_THEN_B = a_then_b(8, 8)


#: A preempted workload's second chance: spot (selected by market-type) is full, any has room.
SPOT_THEN_ANY = spot_and_any(spot=2, any=1)


CASES = [
    # -- seed: the complete example ---------------------------------------------------------
    Case(
        "complete: research A100 spot -> ml_training, first flavor gpu_a100_spot, default 50",
        COMPLETE_EXAMPLE, [spot("w")],
        {"w": "admitted ml_training/gpu_a100_spot p50"},
    ),
    Case(
        "complete: research but not A100 spot -> the next listed flavor, research_gpu_pool",
        COMPLETE_EXAMPLE,
        [wl("w", tags=RESEARCH, accel="H100", market="ON_DEMAND", gpu=8, cpu=32)],
        {"w": "admitted ml_training/research_gpu_pool p50"},
        says={"w": "flavor gpu_a100_spot: selector: accelerator-type is 'H100', not in ['A100']"},
    ),
    Case(
        "complete: not research -> catch-all rule -> default passthrough, no quota",
        COMPLETE_EXAMPLE,
        [wl("w", tags={"team": "infra"}, accel="A100", market="SPOT", gpu=1000)],
        {"w": "admitted default p0"},
        says={"w": "scheduling_rules[0]: selector: team is 'infra', not in ['research']"},
    ),
    Case(
        "complete: a requested priority inside [0, 100] is kept",
        COMPLETE_EXAMPLE, [spot("w", priority=70)],
        {"w": "admitted ml_training/gpu_a100_spot p70"},
    ),
    Case(
        "complete: priority 150 is rejected by the rule (reject), which falls through to default",
        COMPLETE_EXAMPLE, [spot("w", priority=150)],
        {"w": "admitted default p150"},
        says={"w": "scheduling_rules[0]: priority 150 is outside [0, 100] (on_violation: reject)"},
    ),
    Case(
        "complete: 64 GPUs of gpu_a100_spot fill, then 16 of research_gpu_pool, then the queue",
        COMPLETE_EXAMPLE, [spot(f"w{i:02d}", i) for i in range(12)],
        {
            **{f"w{i:02d}": "admitted ml_training/gpu_a100_spot p50" for i in range(8)},
            "w08": "admitted ml_training/research_gpu_pool p50",
            "w09": "admitted ml_training/research_gpu_pool p50",
            "w10": "queued ml_training #1",
            "w11": "queued ml_training #2",
        },
        says={
            "w08": "flavor gpu_a100_spot: gpu requested 8, free 0 of nominal_quota 64",
            "w10": "flavor research_gpu_pool: gpu requested 8, free 0 of nominal_quota 16",
        },
    ),
    Case(
        "complete: lower_priority preempts the most recently admitted lower-priority workload",
        COMPLETE_EXAMPLE, [spot("hi", priority=90)],
        {"hi": "admitted ml_training/gpu_a100_spot p90", "r7": "queued ml_training #1"},
        running=full_ml_training(priority=10),
        evicted={"r7": "hi"},
        says={"hi": "preempting r7"},
    ),
    Case(
        "complete: equal priority never preempts; the workload queues",
        COMPLETE_EXAMPLE, [spot("same", priority=10)],
        {"same": "queued ml_training #1"},
        running=full_ml_training(priority=10),
    ),
    Case(
        "complete: victims lowest priority first, then most recently admitted",
        COMPLETE_EXAMPLE, [spot("hi", priority=50)],
        {"hi": "admitted ml_training/gpu_a100_spot p50", "r1": "queued ml_training #1"},
        running=[
            *(run(spot(f"r{i}"), "ml_training", "gpu_a100_spot", priority=p, at=i)
              for i, p in enumerate([5, 5, 20, 20, 20, 20, 20, 20])),
            *(run(spot(f"p{i}"), "ml_training", "research_gpu_pool", priority=60)
              for i in range(2)),
        ],
        evicted={"r1": "hi"},
    ),
    Case(
        "complete: a victim that turns out unnecessary is given back (minimal set)",
        COMPLETE_EXAMPLE, [spot("hi", priority=50, gpu=32)],
        {"hi": "admitted ml_training/gpu_a100_spot p50", "big": "queued ml_training #1"},
        running=[
            run(spot("keep", gpu=24), "ml_training", "gpu_a100_spot", priority=60, at=0),
            run(spot("big", gpu=32), "ml_training", "gpu_a100_spot", priority=10, at=1),
            run(spot("small", gpu=8), "ml_training", "gpu_a100_spot", priority=10, at=9),
            *(run(spot(f"p{i}"), "ml_training", "research_gpu_pool", priority=60)
              for i in range(2)),
        ],
        evicted={"big": "hi"},
    ),
    Case(
        "complete: higher-priority work never preempts workloads of the same priority or above",
        COMPLETE_EXAMPLE, [spot("hi", priority=50)],
        {"hi": "queued ml_training #1"},
        running=full_ml_training(priority=50),
    ),
    # -- seed: cap a specific instance type --------------------------------------------------
    Case(
        "m5 cap: at most three m5.2xlarge run at once; the fourth waits",
        M5_CAP_EXAMPLE, [m5(f"m{i}", i) for i in range(4)],
        {
            "m0": "admitted q-m5-2xlarge-cap3/m5-2xlarge p50",
            "m1": "admitted q-m5-2xlarge-cap3/m5-2xlarge p50",
            "m2": "admitted q-m5-2xlarge-cap3/m5-2xlarge p50",
            "m3": "queued q-m5-2xlarge-cap3 #1",
        },
        says={"m3": "flavor m5-2xlarge: cpu requested 8, free 0 of nominal_quota 24"},
    ),
    Case(
        "m5 cap: every other instance type goes to the default passthrough, uncapped",
        M5_CAP_EXAMPLE,
        [wl(f"o{i}", instance="m5.large", cpu=8, memory_gb=32) for i in range(10)],
        {f"o{i}": "admitted default p0" for i in range(10)},
        running=[run(m5(f"m{i}"), "q-m5-2xlarge-cap3", "m5-2xlarge", priority=50)
                 for i in range(3)],
    ),
    Case(
        "m5 cap: within_resource_queue never: a higher priority waits, nobody is preempted",
        M5_CAP_EXAMPLE, [m5("hi", priority=100)],
        {"hi": "queued q-m5-2xlarge-cap3 #1"},
        running=[run(m5(f"m{i}"), "q-m5-2xlarge-cap3", "m5-2xlarge", priority=0)
                 for i in range(3)],
    ),
    Case(
        "m5 cap: force_update clamps a requested 250 to max 100 and continues",
        M5_CAP_EXAMPLE, [m5("w", priority=250)],
        {"w": "admitted q-m5-2xlarge-cap3/m5-2xlarge p100"},
        says={"w": "requested priority 250 clamped to 100 (on_violation: force_update)"},
    ),
    # -- seed: use a capacity reservation ----------------------------------------------------
    Case(
        "reservation: the gpu quota of 80 caps usage at ten a4-highgpu-8g",
        RESERVATION_EXAMPLE, [a4(f"a{i:02d}", i) for i in range(11)],
        {
            **{f"a{i:02d}": "admitted reservation/a4_reserved p0" for i in range(10)},
            "a10": "queued reservation #1",
        },
        says={"a10": "flavor a4_reserved: gpu requested 8, free 0 of nominal_quota 80"},
    ),
    Case(
        "reservation: use-reservation=true but not an a4-highgpu-8g fails: no flavor matched",
        RESERVATION_EXAMPLE,
        [wl("w", tags={"use-reservation": "true"}, instance="a3-highgpu-8g", gpu=8)],
        {"w": "rejected"},
        says={"w": "no flavor matched in queue reservation"},
    ),
    Case(
        "reservation: everything else falls through to default and runs uncapped",
        RESERVATION_EXAMPLE,
        [wl(f"w{i}", instance="a4-highgpu-8g", gpu=8) for i in range(12)],
        {f"w{i}": "admitted default p0" for i in range(12)},
    ),
    # -- routing -----------------------------------------------------------------------------
    Case(
        "routing: rules top to bottom, the first match wins",
        TWO_TEAMS, [wl("b", tags={"team": "b"}), wl("a", tags={"team": "a"}), wl("x")],
        {"a": "admitted qa p0", "b": "admitted qb p0", "x": "admitted default p0"},
        says={"b": "scheduling_rules[0]: selector: team is 'b', not in ['a']"},
    ),
    Case(
        "routing: no rule matches -> the workload fails, with every rule's reason",
        SELECTIVE, [wl("w", tags={"team": "c"})],
        {"w": "failed"},
        says={"w": "scheduling_rules[1]: selector: workload-type is not set (exists)"},
    ),
    Case(
        "routing: no rules at all -> admitted with no quota",
        "", [wl("w", gpu=10**6), wl("p", priority=7)],
        {"w": "admitted (no rules) p0", "p": "admitted (no rules) p7"},
    ),
    Case(
        "routing: queues but no rules -> still admitted, queues unused",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 0 }] }]").split(
            "scheduling_rules")[0],
        [wl("w", gpu=8)],
        {"w": "admitted (no rules) p0"},
    ),
    Case(
        "priority: the rule's default when none is requested",
        policy_config("{ default: 30, min: 10, max: 40 }"), [wl("w")],
        {"w": "admitted bounded p30"},
    ),
    Case(
        "priority: on_violation unset behaves as reject (falls through)",
        policy_config("{ default: 10, min: 10, max: 40 }"), [wl("w", priority=50)],
        {"w": "admitted default p50"},
        says={"w": "priority 50 is outside [10, 40] (on_violation: unset, so reject), falls through"},
    ),
    Case(
        "priority: force_update clamps up to min",
        policy_config("{ default: 10, min: 10, max: 40, on_violation: force_update }"),
        [wl("w", priority=5)],
        {"w": "admitted bounded p10"},
    ),
    Case(
        "priority: max unset is no upper bound",
        policy_config("{ default: 10, min: 10 }"), [wl("w", priority=10**6)],
        {"w": "admitted bounded p1000000"},
    ),
    # -- flavors and quotas ------------------------------------------------------------------
    Case(
        "flavors: listed order wins even when a later flavor is unlimited",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 8 }] }, { name: b }]"),
        [wl("w1", 1, gpu=8), wl("w2", 2, gpu=8)],
        {"w1": "admitted q/a p0", "w2": "admitted q/b p0"},
    ),
    Case(
        "flavors: nominal_quota 0 blocks the resource; the next flavor is used",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 0 }] },"
                  " { name: b, resources: [{ name: gpu, nominal_quota: 8 }] }]"),
        [wl("g", gpu=1), wl("c", cpu=4)],
        {"g": "admitted q/b p0", "c": "admitted q/a p0"},
        says={"g": "flavor a: gpu is blocked (nominal_quota 0)"},
    ),
    Case(
        "flavors: a demand above every matching flavor's quota is rejected, never queued",
        COMPLETE_EXAMPLE, [spot("w", gpu=100)],
        {"w": "rejected"},
        says={"w": "never fits in queue ml_training: flavor gpu_a100_spot: gpu requested 100 "
                   "> nominal_quota 64"},
    ),
    Case(
        "flavors: a covered resource without a quota is unlimited; uncovered ones are not governed",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 8 }] }]",
                  covered="[gpu, cpu]"),
        [wl("w", gpu=8, cpu=10**9, memory_gb=10**9, tpu=10**9)],
        {"w": "admitted q/a p0"},
    ),
    Case(
        "flavors: one flavor per resource group, each group in listed order",
        TWO_GROUPS,
        [wl("w1", 1, gpu=8, cpu=4), wl("w2", 2, gpu=8, cpu=4, market="SPOT"),
         wl("w3", 3, gpu=8, cpu=4, market="SPOT")],
        {"w1": "admitted q/g1+c1 p0", "w2": "admitted q/g2+c2 p0", "w3": "queued q #1"},
    ),
    Case(
        "flavors: every resource group needs a matching flavor, else no flavor matched",
        TWO_GROUPS.replace("- { name: c1, resources: [{ name: cpu, nominal_quota: 4 }] }\n", ""),
        [wl("w", gpu=1)],
        {"w": "rejected"},
        says={"w": "flavor c2: selector: market-type is not set, not in ['SPOT']"},
    ),
    Case(
        "passthrough: admits everything, whatever the demand",
        TWO_TEAMS, [wl(f"w{i}", gpu=10**6) for i in range(5)],
        {f"w{i}": "admitted default p0" for i in range(5)},
    ),
    # -- queue order and preemption ----------------------------------------------------------
    Case(
        "order: priority first, then FIFO",
        ONE_SLOT,
        [wl("low", 0, priority=10, gpu=1), wl("late", 5, priority=50, gpu=1),
         wl("early", 1, priority=50, gpu=1)],
        {"early": "admitted q/a p50", "late": "queued q #1", "low": "queued q #2"},
    ),
    Case(
        "order: a workload that fits passes one that does not (no head-of-line blocking)",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 4 }] }]"),
        [wl("big", NOW - 100, gpu=4), wl("small", NOW - 50, gpu=1)],
        {"big": "queued q #1", "small": "admitted q/a p0"},
        running=[run(wl("r", gpu=2), "q", "a")],
    ),
    Case(
        "order: after waiting 300 s the blocked head holds the free units (no starvation)",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 4 }] }]"),
        [wl("big", NOW - 300, gpu=4), wl("small", NOW - 50, gpu=1)],
        {"big": "queued q #1", "small": "queued q #2"},
        running=[run(wl("r", gpu=2), "q", "a")],
        says={"small": "free units are held for big, queued longer than 300 s"},
    ),
    Case(
        "preemption: never (the default) never preempts",
        ONE_SLOT, [wl("hi", priority=100, gpu=1)],
        {"hi": "queued q #1"},
        running=[run(wl("lo", gpu=1), "q", "a", priority=0)],
    ),
    Case(
        "preemption: lower_priority evicts only in the same queue",
        TWO_QUEUES, [wl("hi", priority=100, tags={"team": "a"}, gpu=8)],
        {"hi": "queued qa #1"},
        running=[run(wl("lo", gpu=8), "qb", "a", priority=0),
                 run(wl("mid", gpu=8), "qa", "a", priority=100)],
    ),
    Case(
        "preemption: lower_priority takes the same queue's lower-priority workload",
        TWO_QUEUES, [wl("hi", priority=100, tags={"team": "a"}, gpu=8)],
        {"hi": "admitted qa/a p100", "lo": "queued qa #1"},
        running=[run(wl("other", gpu=8), "qb", "a", priority=0),
                 run(wl("lo", tags={"team": "a"}, gpu=8), "qa", "a", priority=1)],
        evicted={"lo": "hi"},
    ),
    Case(
        "preemption: the preempted are tried again in the same pass: one fits another flavor",
        SPOT_THEN_ANY,
        [wl("hi", priority=5, market="SPOT", gpu=2)],
        # Both go for hi; then 'two' (priority 2) takes any's one GPU before 'one'.
        {"hi": "admitted q/spot p5", "two": "admitted q/any p2", "one": "queued q #1"},
        running=[run(wl("one", market="SPOT", gpu=1), "q", "spot", priority=1, at=0),
                 run(wl("two", market="SPOT", gpu=1), "q", "spot", priority=2, at=1)],
        evicted={"one": "hi", "two": "hi"},
    ),
    Case(
        "preemption: not when another flavor has room",
        one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 1 }] },"
                  " { name: b, resources: [{ name: gpu, nominal_quota: 1 }] }]",
                  preemption="lower_priority"),
        [wl("hi", priority=100, gpu=1)],
        {"hi": "admitted q/b p100"},
        running=[run(wl("lo", gpu=1), "q", "a", priority=0)],
    ),
    Case(
        "running workloads whose queue is gone count against nothing",
        ONE_SLOT, [wl("w", gpu=1)],
        {"w": "admitted q/a p0"},
        running=[run(wl("old", gpu=1), "removed-queue", "a"),
                 run(wl("free", gpu=5), None)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scenario(case: Case) -> None:
    outcome = schedule(load_config(case.config), case.waiting, case.running, NOW)
    # The waiting in order, then the preempted: what they got once requeued.
    assert list(outcome.decisions) == [w.id for w in case.waiting] + list(case.evicted)
    assert {w: summary(outcome, w) for w in outcome.decisions} == case.expect
    assert {e.workload_id: e.preemptor_id for e in outcome.evictions} == case.evicted
    for workload_id, text in case.says.items():
        decision = outcome.decisions[workload_id]
        lines = (decision.reason, *decision.notes)
        assert any(text in line for line in lines), lines


def test_eviction_names_preemptor_queue_and_priorities() -> None:
    outcome = schedule(load_config(COMPLETE_EXAMPLE), [spot("hi", priority=90)],
                       full_ml_training(priority=10), NOW)
    (eviction,) = outcome.evictions
    assert eviction.reason == "preempted by workload hi in queue ml_training (priority 90 > 10)"
    decision = outcome.decisions["hi"]
    assert decision.preempted == ("r7",)
    assert decision.admission == Admission("ml_training", ("gpu_a100_spot",), 90, NOW)


def test_a_requeued_workload_takes_another_flavor_before_a_lower_waiting_one() -> None:
    """hi (no market type: `any` only) preempts mid from `any`. Requeued, mid (SPOT) is
    decided before low and takes `spot`; low waits. (Decided in rounds, low first got `spot`,
    then mid took it from low, which was named as preempted and had its wait started over.)"""
    mid = wl("mid", market="SPOT", priority=1, gpu=1)
    low = wl("low", 5.0, market="SPOT", priority=0, gpu=1)
    outcome = schedule(load_config(spot_and_any(any=1, spot=1)),
                       [wl("hi", 6.0, priority=2, gpu=1), low],
                       [run(mid, "q", "any", priority=1)], NOW)
    assert [(e.workload_id, e.preemptor_id) for e in outcome.evictions] == [("mid", "hi")]
    assert summary(outcome, "hi") == "admitted q/any p2"
    assert outcome.decisions["mid"].admission == Admission("q", ("spot",), 1, NOW)
    assert outcome.decisions["mid"].preempted == ()
    assert "preempting" not in outcome.decisions["mid"].reason
    assert outcome.decisions["low"].status is Status.QUEUED


def test_a_requeued_workload_is_decided_before_lower_priorities_of_its_pass() -> None:
    """hi preempts r from flavor a; requeued, r (60) is decided before w (50), as if it had been
    waiting: it preempts v from b. w waits; nothing is preempted for it. (Decided in rounds,
    w took b from v first, then r took it from w: v was evicted for w, which never ran.)"""
    r, v = wl("r", gpu=8), wl("v", gpu=8)
    outcome = schedule(load_config(A_THEN_B),
                       [wl("hi", 1.0, priority=90, gpu=8), wl("w", 2.0, priority=50, gpu=8)],
                       [run(r, "q", "a", priority=60), run(v, "q", "b", priority=10)], NOW)
    assert [(e.workload_id, e.preemptor_id) for e in outcome.evictions] == [
        ("r", "hi"), ("v", "r")]
    assert {w: summary(outcome, w) for w in outcome.decisions} == {
        "hi": "admitted q/a p90", "w": "queued q #1", "r": "admitted q/b p60", "v": "queued q #2"}
    assert outcome.decisions["r"].preempted == ("v",)
    assert outcome.decisions["w"].preempted == ()


def test_a_preempted_workload_no_rule_routes_now_fails_once_requeued() -> None:
    """old runs on q, where no rule routes team b now: preempted, it cannot queue again."""
    only_a = A_THEN_B.replace("  - resource_queue: q", "  - resource_queue: q\n"
                              "    selector: [{ key: team, operator: in, values: [a] }]")
    assert only_a != A_THEN_B
    outcome = schedule(load_config(only_a),
                       [wl("hi", priority=5, tags={"team": "a"}, gpu=8)],
                       [run(wl("old", tags={"team": "b"}, gpu=8), "q", "a"),
                        run(wl("mate", tags={"team": "a"}, gpu=8), "q", "b", priority=9)], NOW)
    assert [(e.workload_id, e.preemptor_id) for e in outcome.evictions] == [("old", "hi")]
    assert summary(outcome, "old") == "failed"
    assert outcome.decisions["old"].reason.startswith("no scheduling rule matched")


def test_a_workload_the_pass_would_admit_back_where_it_ran_is_not_preempted() -> None:
    """p takes f1 from m and n. Requeued, n (5) takes s's room on f2; m (2) then needs b's,
    which leaves room for s again. s was never in the way: it keeps running, and only m, n
    and b are preempted (s was evicted and admitted back to f2 in the same pass)."""
    running = [run(wl("m", gpu=2), "q", "a", priority=2, at=1.0),
               run(wl("n", gpu=1), "q", "a", priority=5, at=2.0),
               run(wl("b", gpu=3), "q", "b", at=3.0),
               run(wl("s", gpu=1), "q", "b", at=4.0)]
    outcome = schedule(load_config(a_then_b(3, 4)), [wl("p", 5.0, priority=6, gpu=3)], running,
                       NOW)
    assert sorted((e.workload_id, e.preemptor_id) for e in outcome.evictions) == [
        ("b", "m"), ("m", "p"), ("n", "p")]
    assert {w: summary(outcome, w) for w in outcome.decisions} == {
        "p": "admitted q/a p6", "m": "admitted q/b p2", "n": "admitted q/b p5", "b": "queued q #1"}
    assert outcome.decisions["n"].preempted == ()
    assert outcome.decisions["m"].preempted == ("b",)


def test_a_hold_lands_where_the_next_pass_puts_it() -> None:
    """a and b (2 gpu, waiting past backfill_after) and c (1): a passes on the full flavor a
    for b, which has room, and takes it; b then holds a (its first flavor), and c takes b's
    last gpu. (b held flavor b's last gpu, and the next pass moved the hold to a and admitted
    c.) Queue q does not preempt."""
    config = load_config(a_then_b(2, 3, preempts=False))
    running = [run(wl("r1", gpu=2), "q", "a")]
    waiting = [wl("a", 1.0, gpu=2), wl("b", 2.0, gpu=2), wl("c", 3.0, gpu=1)]
    later = NOW + 301
    outcome = schedule(config, waiting, running, later)
    assert {w: summary(outcome, w) for w in outcome.decisions} == {
        "a": "admitted q/b p0", "b": "queued q #1", "c": "admitted q/b p0"}
    # The next pass, with nothing new, changes nothing.
    after = [*running, *(RunningWorkload(w, d.admission) for w in waiting
                         if (d := outcome.decisions[w.id]).admission is not None)]
    again = schedule(config, [waiting[1]], after, later)
    assert again.decisions["b"] == outcome.decisions["b"]


def test_explain_says_rule_queue_flavor_priority_and_why_not_others() -> None:
    config = load_config(COMPLETE_EXAMPLE)
    decision = explain(
        config, wl("w", tags=RESEARCH, accel="A100", market="ON_DEMAND", gpu=8), [], NOW
    )
    assert decision.status is Status.ADMITTED
    assert (decision.route.rule, decision.queue, decision.priority) == (0, "ml_training", 50)
    assert decision.admission is not None
    assert decision.admission.flavors == ("research_gpu_pool",)
    assert decision.notes == (
        "flavor gpu_a100_spot: selector: market-type is 'ON_DEMAND', not in ['SPOT']",
    )
    # With the reserved spot capacity in use, a spot workload explains the quota it missed.
    busy = explain(config, spot("w2"), full_ml_training(priority=50), NOW)
    assert busy.status is Status.QUEUED
    assert busy.reason == (
        "queued in queue ml_training: flavor gpu_a100_spot: gpu requested 8, free 0 of "
        "nominal_quota 64"
    )
    fell = explain(config, spot("w3", priority=101), [], NOW)
    assert (fell.route.rule, fell.queue, fell.priority) == (1, "default", 101)
    assert fell.notes == (
        "scheduling_rules[0]: priority 101 is outside [0, 100] (on_violation: reject), "
        "falls through",
    )


def test_queue_usage_per_queue_flavor_and_resource() -> None:
    config = load_config(M5_CAP_EXAMPLE)
    running = [
        *(run(m5(f"m{i}"), "q-m5-2xlarge-cap3", "m5-2xlarge", priority=50) for i in range(2)),
        run(wl("o", instance="m5.large", cpu=2, gpu=1), "default"),
        run(wl("gone", cpu=8), "removed"),
    ]
    assert queue_usage(config, running) == (
        QuotaUsage("q-m5-2xlarge-cap3", "m5-2xlarge", "cpu", 16_000, 24_000, 2),
        QuotaUsage("q-m5-2xlarge-cap3", "m5-2xlarge", "memory_gb", 64_000, 96_000, 2),
        QuotaUsage("default", None, "gpu", 1_000, None, 1),
        QuotaUsage("default", None, "cpu", 2_000, None, 1),
        QuotaUsage("default", None, "memory_gb", 0, None, 1),
        QuotaUsage("default", None, "tpu", 0, None, 1),
    )


def test_compiled_snapshot_shape() -> None:
    """Queues are roots that order by priority then FIFO; flavors are leaves holding quotas."""
    config = load_config(COMPLETE_EXAMPLE)
    compiled = compile_snapshot(
        config, [spot("w"), spot("v")], [run(wl("gone"), "removed", "x")], NOW
    )
    nodes = {node.name: node for node in compiled.snapshot.nodes.values()}
    assert set(nodes) == {"queue ml_training", "flavor gpu_a100_spot", "flavor research_gpu_pool",
                          "queue default"}
    assert nodes["flavor gpu_a100_spot"].capacity == {"gpu": 64_000, "cpu": 512_000}
    assert nodes["queue ml_training"].preempts and not nodes["queue default"].preempts
    assert not nodes["queue ml_training"].guarantee_first
    first, second = compiled.snapshot.queue
    assert first.placements is second.placements  # one shape, one tuple: the engine groups them
    assert [c.combinations for c in compiled.candidates.values()] == [
        (("gpu_a100_spot",), ("research_gpu_pool",))
    ] * 2
    assert compiled.orphans == ("gone",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"labels": {"instance-type": "m5.large"}},
         "labels.instance-type: 'instance-type' is a reserved label key; set it with its own "
         "field (instance_type, --instance-type), not as a custom tag (got 'm5.large')"),
        ({"labels": {"": "x"}}, "labels key: must be a non-empty string (got '')"),
        ({"labels": {"team": 5}}, "labels.team: must be a string (got 5)"),
        # Named as the API's body and the SDK take it (market-type named no field: helper-83).
        ({"market_type": "spot"},
         "market_type: must be one of SPOT, ON_DEMAND (got 'spot'; did you mean 'SPOT'?)"),
        ({"workload_type": "batch"},
         "workload_type: must be one of service, job, workspace (got 'batch')"),
        ({"instance_type": " "}, "instance_type: must be a non-empty string (got ' ')"),
        ({"labels": {" ": "x"}}, "labels key: must be a non-empty string (got ' ')"),
        # A key is a name: it prints as itself, or is refused.
        ({"labels": {"team\n": "x"}}, "labels key: must not contain control or other "
         "non-printing characters (got 'team\\n', with U+000A)"),
        ({"priority": -1}, "priority: must be a non-negative integer (got -1)"),
        ({"priority": 2**31}, "priority: must be at most 2147483647 (got 2147483648)"),
        ({"priority": True}, "priority: must be an integer (got true)"),
        ({"demand": {"memory": 1}},
         "demand: unknown resource; one of gpu, cpu, memory_gb, tpu (got 'memory')"),
        ({"demand": {"gpu": 0.0001}}, "demand.gpu: must have at most 3 decimal places (got 0.0001)"),
        ({"demand": {"gpu": -1}}, "demand.gpu: must be >= 0 (got -1)"),
        ({"demand": {"gpu": 10**12 + 1}},
         "demand.gpu: must be at most 1000000000000 (got 1000000000001)"),
        ({"demand": {"gpu": float("inf")}}, "demand.gpu: must be a finite number (got inf)"),
        ({"demand": {"gpu": "lots"}}, "demand.gpu: must be a number (got 'lots')"),
        ({"demand": {"gpu": True}}, "demand.gpu: must be a number (got true)"),
        ({"submitted_at": float("nan")},
         "submitted_at: must be a finite number of seconds (got nan)"),
    ],
)
def test_invalid_workloads(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"submitted_at": 0.0, **kwargs}
    with pytest.raises(InvalidInput) as error:
        validate_workload("w", **arguments)  # type: ignore[arg-type]
    assert str(error.value) == message


def test_a_label_value_is_free_text() -> None:
    """As a request's: a tab, a no-break space, an emoji's joiner (tables escape controls)."""
    workload = validate_workload("w", labels={"note": "x\ty", "team": "a\u00a0b"},
                                 instance_type="👩\u200d💻", submitted_at=0.0)
    assert dict(workload.labels) == {"note": "x\ty", "team": "a\u00a0b",
                                     "instance-type": "👩\u200d💻"}


def test_workload_demand_is_exact_milli_units() -> None:
    workload = validate_workload(
        "w", labels={"team": "research"}, accelerator_type="A100", workload_type="job",
        demand={"gpu": 8, "cpu": 0.5, "memory_gb": "1.25", "tpu": 0}, submitted_at=3,
    )
    assert dict(workload.demand) == {"gpu": 8_000, "cpu": 500, "memory_gb": 1_250}
    assert dict(workload.labels) == {
        "team": "research", "accelerator-type": "A100", "workload-type": "job",
    }
    assert workload.submitted_at == 3.0


SMALL_THEN_BIG = a_then_b(2, 8, preempts=False)

#: Flavor ``blocked`` (gpu quota 0) listed first; the workloads wait for cpu on ``c``.
BLOCKED_FIRST_TWO_GROUPS = config("""
    resource_flavors: [{ name: blocked }, { name: ok }, { name: c }]
    resource_queues:
      - name: q
        resource_groups:
          - covered_resources: [gpu]
            flavors:
              - { name: blocked, resources: [{ name: gpu, nominal_quota: 0 }] }
              - { name: ok, resources: [{ name: gpu, nominal_quota: 8 }] }
          - covered_resources: [cpu]
            flavors: [{ name: c, resources: [{ name: cpu, nominal_quota: 4 }] }]
    scheduling_rules:
      - resource_queue: q
""")

HELD = "free units are held for b, queued longer than 300 s, so that smaller workloads stop passing it"

#: (id, config, running, waiting, now, the last waiting workload's reason). "free" is what
#: ``queue_usage`` (``queue describe``) shows: quota minus what runs.
QUEUED_REASONS = [
    ("a flavor that can never fit is skipped for the one it waits on", SMALL_THEN_BIG,
     [run(wl("r", gpu=6), "q", "b")], [wl("w", gpu=4)], NOW,
     "queued in queue q: flavor b: gpu requested 4, free 2 of nominal_quota 8"),
    ("a nominal_quota 0 flavor first, waiting for cpu in another group",
     BLOCKED_FIRST_TWO_GROUPS, [run(wl("r", cpu=4), "q", "ok", "c")], [wl("w", gpu=1, cpu=2)],
     NOW, "queued in queue q: flavor c: cpu requested 2, free 0 of nominal_quota 4"),
    ("free units held for a long waiter: the true free number, and the hold",
     one_queue("[{ name: a, resources: [{ name: gpu, nominal_quota: 8 }] }]"),
     [run(wl("r", gpu=6), "q", "a")], [wl("b", 0.0, gpu=8), wl("w", NOW, gpu=2)], NOW + 301,
     f"queued in queue q: flavor a: gpu requested 2, free 2 of nominal_quota 8; {HELD}"),
]


@pytest.mark.parametrize(
    ("document", "running", "waiting", "now", "reason"), [case[1:] for case in QUEUED_REASONS],
    ids=[case[0] for case in QUEUED_REASONS],
)
def test_a_queued_workloads_reason_says_what_it_waits_for(
    document: str, running: list[RunningWorkload], waiting: list[Workload], now: float,
    reason: str,
) -> None:
    outcome = schedule(load_config(document), waiting, running, now)
    decision = outcome.decisions[waiting[-1].id]
    assert decision.status is Status.QUEUED
    assert decision.reason == reason


@pytest.mark.parametrize(
    ("values", "label", "says"),
    [
        ([""], None, "k is not set, not in ['']"),
        (["us, eu"], "us", "k is 'us', not in ['us, eu']"),
        (["us, eu"], "us, eu", "k is 'us, eu', which not_in ['us, eu'] excludes"),
    ],
)
def test_selector_values_are_quoted_in_explanations(
    values: list[str], label: str | None, says: str
) -> None:
    operator = Operator.NOT_IN if "not_in" in says else Operator.IN
    labels = {} if label is None else {"k": label}
    assert selector_mismatch([MatchExpression("k", operator, tuple(values))], labels) == says
