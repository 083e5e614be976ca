"""Every story of seed 000 (ZenML's resource pool examples), run through the real CLI.

One ``Story`` per section of the seed, with the numbers of tests/test_engine_scenarios.py: a
list of CLI steps (create pools, attach policies, create and release requests), and for each
request the state the ``create`` command answered (when it matters) and its final state, read
back with ``resource-request describe ID -o json``: status, pool, a substring of the status
reason or of a queue reason, the queue positions, the preemptor.

Every CLI call is a Python start-up, so the stories run at once in threads, each in a home of
its own, and the parametrized test of a story only checks what its run recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.test_cli import fairpool, fairpool_many

# -- the table's vocabulary ----------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What ``create`` or ``describe`` shows for a request. ``{name}`` in ``reason`` stands for
    the id of the request ``name`` of the same story."""

    status: str
    pool: str | None = None
    #: Substring of ``status_reason`` or of one of the queue reasons.
    reason: str | None = None
    #: (pool, position) per queue entry, in the order shown.
    queue: tuple[tuple[str, int], ...] = ()
    #: Name of the request that preempted this one.
    preempted_by: str | None = None
    resources: Mapping[str, int] | None = None


def allocated(pool: str, resources: Mapping[str, int] | None = None) -> Seen:
    return Seen("allocated", pool, f"allocated on pool {pool}", resources=resources)


def queued(reason: str, *queue: tuple[str, int]) -> Seen:
    return Seen("queued", None, reason, tuple(queue))


def rejected(reason: str) -> Seen:
    return Seen("rejected", None, reason)


def released(pool: str) -> Seen:
    return Seen("released", pool)


def preempted(pool: str, by: str, reason: str) -> Seen:
    return Seen("preempted", pool, reason, preempted_by=by)


@dataclass(frozen=True)
class Step:
    #: CLI arguments; ``{name}`` stands for the id of the request ``name``.
    args: tuple[str, ...]
    #: For ``resource-request create``: the name the story gives the request.
    request: str | None = None
    #: The request's state at the end of the story.
    final: Seen | None = None
    #: What ``create`` answered, when the story checks it (e.g. queued before a release).
    created: Seen | None = None


def pool(name: str, capacity: Mapping[str, int]) -> Step:
    return Step(("resource-pool", "create", name, "-c", json.dumps(dict(capacity))))


def policy(
    pool_name: str,
    component: str,
    priority: int,
    reserved: Mapping[str, int] | None = None,
    limit: Mapping[str, int] | None = None,
) -> Step:
    args = ["resource-pool", "attach-policy", pool_name, component, "-p", str(priority)]
    if reserved is not None:
        args += ["-r", json.dumps(dict(reserved))]
    if limit is not None:
        args += ["-l", json.dumps(dict(limit))]
    return Step(tuple(args))


def request(
    name: str, component: str, *flags: str, final: Seen, created: Seen | None = None
) -> Step:
    args = ("resource-request", "create", "--component", component, *flags, "-o", "json")
    return Step(args, name, final, created)


def release(name: str) -> Step:
    return Step(("resource-request", "release", "{" + name + "}"))


def gpus(n: int, *more: str) -> tuple[str, ...]:
    return ("--gpu-count", str(n), *more)


NP = "--non-preemptible"
TRT = ("--pool-resource", "tensorrt_sessions=1")


@dataclass(frozen=True)
class Story:
    name: str
    steps: tuple[Step, ...]

    def __init__(self, name: str, *steps: Step) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "steps", steps)


# -- the seed, section by section -----------------------------------------------------------

GPU8 = {"gpu": 8}


def warm_up(*steps: Step) -> tuple[Step, ...]:
    return (
        pool("training", GPU8),
        policy("training", "team-ml-orch", 10, {"gpu": 4}, {"gpu": 6}),
        *steps,
    )


def cpu_metered(*steps: Step) -> tuple[Step, ...]:
    return (
        pool("p", {"gpu": 8, "mcpu": 16000}),
        policy("p", "orch", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4, "mcpu": 8000}),
        *steps,
    )


def two_regions(*steps: Step) -> tuple[Step, ...]:
    return (
        pool("eu-west", {"gpu": 4}),
        pool("eu-north", {"gpu": 4}),
        policy("eu-west", "orch", 10, {"gpu": 2}, {"gpu": 4}),
        policy("eu-north", "orch", 5, {"gpu": 2}, {"gpu": 4}),
        *steps,
    )


