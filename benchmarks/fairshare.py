"""Fair-share benchmark: one ``compute_fair_share`` update over synthetic pool trees.

    python benchmarks/fairshare.py [--sizes 10:100,100:1000,1000:10000,10000:100000] [--runs 3]
                               [--numeric auto|exact|float]

Trees look like production ones: depth 3-4 (departments / teams / projects, some projects
split into sub-projects), strong guarantees on departments and some teams (always fitting the
parent's, as the front-end validates), weights, ``resource_limits`` on some pools and
operations, about one leaf pool in eight in FIFO mode (with mixed ``fifo_sort_parameters``),
operations with running and pending jobs of random cpu / memory / gpu vectors, and total
demand about four times the cluster, so that guarantees, weights and limits all matter.

Prints, per size, the median of ``--runs`` updates (starvation on, as the service calls it; pools
and operations are described lazily), the time per element, the growth against the previous
size (the target is near-linear: about the size ratio, 10), and the largest case next to
YTsaurus's ``fair_share_update_period`` of 200 ms (10k pools / 100k operations); the last
column is the time to then read every pool's and operation's result.
All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from fairpool.engine import fairshare
from fairpool.engine.fairshare import (
    FifoSortParameter,
    OperationSnapshot,
    PoolSnapshot,
    SchedulingMode,
    StarvationSettings,
    TreeSnapshot,
    compute_fair_share,
)

#: YTsaurus's fair_share_update_period default (ms): the largest case is printed next to it.
UPDATE_PERIOD_MS = 200.0
GIB = 1 << 30
DEFAULT_SIZES = "10:100,100:1000,1000:10000,10000:100000"


def build(pool_count: int, operation_count: int, seed: int = 3) -> TreeSnapshot:
    """A deterministic tree of ``pool_count`` pools and ``operation_count`` operations."""
    rng = random.Random(seed)
    nodes = max(operation_count // 20, 4)
    total = {
        "user_slots": 64 * nodes,
        "cpu": 64 * nodes,
        "gpu": 8 * (nodes // 4),
        "memory": 512 * GIB * nodes,
    }
    pools: list[PoolSnapshot] = []
    leaves: list[PoolSnapshot] = []
    # Departments under the root, teams under departments, projects (leaves) under teams;
    # a third of the teams' projects have sub-projects (depth 4).
    departments = max(2, round(pool_count ** (1 / 3)))
    teams_per_department = max(1, round((pool_count / departments) ** 0.5 / 1.5))
    guarantee_left = total["cpu"] * 9 // 10
    names = iter(range(10**9))

    def pool(parent: PoolSnapshot | None, guarantee: int, leaf: bool) -> PoolSnapshot:
        index = next(names)
        fifo = leaf and rng.random() < 0.125
        limits: dict[str, int] = {}
        if rng.random() < 0.15:
            limits = {"cpu": rng.randint(8, 64) * max(nodes // 8, 1)}
        if rng.random() < 0.05:
            limits["gpu"] = rng.randint(0, 8)
        parameters = rng.choice(
            [
                (FifoSortParameter.WEIGHT, FifoSortParameter.START_TIME),
                (FifoSortParameter.START_TIME,),
                (FifoSortParameter.PENDING_JOB_COUNT, FifoSortParameter.START_TIME),
            ]
        )
        snapshot = PoolSnapshot(
            f"pool-{index}",
            parent.name if parent is not None else None,
            mode=SchedulingMode.FIFO if fifo else SchedulingMode.FAIR_SHARE,
            weight=Fraction(rng.choice([1, 1, 1, 2, 3, 10])) if rng.random() < 0.3 else None,
            strong_guarantee_resources={"cpu": guarantee} if guarantee else {},
            resource_limits=limits,
            fifo_sort_parameters=parameters,
            starvation=StarvationSettings(Fraction(rng.choice([5, 8, 10]), 10), 30_000),
        )
        pools.append(snapshot)
        if leaf:
            leaves.append(snapshot)
        return snapshot

    per_department = guarantee_left // departments
    inner: list[tuple[PoolSnapshot, int]] = []
    for _ in range(departments):
        department = pool(None, per_department if rng.random() < 0.8 else 0, leaf=False)
        for _ in range(teams_per_department):
            share = department.strong_guarantee_resources.get("cpu", 0) // teams_per_department
            team = pool(department, share if rng.random() < 0.5 else 0, leaf=False)
            inner.append((team, 0))
    # Spread the remaining pools over the teams as projects, a third with sub-projects.
    while len(pools) < pool_count:
        team, _ = rng.choice(inner)
        if rng.random() < 0.33 and pool_count - len(pools) >= 3:
            project = pool(team, 0, leaf=False)
            for _ in range(2):
                pool(project, 0, leaf=True)
        else:
            pool(team, 0, leaf=True)
    if not leaves:
        leaves.append(pools[-1])
    operations: list[OperationSnapshot] = []
    shapes = [
        {"user_slots": 1, "cpu": 1, "memory": 4 * GIB},
        {"user_slots": 1, "cpu": 4, "memory": 16 * GIB},
        {"user_slots": 1, "cpu": 2, "memory": 64 * GIB},
        {"user_slots": 1, "cpu": 8, "memory": 32 * GIB, "gpu": 1},
        {"user_slots": 1, "cpu": 16, "memory": 128 * GIB, "gpu": 2},
    ]
    # About 2 jobs per operation of about 6 cpu: demand is about 4x the cluster's cpu.
    mean_jobs = 2.0
    for index in range(operation_count):
        leaf = rng.choice(leaves)
        job = dict(rng.choice(shapes))
        jobs = max(1, round(rng.expovariate(1 / mean_jobs)))
        running = rng.randint(0, jobs) if rng.random() < 0.7 else 0
        limits = {"cpu": rng.randint(1, 64)} if rng.random() < 0.05 else {}
        operations.append(
            OperationSnapshot(
                f"op-{index}",
                leaf.name,
                job,
                running_job_count=running,
                pending_job_count=jobs - running,
                weight=Fraction(rng.choice([1, 1, 1, 2, 5])),
                start_time=float(rng.randint(0, 10_000)),
                resource_limits=limits,
                running=rng.random() < 0.95,
            )
        )
    return TreeSnapshot(total, tuple(pools), tuple(operations), main_resource="cpu")


def timed(snapshot: TreeSnapshot, runs: int, numeric: str) -> tuple[float, float]:
    """Median seconds of ``runs`` updates (starvation included), and median seconds to then
    read every pool's and operation's result (described lazily, on first read)."""
    kwargs = {} if numeric == "auto" else {"numeric": numeric}
    updates, reads = [], []
    for _ in range(runs):
        start = time.perf_counter()
        result = compute_fair_share(snapshot, now=1_000.0, **kwargs)  # type: ignore[arg-type]
        updates.append(time.perf_counter() - start)
        start = time.perf_counter()
        for shares in (*result.pools.values(), *result.operations.values()):
            assert shares.fair_share.total is not None
        reads.append(time.perf_counter() - start)
    return statistics.median(updates), statistics.median(reads)


def sizes_of(text: str) -> list[tuple[int, int]]:
    """``--sizes``: ``pools:operations`` pairs, comma-separated, each count positive."""
    try:
        sizes = [(int(a), int(b)) for a, b in (item.split(":") for item in text.split(","))]
    except ValueError:
        sizes = []
    if not sizes or min(min(pair) for pair in sizes) < 1:
        raise argparse.ArgumentTypeError(f"not pools:operations pairs, comma-separated: {text!r}")
    return sizes


def main() -> None:
    # Here, not at the top: tests load this file as a module, without benchmarks/ on the
    # path (where http.py would shadow the standard library's); run, its directory is.
    from arguments import positive

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_of, default=sizes_of(DEFAULT_SIZES),
                        help=f"pools:operations,... (default {DEFAULT_SIZES})")
    parser.add_argument("--runs", type=positive, default=3,
                        help="timed updates per size, their median shown (default 3)")
    parser.add_argument("--numeric", choices=["auto", "exact", "float"], default="auto",
                        help="the arithmetic (default auto: exact up to 11,000 elements)")
    args = parser.parse_args()
    sizes = args.sizes
    print(
        f"{'pools':>7} {'operations':>10} {'depth':>5} {'update ms':>10} {'us/element':>10} "
        f"{'growth':>7} {'+read all ms':>12}"
    )
    previous: float | None = None
    last = last_read = 0.0
    for pool_count, operation_count in sizes:
        snapshot = build(pool_count, operation_count)
        depth = _depth(snapshot)
        seconds, read = timed(snapshot, args.runs, args.numeric)
        growth = f"{seconds / previous:7.1f}" if previous else f"{'':>7}"
        elements = pool_count + operation_count + 1
        print(
            f"{pool_count:>7} {operation_count:>10} {depth:>5} {seconds * 1000:>10.1f} "
            f"{seconds * 1e6 / elements:>10.2f} {growth} {read * 1000:>12.1f}"
        )
        previous = last = seconds
        last_read = read
    pool_count, operation_count = sizes[-1]
    compiled = "compiled (_hdrf)" if fairshare.kernel is not None else "pure Python (not built)"
    print(f"\nfloat backend: {compiled}; exact up to {fairshare.EXACT_ELEMENT_LIMIT} elements")
    print(
        f"largest case ({pool_count} pools / {operation_count} operations): update "
        f"{last * 1000:.1f} ms = {last * 1000 / UPDATE_PERIOD_MS:.2f} x YTsaurus's "
        f"fair_share_update_period of {UPDATE_PERIOD_MS:.0f} ms; with every result read "
        f"{(last + last_read) * 1000:.1f} ms = {(last + last_read) * 1000 / UPDATE_PERIOD_MS:.2f} x"
    )


def _depth(snapshot: TreeSnapshot) -> int:
    parents = {pool.name: pool.parent for pool in snapshot.pools}
    deepest = 0
    for name in parents:
        depth, current = 1, parents[name]
        while current is not None:
            depth, current = depth + 1, parents[current]
        deepest = max(deepest, depth)
    return deepest


if __name__ == "__main__":
    main()
