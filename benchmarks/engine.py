"""Engine benchmark: one reconcile pass over synthetic pools-and-policies states.

    python benchmarks/engine.py [--sizes 1000,10000,100000] [--stream 200]
                                [--distinct unmetered|metered]

States: 10 pools, 100 components (each with policies on two pools), N queued requests and
N/10 running allocations. Prints, per size, the pass time and the time per queued request for
(a) a pass that admits work, (b) a pass where nothing is admissible; then the ratios
100k/10k (target <= 12: near-linear) and the nothing-admissible growth; then a sustained
submit/complete stream at the largest size. All numbers come from this one run.

The queue's requests come from 100 components x 5 shapes: at most 500 classes of requests
alike, which the engine groups, so a pass grows with the classes more than with the
requests. ``--distinct`` gives every request a memory amount of its own: ``unmetered``, on
pools that leave memory open (ZenML's ``memory_mb`` on a pool without it), which the engine
groups all the same; ``metered``, on pools that meter it: as many classes as requests, the
engine's worst case.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive, positive_list

from fairpool.engine.model import Allocation, Charge, Node, Placement, Request, Snapshot
from fairpool.engine.reconcile import reconcile

POOLS = 10
COMPONENTS = 100
SHAPES = ({"gpu": 1}, {"gpu": 2}, {"gpu": 4}, {"gpu": 1, "tpu": 1}, {"gpu": 8})


def build(queued: int, *, admissible: bool, seed: int = 7, distinct: str | None = None
          ) -> Snapshot:
    """A state with ``queued`` waiters and ``queued // 10`` running allocations.

    admissible=False: every pool is full of non-preemptible work and nobody has reserved
    headroom, so no waiter can be granted and nothing can be preempted. ``distinct``: each
    waiter its own ``memory_mb``, which the pools meter ("metered") or not ("unmetered").
    """
    rng = random.Random(seed)
    running = queued // 10
    per_pool = running // POOLS
    # Running jobs take 1 GPU each; capacity is exactly that when nothing should fit.
    gpus = per_pool if not admissible else per_pool + queued // (4 * POOLS) + 8
    nodes: dict[str, Node] = {}
    for p in range(POOLS):
        memory = {"memory_mb": 10 * queued * queued} if distinct == "metered" else {}
        nodes[f"pool{p}"] = Node(
            f"pool{p}", f"pool pool{p}", capacity={"gpu": gpus, "tpu": max(gpus // 4, 1),
                                                   "step_run": 10 * gpus, **memory},
            open_keys=frozenset({"mcpu", "memory_mb", "step_run"}), backfill_after=300.0,
        )
    policies: dict[int, list[tuple[str, str, int]]] = {}
    for c in range(COMPONENTS):
        pools = rng.sample(range(POOLS), 2)
        policies[c] = []
        for rank, p in enumerate(pools):
            leaf = f"c{c}@pool{p}"
            nodes[leaf] = Node(leaf, f"policy c{c} on pool{p}", parent=f"pool{p}",
                               guarantee={"gpu": 0}, limit={})
            policies[c].append((leaf, f"pool{p}", 10 - rank + c % 3))
    allocations = []
    for i in range(running):
        p = i % POOLS
        c = next(c for c in range(i % COMPONENTS, i % COMPONENTS + COMPONENTS)
                 if any(q == f"pool{p}" for _, q, _ in policies[c % COMPONENTS]))
        leaf, pool, priority = next(x for x in policies[c % COMPONENTS] if x[1] == f"pool{p}")
        placement = Placement(pool, (Charge(leaf, {"gpu": 1, "step_run": 1}),), priority)
        allocations.append(Allocation(f"run{i:07d}", placement, float(i), preemptible=False))
    queue = []
    # Like the service, share one placements tuple per (component, shape).
    interned: dict[tuple[int, int], tuple[Placement, ...]] = {}
    for i in range(queued):
        c = rng.randrange(COMPONENTS)
        s = rng.randrange(len(SHAPES))
        placements = None if distinct else interned.get((c, s))
        if placements is None:
            shape = {**SHAPES[s], "step_run": 1, **({"memory_mb": i + 1} if distinct else {})}
            placements = interned[(c, s)] = tuple(
                Placement(pool, (Charge(leaf, shape),), priority)
                for leaf, pool, priority in sorted(policies[c], key=lambda x: -x[2])
            )
        queue.append(Request(f"req{i:07d}", float(i), placements, preemptible=True))
    return Snapshot(now=float(queued) + 1.0, nodes=nodes, allocations=tuple(allocations),
                    queue=tuple(queue))


def timed(snapshot: Snapshot, repeat: int) -> tuple[float, int, int]:
    times = []
    plan = reconcile(snapshot)
    for _ in range(repeat):
        started = time.perf_counter()
        plan = reconcile(snapshot)
        times.append(time.perf_counter() - started)
    return statistics.median(times), len(plan.grants), len(plan.waiting)


def stream(snapshot: Snapshot, steps: int, seed: int = 11) -> tuple[float, int]:
    """Sustained load: each step completes 5 random allocations, submits 5 requests, runs a
    pass and applies its plan. Returns (seconds per step, decisions made)."""
    rng = random.Random(seed)
    allocations = list(snapshot.allocations)
    queue = {r.id: r for r in snapshot.queue}
    template = list(snapshot.queue[:50])
    decisions = 0
    now = snapshot.now
    started = time.perf_counter()
    for step in range(steps):
        now += 1.0
        for _ in range(min(5, len(allocations))):
            allocations.pop(rng.randrange(len(allocations)))
        for k in range(5):
            model = template[(step * 5 + k) % len(template)]
            request = replace(model, id=f"new{step:06d}-{k}", queued_at=now)
            queue[request.id] = request
        state = Snapshot(now, snapshot.nodes, tuple(allocations), tuple(queue.values()))
        plan = reconcile(state)
        for grant in plan.grants:
            request = queue.pop(grant.request_id)
            allocations.append(Allocation(request.id, request.placements[grant.placement_index],
                                          now, request.preemptible))
        for rejection in plan.rejections:
            queue.pop(rejection.request_id)
        victims = {p.victim_id for p in plan.preemptions}
        allocations = [a for a in allocations if a.request_id not in victims]
        decisions += len(plan.grants) + len(plan.rejections) + len(plan.preemptions)
    return (time.perf_counter() - started) / steps, decisions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=positive_list, default=[1000, 10_000, 100_000],
                        help="queue sizes (default 1000,10000,100000; the ratio needs 10000 "
                        "and 100000)")
    parser.add_argument("--stream", type=positive, default=200,
                        help="stream steps at the largest size (default 200)")
    parser.add_argument("--distinct", choices=["unmetered", "metered"],
                        help="every queued request its own memory amount (see above)")
    args = parser.parse_args()
    sizes = args.sizes
    results: dict[tuple[int, bool], float] = {}
    header = ("queued", "case", "pass ms", "us/queued", "granted", "groups")
    print("{:>8} {:<16} {:>10} {:>10} {:>8} {:>8}".format(*header))
    for size in sizes:
        for admissible in (True, False):
            snapshot = build(size, admissible=admissible, distinct=args.distinct)
            seconds, granted, waiting = timed(snapshot, repeat=3 if size >= 100_000 else 5)
            results[(size, admissible)] = seconds
            case = "admits work" if admissible else "none admissible"
            print(f"{size:>8} {case:<16} {seconds * 1e3:>10.1f} {seconds / size * 1e6:>10.2f} "
                  f"{granted:>8} {waiting:>8}")
    if 10_000 in sizes and 100_000 in sizes:
        for admissible, label in ((True, "admits work"), (False, "none admissible")):
            ratio = results[(100_000, admissible)] / results[(10_000, admissible)]
            print(f"ratio 100k/10k ({label}): {ratio:.2f}  (target <= 12; 10 is linear)")
    biggest = max(sizes)
    per_step, decisions = stream(build(biggest, admissible=True, distinct=args.distinct),
                                 args.stream)
    print(f"stream at {biggest} queued: {per_step * 1e3:.1f} ms per submit/complete pass, "
          f"{decisions} decisions in {args.stream} passes")


if __name__ == "__main__":
    main()
