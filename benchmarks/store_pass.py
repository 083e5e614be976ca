"""Store benchmark: what a command costs on a SQLite store with a long queue.

    python benchmarks/store_pass.py [--sizes 10000,100000]

Per size N, a fresh SQLite store: one pool of 8 GPUs held by 8 non-preemptible requests, 100
components with a policy each, and N requests queued behind them (written in one
transaction, 1 GPU each as ``create_request`` makes them, so nothing is admissible). Then, timed:

* load: the live state a pass starts from (``_State.load``), in a read transaction;
* first pass: ``Service.reconcile`` by a service opened afresh (load, engine, and the reason
  written on every request that has none yet);
* next pass: the same again, where nothing changes: the service kept the state it loaded
  (as a server does while nobody else writes), so the engine and the reasons, no row written;
* CLI: ``fairpool resource-request create --component ... --gpu-count 1`` in a process of its
  own, as a user runs it (start, open, write, a pass);

and prints each in seconds and per queued request, then the ratio of the largest size to the
smallest for each (10 is linear for 10x the requests). All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_list

from fairpool.service import Service, _State, open_service
from fairpool.store import repo
from fairpool.store.records import ComponentType

COMPONENTS = 100
GPUS = 8


def build(home: Path, queued: int) -> None:
    """The store: held pool, components, and ``queued`` waiting requests."""
    service = open_service(str(home))
    try:
        service.create_pool("gpus", {"gpu": GPUS})
        for c in range(COMPONENTS):
            # team-0 reserves the pool, so that it may hold it non-preemptibly.
            service.attach_policy("gpus", f"team-{c}", priority=c % 3,
                                  reserved={"gpu": GPUS} if c == 0 else None)
        for _ in range(GPUS):
            held = service.create_request("team-0", demand={"gpu": 1}, preemptible=False)
            assert held.status == "allocated", held
        now = datetime.now(UTC)
        with service.db.write() as conn:
            ids = [repo.get_component_by_name(conn, f"team-{c}", ComponentType.ORCHESTRATOR).id
                   for c in range(COMPONENTS)]
            for i in range(queued):
                repo.insert_request(conn, ids[i % COMPONENTS], {"gpu": 1, "step_run": 1}, now,
                                    preemptible=True)
    finally:
        service.db.close()


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def cli_create(home: Path) -> float:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAIRPOOL_")}
    args = [sys.executable, "-m", "fairpool.cli.main", "--home", str(home),
            "resource-request", "create", "--component", "team-1", "--gpu-count", "1"]
    start = time.perf_counter()
    run = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    took = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"fairpool resource-request create failed: {run.stderr.strip()}")
    return took


def measure(queued: int) -> tuple[float, ...]:
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        build(home, queued)
        service: Service = open_service(str(home))
        try:
            def load() -> None:
                with service.db.read() as conn:
                    _State.load(conn)

            row = (timed(load), timed(service.reconcile), timed(service.reconcile))
        finally:
            service.db.close()
        return (*row, cli_create(home))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=positive_list, default=[10_000, 100_000],
                        help="queue lengths (default 10000,100000)")
    args = parser.parse_args()
    columns = ("load", "first pass", "next pass", "CLI create")
    print(f"{'queued':>8} " + " ".join(f"{name + ' s':>13} {'us/q':>6}" for name in columns))
    rows: list[tuple[float, ...]] = []
    for queued in args.sizes:
        row = measure(queued)
        rows.append(row)
        print(f"{queued:>8} " + " ".join(f"{value:>13.2f} {value / queued * 1e6:>6.1f}"
                                         for value in row))
    if len(rows) > 1:
        factor = args.sizes[-1] / args.sizes[0]
        print(f"ratio {args.sizes[-1]}/{args.sizes[0]} ({factor:g}x the requests): " + "  ".join(
            f"{name} {b / a:.1f}" for name, a, b in zip(columns, rows[0], rows[-1], strict=True)))


if __name__ == "__main__":
    main()
