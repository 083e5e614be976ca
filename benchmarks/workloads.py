"""Scheduler config benchmark: the cost of one workload submit against the live workloads.

    python benchmarks/workloads.py [--sizes 250,500,1000,2000] [--submits 20]

Per size N, a fresh SQLite database holds one queue that preempts lower priorities (so each
pass also works out what every running workload would queue again as), with room for N + 2 x
--submits 1-GPU workloads, and N of them running. Then ``SchedulingService.submit_workload``
is timed --submits times (each admitted at once) by a service that reuses the live state and
compiled parts of its last pass (``reuse=True``, the default), then as many times by one that
loads and compiles everything afresh on each pass (``reuse=False``), on the same database.
Each service's first submit (the one that loads) is not timed.

Prints, per size, the mean time per submit with reuse and without, their ratio, and with
reuse the time per running workload and its growth against the previous size: the exponent
log(time ratio) / log(size ratio), 1 for linear (the engine pass itself stays linear), 2 for
quadratic. Then the mean time of a read (``list_queues`` and an ``explain``) by each service,
the reusing one current (its write the last), and their ratio. All numbers come from this
one run.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_list

from fairpool.scheduling import SchedulingService
from fairpool.store import scheduling as store
from fairpool.store.db import Database

DEFAULT_SIZES = "250,500,1000,2000"
CONFIG = """
resource_flavors: [{{name: f}}]
resource_queues:
  - name: q
    preemption: {{within_resource_queue: lower_priority}}
    resource_groups:
      - covered_resources: [gpu]
        flavors: [{{name: f, resources: [{{name: gpu, nominal_quota: {quota}}}]}}]
scheduling_rules: [{{resource_queue: q}}]
"""


def per_submit(service: SchedulingService, submits: int) -> float:
    """Seconds per submit, the first (untimed) one aside."""
    service.submit_workload(priority=1, demand={"gpu": 1})
    start = time.perf_counter()
    for _ in range(submits):
        view = service.submit_workload(priority=1, demand={"gpu": 1})
        assert view.status == "admitted", view
    return (time.perf_counter() - start) / submits


def per_read(service: SchedulingService, reads: int) -> float:
    """Seconds per read (``list_queues`` and an ``explain``), after the service's writes."""
    start = time.perf_counter()
    for _ in range(reads):
        service.list_queues()
        service.explain(priority=1, demand={"gpu": 1})
    return (time.perf_counter() - start) / reads


def measure(size: int, submits: int, root: Path) -> tuple[float, float, float, float]:
    """Seconds per submit at ``size`` running workloads, with reuse and without; then
    seconds per read, with and without."""
    db = Database.open(f"sqlite:///{root / f'workloads-{size}.db'}")
    try:
        setup = SchedulingService(db)
        setup.apply_config(CONFIG.format(quota=size + 2 * (submits + 1)))
        # Submitted together and admitted by one pass: N submits would take minutes.
        with db.write() as conn:
            for _ in range(size):
                store.insert_workload(conn, {}, 1, {"gpu": 1000}, datetime.now(UTC))
        setup.reconcile()
        reusing, afresh = SchedulingService(db), SchedulingService(db, reuse=False)
        written = per_submit(reusing, submits), per_submit(afresh, submits)
        # The afresh service wrote last: the reusing one writes once more to be current.
        reusing.reconcile()
        return (*written, per_read(reusing, submits), per_read(afresh, submits))
    finally:
        db.close()


def sizes_argument(text: str) -> list[int]:
    sizes = positive_list(text, "a comma-separated list of positive sizes")
    if len(set(sizes)) < len(sizes):  # each size's store is made once (workloads-N.db)
        raise argparse.ArgumentTypeError(f"a size given twice: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_argument, default=sizes_argument(DEFAULT_SIZES))
    parser.add_argument("--submits", type=int, default=20)
    args = parser.parse_args(argv)
    if args.submits < 1:
        parser.error(f"--submits: must be at least 1 (got {args.submits})")
    print(f"{'running':>8} {'reuse ms':>9} {'afresh ms':>10} {'ratio':>6} "
          f"{'reuse µs/running':>17} {'growth':>7} {'read reuse ms':>14} "
          f"{'read afresh ms':>15} {'ratio':>6}")
    before: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            reused, afresh, read, read_afresh = measure(size, args.submits, Path(root))
            growth = "" if before is None else (
                f"{math.log(reused / before[1]) / math.log(size / before[0]):.2f}"
                if size != before[0] else "")
            print(f"{size:>8} {reused * 1e3:>9.2f} {afresh * 1e3:>10.2f} "
                  f"{afresh / reused:>5.1f}x {reused / size * 1e6:>17.2f} {growth:>7} "
                  f"{read * 1e3:>14.2f} {read_afresh * 1e3:>15.2f} "
                  f"{read_afresh / read:>5.1f}x")
            before = (size, reused)


if __name__ == "__main__":
    main()
