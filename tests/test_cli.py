"""The ``fairpool`` CLI, run for real: each call is a subprocess on a SQLite file in a tmp dir.

Most tests share one home built by the seed's tour (a pool, a policy, four requests) because
every CLI call costs a Python start-up; tests that change that state come last or use a home
of their own. Independent read-only calls run in parallel threads.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

CLI = [sys.executable, "-m", "fairpool.cli.main"]

POOL = "training-gpus"
COMPONENT = "my-k8s-orch"
TOUR_RESOURCES = {"gpu": 2, "mcpu": 4000, "memory_mb": 17180, "step_run": 1}


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def yaml(self) -> Any:
        return yaml.safe_load(self.out)

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    def ok(self) -> Result:
        assert self.code == 0, f"fairpool {' '.join(self.args)} -> {self.code}\n{self.err}"
        return self


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
    # Wide enough that rich tables never fold the cells the tests look for.
    env.update(FAIRPOOL_HOME=str(home), COLUMNS="250", NO_COLOR="1", PYTHONUNBUFFERED="1")
    return env


def fairpool(home: Path, *args: str, input: str | None = None, timeout: float = 60) -> Result:
    proc = subprocess.run(
        [*CLI, *args], env=cli_env(home), input=input, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def fairpool_many(home: Path, calls: Sequence[Sequence[str]], workers: int = 4) -> list[Result]:
    """Independent calls at once, results in call order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda args: fairpool(home, *args), calls))


def db_dump(home: Path) -> list[str]:
    """Every row of every table: the proof that a failed command wrote nothing."""
    with sqlite3.connect(home / "fairpool.db") as conn:
        return list(conn.iterdump())


def assert_one_error(result: Result, *needles: str) -> None:
    """Exit 1, nothing on stdout, exactly one stderr line ``Error: ...`` naming ``needles``."""
    assert result.code == 1, result
    assert result.out == "", result
    assert len(result.err_lines) == 1, result
    line = result.err_lines[0]
    assert line.startswith("Error: "), result
    for needle in needles:
        assert needle in line, (needle, line)


def create_request(home: Path, *args: str, component: str = COMPONENT) -> dict[str, Any]:
    result = fairpool(home, "resource-request", "create", "--component", component, *args,
                      "-o", "json").ok()
    return result.json  # type: ignore[no-any-return]


# -- the seed's tour, shared by the read-only tests below -------------------------------


@dataclass(frozen=True)
class Tour:
    home: Path
    pool: dict[str, Any]
    #: Allocated: the seed's step (2 GPUs, 4 CPUs, 16GiB).
    a: dict[str, Any]
    #: Allocated: 2 more GPUs, reaching the policy's limit of 4.
    b: dict[str, Any]
    #: Queued behind the limit.
    c: dict[str, Any]
    #: Rejected at once: 10 GPUs on an 8-GPU pool.
    d: dict[str, Any]


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Tour:
    home = tmp_path_factory.mktemp("tour")
    pool = fairpool(
        home, "resource-pool", "create", POOL,
        "--capacity", '{"gpu": 8, "step_run": 32}',
        "--description", "Shared training GPUs for the workspace", "-o", "json",
    ).ok().json
    attached = fairpool(
        home, "resource-pool", "attach-policy", POOL, COMPONENT,
        "--priority", "10", "--reserved", '{"gpu": 2}', "--limit", '{"gpu": 4}',
    ).ok()
    assert attached.out == ""
    assert (
        f"Attached pool policy for component `{COMPONENT}` to resource pool `{POOL}` "
        "with priority 10."
    ) in attached.err
    a = create_request(home, "--gpu-count", "2", "--cpu-count", "4", "--memory", "16GiB")
    b = create_request(home, "--gpu-count", "2", "--label", "team=vision")
    c = create_request(home, "--gpu-count", "2")
    d = create_request(home, "--gpu-count", "10")
    return Tour(home, pool, a, b, c, d)


def test_version() -> None:
    result = subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert result.stdout.strip() == "fairpool, version 0.1.0"