STORIES = [
    # -- warm-up: one pool, one policy, only GPUs -------------------------------------------
    Story(
        "preemptible step borrows past reserved",
        *warm_up(request("r", "team-ml-orch", *gpus(6), final=allocated("training"))),
    ),
    Story(
        "non-preemptible step stays inside reserved",
        *warm_up(request("r", "team-ml-orch", *gpus(2, NP), final=allocated("training"))),
    ),
    Story(
        "non-preemptible step beyond reserved is rejected at once",
        *warm_up(request("r", "team-ml-orch", *gpus(6, NP), final=rejected(
            "policy team-ml-orch on training: gpu requested 6 > reserved 4 (non-preemptible: reserve more gpu in the policy, or make the request preemptible)"
        ))),
    ),
    # -- CPU, memory and step slots: unbounded vs metered -------------------------------------
    Story(
        "GPU-only pool: CPU and memory are not quota'd, even for non-preemptible work",
        *warm_up(request(
            "r", "team-ml-orch", *gpus(1, "--cpu-count", "4", "--memory", "16GiB", NP),
            final=allocated(
                "training", {"gpu": 1, "mcpu": 4000, "memory_mb": 17180, "step_run": 1}
            ),
        )),
    ),
    Story(
        "non-preemptible CPU inside policy reserved is allocated, over it rejected",
        *cpu_metered(
            request("inside", "orch", *gpus(1, "--cpu-count", "2", NP), final=allocated("p")),
            request("over", "orch", *gpus(1, "--cpu-count", "8", NP), final=rejected(
                "policy orch on p: mcpu requested 8000 > reserved 4000 (non-preemptible: reserve more mcpu in the policy, or make the request preemptible)"
            )),
        ),
    ),
    Story(
        "preemptible CPU bursts past reserved up to the policy limit",
        *cpu_metered(request(
            "r", "orch", *gpus(1, "--cpu-count", "6"),
            final=allocated("p", {"gpu": 1, "mcpu": 6000, "step_run": 1}),
        )),
    ),
    Story(
        "pool lists mcpu, policy omits it: preemptible allocated, non-preemptible rejected",
        pool("p", {"gpu": 8, "mcpu": 8000}),
        policy("p", "orch", 1, {"gpu": 2}, {"gpu": 4}),
        request("pre", "orch", *gpus(1, "--cpu-count", "4"), final=allocated("p")),
        request("np", "orch", *gpus(1, "--cpu-count", "4", NP), final=rejected(
            "policy orch on p: mcpu requested 4000 > reserved 0 (non-preemptible: reserve mcpu in the policy, or make the request preemptible)"
        )),
    ),
    Story(
        "step_run caps concurrent steps: waits while GPUs are free, granted after a release",
        pool("p", {"gpu": 8, "step_run": 2}),
        policy("p", "orch", 1, {"gpu": 2, "step_run": 1}, {"gpu": 8, "step_run": 2}),
        request("a", "orch", *gpus(1), final=released("p")),
        request("b", "orch", *gpus(1), final=allocated("p")),
        request(
            "r", "orch", *gpus(1),
            created=queued("policy orch on p: step_run requested 1, in use 2 of limit 2",
                           ("p", 1)),
            final=allocated("p"),
        ),
        release("a"),
    ),
    # -- custom keys from pool_resources -------------------------------------------------------
    Story(
        "custom key fully configured",
        pool("p", {"gpu": 4, "tensorrt_sessions": 2}),
        policy("p", "orch", 1, {"gpu": 1, "tensorrt_sessions": 1},
               {"gpu": 2, "tensorrt_sessions": 2}),
        request("r", "orch", *gpus(1, *TRT, NP), final=allocated(
            "p", {"gpu": 1, "step_run": 1, "tensorrt_sessions": 1}
        )),
    ),
    Story(
        "custom key on pool but missing from policy: non-preemptible rejected, preemptible "
        "borrows",
        pool("p", {"gpu": 4, "tensorrt_sessions": 2}),
        policy("p", "orch", 1, {"gpu": 1}, {"gpu": 2}),
        request("np", "orch", *gpus(1, *TRT, NP), final=rejected(
            "policy orch on p: tensorrt_sessions requested 1 > reserved 0 (non-preemptible: reserve tensorrt_sessions in the policy, or make the request preemptible)"
        )),
        request("pre", "orch", *gpus(1, *TRT), final=allocated("p")),
    ),
    Story(
        "custom key the pool does not list is zero capacity: rejected",
        pool("p", {"gpu": 4}),
        policy("p", "orch", 1, {"gpu": 1}, {"gpu": 2}),
        request("r", "orch", *gpus(1, *TRT), final=rejected(
            "pool p: has no tensorrt_sessions (zero capacity), requested 1"
        )),
        # Not "requested 1 > reserved 0": reserving a key the pool lacks is refused.
        request("np", "orch", *gpus(1, *TRT, NP), final=rejected(
            "pool p: has no tensorrt_sessions (zero capacity), requested 1"
        )),
    ),
    # -- hard rejections (no queue) ------------------------------------------------------------
    Story(
        "request exceeds pool capacity",
        pool("p", GPU8),
        policy("p", "orch", 1, {"gpu": 4}, {"gpu": 8}),
        request("r", "orch", *gpus(10), final=rejected("pool p: gpu requested 10 > capacity 8")),
    ),
    Story(
        "request exceeds policy limit although the pool could fit",
        pool("p", GPU8),
        policy("p", "orch", 1, {"gpu": 2}, {"gpu": 4}),
        request("r", "orch", *gpus(6), final=rejected("policy orch on p: gpu requested 6 > limit 4")),
    ),
    # -- contention: queues and priorities -----------------------------------------------------
    Story(
        "two teams, same priority: oldest first, an in-share waiter before an older borrower",
        pool("p", {"gpu": 4}),
        policy("p", "red", 5, {"gpu": 2}, {"gpu": 4}),
        policy("p", "blue", 5, {"gpu": 2}, {"gpu": 4}),
        # Each team fills its reserved share: the pool is full, nobody borrows.
        request("red-1", "red", *gpus(2, NP), final=released("p")),
        request("blue-1", "blue", *gpus(2, NP), final=released("p")),
        # Three borrowers wait, oldest first.
        request("red-2", "red", *gpus(2), final=allocated("p"),
                created=queued("pool p: gpu requested 2, free 0 of 4", ("p", 1))),
        request("blue-2", "blue", *gpus(2), final=allocated("p"),
                created=queued("pool p: gpu requested 2, free 0 of 4", ("p", 2))),
        request("red-3", "red", *gpus(2),
                final=queued("pool p: gpu requested 2, free 0 of 4", ("p", 1)),
                created=queued("pool p: gpu requested 2, free 0 of 4", ("p", 3))),
        # Blue's share frees: blue-2 now fits it and goes before the older red-2.
        release("blue-1"),
        # Red's share frees: red-2 and red-3 both fit it; the older one goes.
        release("red-1"),
    ),
    Story(
        "higher priority wins: the lower-priority newest borrower is preempted",
        pool("p", GPU8),
        policy("p", "sandbox", 10, limit={"gpu": 8}),
        policy("p", "prod", 100, limit={"gpu": 8}),
        request("s-1", "sandbox", *gpus(2), final=allocated("p")),
        request("s-2", "sandbox", *gpus(2), final=allocated("p")),
        request("s-3", "sandbox", *gpus(2), final=preempted(
            "p", "prod-1", "preempted by request {prod-1} on pool p (priority 100 > 10)"
        )),
        request("prod-1", "prod", *gpus(4), final=allocated("p")),
    ),
    Story(
        "production non-preemptible waits on its own reserved, never on sandbox's burst",
        pool("p", GPU8),
        policy("p", "sandbox", 10, {"gpu": 2}, {"gpu": 8}),
        policy("p", "prod", 100, {"gpu": 2}, {"gpu": 8}),
        request("s-1", "sandbox", *gpus(6), final=allocated("p")),
        request("prod-np", "prod", *gpus(2, NP), final=released("p")),
        request(
            "prod-2", "prod", *gpus(2, NP),
            created=queued(
                "policy prod on p: gpu requested 2, non-preemptible use 2 of reserved 2", ("p", 1)
            ),
            final=allocated("p"),
        ),
        # The other job finishes: prod-2 gets its reserved units; sandbox was never touched.
        release("prod-np"),
    ),
    # -- multiple pools and multi-key requests ---------------------------------------------------
    Story(
        "two pools on one orchestrator: the higher-priority policy's pool wins",
        *two_regions(request("r", "orch", *gpus(2), final=allocated("eu-west"))),
    ),
    Story(
        "two pools: the fallback pool wins when the primary is full, nobody preempted",
        *two_regions(
            policy("eu-west", "other", 1),
            request("o-1", "other", *gpus(4), final=allocated("eu-west")),
            request("r", "orch", *gpus(2), final=allocated("eu-north")),
        ),
    ),
    Story(
        "one step must satisfy every key in one pool: a GPU-only pool is not eligible",
        pool("a", {"gpu": 4}),
        pool("b", {"gpu": 4, "tensorrt_sessions": 1}),
        policy("a", "orch", 10, {"gpu": 2}, {"gpu": 4}),
        policy("b", "orch", 5, {"gpu": 2, "tensorrt_sessions": 1}, {"gpu": 4}),
        request("r-1", "orch", *gpus(1, *TRT), final=allocated("b")),
        # b's only session is taken: the next one waits on b alone, although a has free GPUs.
        request("r-2", "orch", *gpus(1, *TRT), final=queued(
            "pool a: has no tensorrt_sessions (zero capacity), requested 1", ("a", 0), ("b", 1)
        )),
    ),
    Story(
        "metered primary cannot take a big non-preemptible CPU/RAM ask; the GPU-only path can",
        pool("pool-a", {"gpu": 4}),
        pool("pool-b", {"gpu": 4, "mcpu": 16000, "memory_mb": 65536}),
        policy("pool-a", "orch", 5, {"gpu": 2}, {"gpu": 4}),
        policy("pool-b", "orch", 10, {"gpu": 2, "mcpu": 4000, "memory_mb": 8192},
               {"gpu": 4, "mcpu": 16000, "memory_mb": 65536}),
        request(
            "r", "orch", *gpus(1, "--cpu-count", "8", "--memory", "32GiB", NP),
            final=allocated("pool-a", {"gpu": 1, "mcpu": 8000, "memory_mb": 34360, "step_run": 1}),
        ),
    ),
]


