"""Scheduler config benchmark: what an apply costs as the version history grows.

    python benchmarks/config_history.py [--versions 40] [--every 10] [--queues 120]

One SQLite store. A document with --queues flavors, queues and rules (about 55 KB at 120) is
applied --versions times, each version a little different (a comment naming it, so nothing is
answered from a cache of documents). Every --every versions, three applies are timed:

* in process: ``SchedulingService.apply_config`` by the service that applied the others (a
  server's), the mean of the applies since the last row;
* ``fairpool config apply --yes``: the embedded CLI, a process of its own (what it reads
  and parses comes from the store, never from a cache);
* ``fairpool config apply`` answered ``y`` on stdin: the confirmed path, which also shows
  the change before asking;

and a listing: ``SchedulingService.list_configs`` in process, and the size of its JSON (what
``GET /config/versions`` sends, and ``fairpool config list`` reads, remote).

Each CLI apply is a version too. Prints a row per step and, last, each column's ratio of its
last row to its first: 1 when an apply's cost does not grow with the history. All numbers
come from this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairpool.frontends.config import MAX_DOCUMENT
from fairpool.scheduling import SchedulingService
from fairpool.store.db import Database


def document(queues: int, version: int) -> str:
    """``queues`` flavors, queues (each on its own flavor) and rules, named by version."""
    lines = [f"# version {version}", "resource_flavors:"]
    lines += [f"  - name: flavor-{i:03}\n    selector: [{{key: accelerator-type, operator: in, "
              f"values: [T{i}, U{i}]}}]" for i in range(queues)]
    lines.append("resource_queues:")
    lines += [f"  - name: queue-{i:03}\n    preemption: {{within_resource_queue: lower_priority}}"
              f"\n    resource_groups:\n      - covered_resources: [gpu, cpu]\n        flavors:"
              f"\n          - name: flavor-{i:03}\n            resources: [{{name: gpu, "
              f"nominal_quota: {8 + i % 4}}}, {{name: cpu, nominal_quota: 64}}]"
              for i in range(queues)]
    lines.append("scheduling_rules:")
    lines += [f"  - resource_queue: queue-{i:03}\n    selector: [{{key: team, operator: in, "
              f"values: [team-{i}]}}]" for i in range(queues)]
    lines.append("  - resource_queue: queue-000")
    return "\n".join(lines) + "\n"


def cli_apply(home: Path, text: str, confirmed: bool) -> float:
    """Seconds of one ``fairpool config apply`` in a process of its own."""
    path = home / "apply.yaml"
    path.write_text(text)
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAIRPOOL_")}
    args = [sys.executable, "-m", "fairpool.cli.main", "--home", str(home), "config", "apply",
            "-f", str(path)]
    start = time.perf_counter()
    run = subprocess.run(args if confirmed else [*args, "--yes"], input="y\n" if confirmed else "",
                         capture_output=True, text=True, env=env, timeout=600)
    took = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"config apply failed: {run.stderr.strip()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--queues", type=int, default=120)
    args = parser.parse_args()
    for name in ("versions", "every", "queues"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if len(document(args.queues, args.versions)) > MAX_DOCUMENT:
        parser.error(f"--queues {args.queues}: its documents are longer than the "
                     f"{MAX_DOCUMENT:,} characters a config may have")
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        db = Database.open(f"sqlite:///{home / 'fairpool.db'}")
        service = SchedulingService(db)
        size = len(document(args.queues, 0))
        print(f"documents of {size:,} characters ({args.queues} flavors, queues and rules)")
        print(f"{'versions':>8} {'in process ms':>14} {'CLI --yes s':>12} {'CLI confirmed s':>16}"
              f" {'list ms':>8} {'list KB':>8}")
        rows: list[tuple[float, ...]] = []
        applied, timed, spent = 0, 0, 0.0
        while applied < args.versions:
            applied += 1
            start = time.perf_counter()
            service.apply_config(document(args.queues, applied))
            spent += time.perf_counter() - start
            timed += 1
            if applied % args.every and applied != args.versions and applied != 1:
                continue
            yes = cli_apply(home, document(args.queues, -applied), confirmed=False)
            asked = cli_apply(home, document(args.queues, -applied - 10**6), confirmed=True)
            start = time.perf_counter()
            listed = service.list_configs()
            listing = (time.perf_counter() - start) * 1000
            size = len(json.dumps([version.as_dict() for version in listed])) / 1000
            rows.append((spent / timed * 1000, yes, asked, listing, size))
            print(f"{applied:>8} {rows[-1][0]:>14.1f} {yes:>12.2f} {asked:>16.2f}"
                  f" {listing:>8.1f} {size:>8.1f}")
            # The CLI's two applies made versions too: the service reads them afresh.
            timed, spent = 0, 0.0
        first, last = rows[0], rows[-1]
        print("last/first " + "  ".join(f"{b / a:.1f}x" for a, b in zip(first, last, strict=True)))
        db.close()


if __name__ == "__main__":
    main()