def test_home_option_overrides_env(tmp_path: Path) -> None:
    other = tmp_path / "other"
    result = fairpool(tmp_path / "env", "--home", str(other), "resource-pool", "list", "-o", "json")
    assert result.ok().json == {
        "items": [],
        "pagination": {"index": 1, "max_size": 0, "total_pages": 1, "total": 0},
    }
    assert (other / "fairpool.db").exists()
    assert not (tmp_path / "env").exists()


def test_tour_pool_created(tour: Tour) -> None:
    assert tour.pool["name"] == POOL
    assert tour.pool["capacity"] == {"gpu": 8, "step_run": 32}
    assert tour.pool["description"] == "Shared training GPUs for the workspace"


def test_tour_request_allocated_with_zenml_resources(tour: Tour) -> None:
    assert tour.a["status"] == "allocated"
    assert tour.a["pool"] == POOL
    assert tour.a["resources"] == TOUR_RESOURCES
    assert tour.b["status"] == "allocated"
    assert tour.b["labels"] == {"team": "vision"}


def test_queued_request_shows_position_and_reason(tour: Tour) -> None:
    assert tour.c["status"] == "queued"
    table, data = fairpool_many(tour.home, [
        ("resource-request", "describe", tour.c["id"]),
        ("resource-request", "describe", tour.c["id"], "-o", "json"),
    ])
    (place,) = data.ok().json["queue"]
    assert place["pool"] == POOL
    assert place["position"] == 1
    assert "gpu" in place["reason"] and "4" in place["reason"], place  # the limit of 4
    out = table.ok().out
    for text in ("queued", "POSITION", "REASON", POOL, place["reason"]):
        assert text in out, text


def test_hard_rejection_names_pool_key_and_numbers(tour: Tour) -> None:
    assert tour.d["status"] == "rejected"
    reason = tour.d["status_reason"]
    for text in (POOL, "gpu", "10", "8"):
        assert text in reason, (text, reason)
    out = fairpool(tour.home, "resource-request", "describe", tour.d["id"]).ok().out
    assert "rejected" in out and reason in out


def test_list_shows_occupied_vs_total(tour: Tour) -> None:
    table, data = fairpool_many(tour.home, [
        ("resource-pool", "list"),
        ("resource-pool", "list", "-o", "json"),
    ])
    (pool,) = data.ok().json["items"]
    assert pool["occupied"] == {"gpu": 4, "step_run": 2}
    assert pool["queue_length"] == 1
    out = table.ok().out
    for text in ("ID", "NAME", "CAPACITY", "OCCUPIED", "QUEUE LENGTH", "gpu 4/8", "step_run 2/32",
                 "Page (1/1), 1 item found for the applied filters."):
        assert text in out, text


def test_pool_requests_views(tour: Tour) -> None:
    queued, active, every, table = fairpool_many(tour.home, [
        ("resource-pool", "requests", POOL, "--view", "queued", "-o", "json"),
        ("resource-pool", "requests", POOL, "--view", "active", "-o", "json"),
        ("resource-pool", "requests", POOL, "-o", "json"),
        ("resource-pool", "requests", POOL, "--view", "all"),
    ])
    assert [(r["id"], r["state"]) for r in queued.ok().json["items"]] == [(tour.c["id"], "queued")]
    assert [(r["id"], r["state"]) for r in active.ok().json["items"]] == [
        (tour.a["id"], "active"), (tour.b["id"], "active"),
    ]
    assert every.ok().json["pagination"]["total"] == 3
    out = table.ok().out
    for text in ("STATE", "STATUS", "COMPONENT", "RESOURCES", "POSITION", "REASON",
                 "active", "queued", "3 items found"):
        assert text in out, text


def test_describe_by_id_prefix(tour: Tour) -> None:
    pool, request, table = fairpool_many(tour.home, [
        ("resource-pool", "describe", tour.pool["id"][:8], "-o", "json"),
        ("resource-request", "describe", tour.a["id"][:8], "-o", "json"),
        ("resource-pool", "describe", POOL),
    ])
    detail = pool.ok().json
    assert detail["name"] == POOL
    assert [p["component"] for p in detail["policies"]] == [COMPONENT]
    assert [r["id"] for r in detail["queued_requests"]] == [tour.c["id"]]
    assert request.ok().json["id"] == tour.a["id"]
    out = table.ok().out
    for text in (f"Resource pool '{POOL}'", "Policies", "Active requests", "Queued requests",
                 "gpu 4/8", COMPONENT):
        assert text in out, text