# -- running the stories ------------------------------------------------------------------------


@dataclass
class Run:
    ids: dict[str, str] = field(default_factory=dict)
    created: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)

    def sub(self, text: str) -> str:
        for name, request_id in self.ids.items():
            text = text.replace("{" + name + "}", request_id)
        return text


def run_story(story: Story, home: Path) -> Run:
    run = Run()
    for step in story.steps:
        result = fairpool(home, *(run.sub(arg) for arg in step.args))
        if result.code != 1 or step.request is None or result.json["status"] != "rejected":
            result.ok()  # a create rejected at once says so by its exit code, 1
        if step.request is not None:
            run.ids[step.request] = result.json["id"]
            run.created[step.request] = result.json
    names = list(run.ids)
    described = fairpool_many(
        home, [("resource-request", "describe", run.ids[n], "-o", "json") for n in names]
    )
    run.final = {name: result.ok().json for name, result in zip(names, described, strict=True)}
    return run


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Future[Run]]:
    """Runs every selected story at once, each in its own home."""
    selected = {
        item.callspec.params["story"].name
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
        and hasattr(item, "callspec")
    }
    executor = ThreadPoolExecutor(max_workers=4)
    futures = {
        story.name: executor.submit(run_story, story, tmp_path_factory.mktemp("story"))
        # The longest stories first, so that none of them is left to run alone at the end.
        for story in sorted(STORIES, key=lambda s: -len(s.steps))
        if story.name in selected
    }
    executor.shutdown(wait=False)
    return futures


