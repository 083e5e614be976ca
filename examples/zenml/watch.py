"""Print ``zenml resource-pool requests POOL --view all`` at the two moments worth seeing:
when a step is first queued behind the full pool, and when the queued steps are granted.

    python examples/zenml/watch.py POOL [--timeout 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from zenml.client import Client


def show(pool: str, title: str) -> None:
    print(f"\n--- {title}\n$ zenml resource-pool requests {pool} --view all", flush=True)
    zenml = str(Path(sys.executable).parent / "zenml")
    subprocess.run([zenml, "resource-pool", "requests", pool, "--view", "all"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pool")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    client = Client()
    deadline = time.time() + args.timeout
    waiting: set[str] = set()
    while time.time() < deadline:
        pool = client.get_resource_pool(args.pool, hydrate=True)
        queued = {str(item.request.id) for item in pool.queued_requests}
        active = {str(item.request.id) for item in pool.active_requests}
        if not waiting and queued:
            waiting = queued
            show(args.pool, f"{len(queued)} step(s) queued behind a full pool")
        elif waiting and waiting <= active:
            show(args.pool, "the queued step(s) granted")
            return
        time.sleep(0.5)
    raise SystemExit(f"watch: no queue-then-grant on pool {args.pool} within {args.timeout} s")


if __name__ == "__main__":
    main()