READ_COMMANDS: list[tuple[str, ...]] = [
    ("resource-pool", "list"),
    ("resource-pool", "describe", POOL),
    ("resource-pool", "list-policies", POOL),
    ("resource-pool", "list-policies", "--component", COMPONENT),
    ("resource-pool", "requests", POOL),
    ("resource-request", "list"),
    ("resource-request", "list", "--status", "queued", "--pool", POOL),
    ("reconcile",),
]


def test_every_output_format_parses(tour: Tour) -> None:
    calls = [(*cmd, "-o", fmt) for cmd in READ_COMMANDS for fmt in ("json", "yaml", "table")]
    calls.append(("resource-request", "describe", tour.a["id"], "-o", "yaml"))
    results = dict(zip(calls, fairpool_many(tour.home, calls), strict=True))
    for cmd in READ_COMMANDS:
        as_json = results[(*cmd, "-o", "json")].ok().json
        as_yaml = results[(*cmd, "-o", "yaml")].ok().yaml
        table = results[(*cmd, "-o", "table")].ok()
        assert table.out.strip(), cmd
        if cmd == ("reconcile",):
            assert as_json.keys() == as_yaml.keys() >= {"granted", "preempted", "rejected",
                                                        "waiting"}
            assert as_json["waiting"] == 1  # the request queued behind the limit
            continue
        assert as_yaml == as_json, cmd
        if cmd[1] != "describe":
            total = len(as_json["items"])
            assert total > 0, cmd
            assert as_json["pagination"] == {
                "index": 1, "max_size": total, "total_pages": 1, "total": total,
            }
            noun = "item" if total == 1 else "items"
            assert f"Page (1/1), {total} {noun} found for the applied filters." in table.out
    assert results[READ_COMMANDS[6] + ("-o", "json")].json["items"][0]["id"] == tour.c["id"]
    described = results[("resource-request", "describe", tour.a["id"], "-o", "yaml")].ok().yaml
    assert described["resources"] == TOUR_RESOURCES


def test_empty_lists_say_so(tmp_path: Path) -> None:
    pools, requests = fairpool_many(tmp_path, [
        ("resource-pool", "list"), ("resource-request", "list"),
    ])
    assert pools.ok().out.strip() == "No resource pools found."
    assert requests.ok().out.strip() == "No resource requests found."


# -- bad input: one Error line, exit 1, nothing written ----------------------------------

BAD_INPUT: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("resource-pool", "create", "p2", "-c", '{"gpu": 0}'), ("capacity.gpu", "0")),
    (("resource-pool", "create", "p2", "-c", '{"gpu": "x"}'), ("capacity.gpu", "'x'")),
    (("resource-pool", "create", "p2", "-c", "gpu=8"), ("capacity", "gpu=8")),
    (("resource-pool", "create", "p2", "-c", "[8]"), ("capacity", "[8]")),
    (("resource-pool", "create", "p2", "-c", '{"gpu": [8'), ("capacity", '{"gpu": [8')),
    (("resource-pool", "create", POOL, "-c", '{"gpu": 1}'), (POOL, "already exists")),
    (("resource-pool", "update", POOL, "-c", '{"gpu": -1}'), ("capacity.gpu", "-1")),
    (("resource-request", "create", "--component", COMPONENT, "--memory", "1.5GB"),
     ("memory", "1.5GB")),
    (("resource-request", "create", "--component", COMPONENT, "--pool-resource", "tpu=x"),
     ("pool_resources.tpu", "'x'")),
    (("resource-request", "create", "--component", "nobody", "--gpu-count", "1"), ("nobody",)),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"gpu": 3}',
      "-l", '{"gpu": 2}'), ("reserved.gpu", "3", "2")),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"tpu": 1}'),
     ("reserved.tpu", "tpu")),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"gpu": 7}'),
     ("reserved.gpu", "8")),
    (("resource-pool", "attach-policy", "no-such-pool", "c2", "-p", "1"), ("no-such-pool",)),
    (("resource-pool", "describe", "no-such-pool"), ("no-such-pool",)),
    (("resource-pool", "list-policies"), ("resource pool", "--component")),
    (("resource-request", "describe", "ffffffff"), ("ffffffff",)),
    (("resource-request", "list", "--status", "sleeping"), ("status", "sleeping")),
]