def check(seen: Seen, got: dict[str, Any], run: Run, what: str) -> None:
    shown = {k: got[k] for k in ("status", "pool", "status_reason", "queue", "preempted_by_id")}
    assert (got["status"], got["pool"]) == (seen.status, seen.pool), (what, shown)
    if seen.reason is not None:
        reasons = [got["status_reason"] or "", *(entry["reason"] for entry in got["queue"])]
        assert any(run.sub(seen.reason) in reason for reason in reasons), (what, shown)
    assert [(e["pool"], e["position"]) for e in got["queue"]] == list(seen.queue), (what, shown)
    preemptor = run.ids[seen.preempted_by] if seen.preempted_by else None
    assert got["preempted_by_id"] == preemptor, (what, shown)
    if seen.resources is not None:
        assert got["resources"] == seen.resources, (what, got["resources"])


def answered(step: Step) -> Seen:
    """What ``create`` should have answered: as given, else the final state (or allocated on the
    final pool for a request later released or preempted)."""
    assert step.final is not None
    if step.created is not None:
        return step.created
    if step.final.status in ("released", "preempted"):
        return allocated(str(step.final.pool))
    return step.final


@pytest.mark.long
@pytest.mark.parametrize("story", STORIES, ids=[s.name for s in STORIES])
def test_seed_story(story: Story, runs: dict[str, Future[Run]]) -> None:
    run = runs[story.name].result(timeout=300)
    for step in story.steps:
        if step.request is None:
            continue
        assert step.final is not None
        check(answered(step), run.created[step.request], run, f"{step.request} when created")
        check(step.final, run.final[step.request], run, f"{step.request} at the end")