@pytest.mark.parametrize(
    ("args", "needles"), BAD_INPUT, ids=[" ".join(args[:3]) + f"-{i}" for i, (args, _) in
                                        enumerate(BAD_INPUT)],
)
def test_bad_input_is_one_error_line_and_writes_nothing(
    tour: Tour, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    before = db_dump(tour.home)
    assert_one_error(fairpool(tour.home, *args), *needles)
    assert db_dump(tour.home) == before


def test_lists_unchanged_after_bad_input(tour: Tour) -> None:
    """Runs after the bad-input cases: what ``list`` shows is still the tour's state."""
    pools, requests = fairpool_many(tour.home, [
        ("resource-pool", "list", "-o", "json"), ("resource-request", "list", "-o", "json"),
    ])
    assert [p["name"] for p in pools.ok().json["items"]] == [POOL]
    assert pools.json["items"][0]["capacity"] == {"gpu": 8, "step_run": 32}
    assert sorted(r["id"] for r in requests.ok().json["items"]) == sorted(
        r["id"] for r in (tour.a, tour.b, tour.c, tour.d)
    )


def test_usage_errors_keep_click_exit_code(tour: Tour) -> None:
    missing, bad_choice = fairpool_many(tour.home, [
        ("resource-pool", "create", "p3"),
        ("resource-pool", "requests", POOL, "--view", "sideways"),
    ])
    assert missing.code == 2 and "--capacity" in missing.err
    assert bad_choice.code == 2 and "sideways" in bad_choice.err


# -- state-changing tests --------------------------------------------------------------


def test_release_returns_units(tour: Tour) -> None:
    """Last of the tour: releasing A lets C (queued behind the limit) in; releasing the rest
    empties the pool."""
    released = fairpool(tour.home, "resource-request", "release", tour.a["id"][:8]).ok()
    assert f"Released resource request `{tour.a['id']}`" in released.err
    a, c = fairpool_many(tour.home, [
        ("resource-request", "describe", tour.a["id"], "-o", "json"),
        ("resource-request", "describe", tour.c["id"], "-o", "json"),
    ])
    assert a.ok().json["status"] == "released"
    assert c.ok().json["status"] == "allocated"
    fairpool_many(tour.home, [
        ("resource-request", "release", tour.b["id"]),
        ("resource-request", "release", tour.c["id"]),
    ])
    (pool,) = fairpool(tour.home, "resource-pool", "list", "-o", "json").ok().json["items"]
    assert pool["occupied"] == {"gpu": 0, "step_run": 0}
    assert pool["queue_length"] == 0
    assert_one_error(
        fairpool(tour.home, "resource-request", "release", tour.a["id"]), tour.a["id"], "released"
    )


def test_delete_asks_for_confirmation(tmp_path: Path) -> None:
    fairpool(tmp_path, "resource-pool", "create", "scratch", "-c", "gpu: 1").ok()
    declined = fairpool(tmp_path, "resource-pool", "delete", "scratch", input="n\n").ok()
    assert "Are you sure you want to delete resource pool `scratch`?" in declined.err
    assert "Resource pool deletion canceled." in declined.err
    assert [p["name"] for p in fairpool(tmp_path, "resource-pool", "list", "-o", "json")
            .ok().json["items"]] == ["scratch"]
    fairpool(tmp_path, "resource-pool", "delete", "scratch", "-y").ok()
    assert fairpool(tmp_path, "resource-pool", "list", "-o", "json").ok().json["items"] == []


def test_update_capacity_and_no_updates(tmp_path: Path) -> None:
    fairpool(tmp_path, "resource-pool", "create", "p", "-c", '{"gpu": 8, "tpu": 2}').ok()
    nothing = fairpool(tmp_path, "resource-pool", "update", "p").ok()
    assert nothing.out == "" and nothing.err.strip() == "No updates specified."
    updated = fairpool(
        tmp_path, "resource-pool", "update", "p", "-c", '{"gpu": 4, "tpu": 0}', "-d", "smaller",
        "-o", "json",
    ).ok().json
    assert updated["capacity"] == {"gpu": 4}
    assert updated["description"] == "smaller"


def test_wait(tmp_path: Path) -> None:
    """--wait: 1 when rejected, 0 once allocated (here after a release by someone else),
    2 on timeout; the position and reason are shown on stderr meanwhile."""
    fairpool(tmp_path, "resource-pool", "create", "solo", "-c", '{"gpu": 1}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "solo", "orch", "-p", "1").ok()
    base = [*CLI, "resource-request", "create", "--component", "orch", "--gpu-count"]

    rejected = fairpool(tmp_path, *base[3:], "2", "--wait")
    assert rejected.code == 1
    assert rejected.err_lines[-1].startswith("Error: Resource request `")
    assert "was rejected" in rejected.err_lines[-1] and "solo" in rejected.err_lines[-1]

    holder = create_request(tmp_path, "--gpu-count", "1", "--wait", component="orch")
    assert holder["status"] == "allocated"

    waiter = subprocess.Popen(
        [*base, "1", "--wait", "--timeout", "30", "-o", "json"], env=cli_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert waiter.stderr is not None
        seen = []
        for line in waiter.stderr:  # stops at the first progress line
            seen.append(line)
            if line.startswith("Waiting for resource request"):
                break
        assert "position 1 in pool `solo`" in seen[-1], seen
        fairpool(tmp_path, "resource-request", "release", holder["id"]).ok()
        out, _ = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
        waiter.wait()
    assert waiter.returncode == 0
    assert json.loads(out)["status"] == "allocated"

    started = time.monotonic()
    timed_out = fairpool(tmp_path, *base[3:], "1", "--wait", "--timeout", "0.5")
    assert timed_out.code == 2
    assert time.monotonic() - started < 15
    assert any(line.startswith("Waiting for resource request") and "position 1" in line
               for line in timed_out.err_lines), timed_out.err
    assert timed_out.err_lines[-1].startswith("Error: timed out waiting for resource request")


# -- concurrency ----------------------------------------------------------------------


def test_concurrent_clients_lose_nothing_and_never_overcommit(tmp_path: Path) -> None:
    """8 CLI clients at once, 5 one-GPU requests each, on a 4-GPU pool: 40 requests, 4
    allocated, 36 queued. Then the queue drains as units come back, oldest first."""
    fairpool(tmp_path, "resource-pool", "create", "four", "-c", '{"gpu": 4}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "four", "orch", "-p", "1").ok()

    errors: list[Result] = []

    def client(_: int) -> None:
        for _ in range(5):
            result = fairpool(tmp_path, "resource-request", "create", "--component", "orch",
                              "--gpu-count", "1", "-o", "json")
            if result.code != 0 or result.json["status"] not in ("allocated", "queued"):
                errors.append(result)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    def by_status() -> dict[str, list[dict[str, Any]]]:
        items = fairpool(tmp_path, "resource-request", "list", "-o", "json").ok().json["items"]
        grouped: dict[str, list[dict[str, Any]]] = {}
        for item in sorted(items, key=lambda r: (r["created"], r["id"])):
            grouped.setdefault(item["status"], []).append(item)
        return grouped

    state = by_status()
    assert {k: len(v) for k, v in state.items()} == {"allocated": 4, "queued": 36}
    oldest_queued = [r["id"] for r in state["queued"][:4]]
    fairpool_many(tmp_path, [("resource-request", "release", r["id"]) for r in state["allocated"]])
    summary = fairpool(tmp_path, "reconcile", "-o", "json").ok().json
    assert summary["waiting"] == 32
    state = by_status()
    assert {k: len(v) for k, v in state.items()} == {"allocated": 4, "queued": 32, "released": 4}
    assert sorted(r["id"] for r in state["allocated"]) == sorted(oldest_queued)

    # Drain the rest through the service itself (36 more CLI start-ups would dominate the run).
    from fairpool.service import open_service

    svc = open_service(str(tmp_path))
    try:
        for _ in range(20):
            allocated = svc.list_requests("allocated", None, None)
            assert len(allocated) <= 4
            if not allocated:
                break
            for request in allocated:
                svc.release_request(request.id)
            svc.reconcile()
    finally:
        svc.db.close()
    final = by_status()
    assert {k: len(v) for k, v in final.items()} == {"released": 40}
