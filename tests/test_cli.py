"""The ``fairpool`` CLI, run for real: every call is a process of its own on a SQLite file in a
tmp dir (forked from one that imported the CLI already: ``tests/forked_cli.py``; the console
script and ``python -m`` themselves are run by a few tests here and in test_cli_run.py).

A CLI call costs a process, so most tests share one home built by
the seed's tour (a pool, a policy, four requests), independent calls run in parallel threads,
and the tests that change the tour's state come last. The rest use homes of their own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairpool import Client
from fairpool.cli.resource_request import reason_of
from fairpool.errors import InvalidInput
from tests import forked_cli
from tests.conftest import PostgresServer
from tests.servers import free_port

CLI = [sys.executable, "-m", "fairpool.cli.main"]

POOL = "training-gpus"
COMPONENT = "my-k8s-orch"
#: The seed's step: ResourceSettings(gpu_count=2, cpu_count=4, memory="16GiB"), + step_run.
TOUR_RESOURCES = {"gpu": 2, "mcpu": 4000, "memory_mb": 17180, "step_run": 1}
CREATE_REQUEST = ("resource-request", "create", "--component")


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
    env.update(FAIRPOOL_HOME=str(home), COLUMNS="250", NO_COLOR="1")
    return env


def fairpool(home: Path, *args: str, input: str | None = None) -> Result:
    """The CLI in a process of its own (``tests/forked_cli.py``) on ``home``."""
    code, out, err = forked_cli.run(list(args), cli_env(home), input)
    return Result(tuple(args), code, out, err)


def fairpool_many(home: Path, calls: Sequence[Sequence[str]], workers: int = 4) -> list[Result]:
    """Independent calls at once; results in call order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda args: fairpool(home, *args), calls))


def db_dump(home: Path) -> list[str]:
    """Every row of every table: the proof that a failed command wrote nothing."""
    with sqlite3.connect(home / "fairpool.db") as conn:
        return list(conn.iterdump())


def _command_paths(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the CLI, as the words that name it."""
    paths = [path]
    for name, command in getattr(group, "commands", {}).items():
        paths += _command_paths(command, (*path, name))
    return paths


def test_every_commands_help_says_what_it_does_in_plain_text(tmp_path: Path) -> None:
    """A line under the usage, and no reST markup: Click prints docstrings as they are, so
    ``--flag`` would show literally."""
    from fairpool.cli.main import cli

    paths = _command_paths(cli)
    assert len(paths) > 40 and ("config", "diff") in paths
    for path in paths:
        shown = fairpool(tmp_path, *path, "--help").ok().out
        usage, _, said = shown.partition("\n\n")
        assert usage.startswith("Usage: ") and "``" not in shown, (path, shown)
        assert not said.startswith("Options:"), (path, shown)
    # A list's statuses are a choice the help lists, refused before anything is asked.
    for path, statuses in ((("resource-request", "list"), "queued|allocated|released"),
                           (("workload", "list"), "queued|admitted|finished"),
                           (("operation", "list"), "pending|running|completed|aborted")):
        assert f"--status [{statuses}" in fairpool(tmp_path, *path, "--help").out, path
        refused = fairpool(tmp_path, *path, "--status", "bogus")
        assert refused.code == 2 and "'bogus' is not one of" in refused.err, refused
    assert not (tmp_path / "fairpool.db").exists()  # help opens no store


def test_a_database_a_newer_fairpool_wrote_is_one_error_line(tmp_path: Path) -> None:
    fairpool(tmp_path, "resource-pool", "list").ok()
    with sqlite3.connect(tmp_path / "fairpool.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    before = db_dump(tmp_path)
    assert_one_error(fairpool(tmp_path, "resource-pool", "list"),
                     "its schema (revision 9999) is not one this fairpool knows")
    assert db_dump(tmp_path) == before


def test_a_home_that_is_not_writable_says_so(tmp_path: Path) -> None:
    """SQLite in WAL mode makes -shm beside the file even to read: every command, reads
    too, said only "unable to open database file" of a file there and readable
    (helper-88)."""
    home = tmp_path / "home"
    home.mkdir()
    fairpool(home, "resource-pool", "list").ok()
    for sidecar in home.glob("fairpool.db-*"):
        sidecar.unlink()
    line = (f"Error: cannot open the database sqlite:///{home}/fairpool.db: unable to open "
            f"database file (its folder {home} is not writable: SQLite makes its -wal and "
            "-shm files there, even to read)")
    if os.geteuid() != 0:
        home.chmod(0o555)
        try:
            refused = fairpool(home, "resource-pool", "list")
        finally:
            home.chmod(0o755)
        assert (refused.code, refused.err_lines) == (1, [line]), refused
        return
    # root writes whatever the mode says: a read-only mount, in a mount namespace of its own.
    script = (f"mount --bind {home} {home} && mount -o remount,bind,ro {home} && "
              f"{shlex.join([sys.executable, '-m', 'fairpool.cli.main', 'resource-pool', 'list'])}")
    refused_run = subprocess.run(["unshare", "-m", "sh", "-c", script], env=cli_env(home),
                                 capture_output=True, text=True, timeout=60)
    assert (refused_run.returncode, refused_run.stderr.splitlines()) == (1, [line]), refused_run


def test_a_home_that_cannot_be_made_is_one_line_naming_it(tmp_path: Path) -> None:
    """click named `--home` when FAIRPOOL_HOME was set, a home that could not be made gave
    the OS's bare words, and the SDK raised a bare OSError (helper-88)."""
    afile = tmp_path / "afile"
    afile.touch()
    for home, problem in [(afile, "is a file, not a folder"),
                          (afile / "sub", "cannot be made: Not a directory")]:
        line = f"home: {home} {problem} (--home or FAIRPOOL_HOME)"
        assert_one_error(fairpool(home, "resource-pool", "list"), line)
        with pytest.raises(InvalidInput, match=re.escape(line)):
            Client(home=str(home))


def assert_one_error(result: Result, *needles: str) -> None:
    """Exit 1, nothing on stdout, exactly one stderr line ``Error: ...`` naming ``needles``."""
    assert result.code == 1, result
    assert result.out == "", result
    assert len(result.err_lines) == 1, result
    line = result.err_lines[0]
    assert line.startswith("Error: "), result
    for needle in needles:
        assert needle in line, (needle, line)


def setup_pool(home: Path, name: str, capacity: str, component: str) -> None:
    fairpool(home, "resource-pool", "create", name, "-c", capacity).ok()
    fairpool(home, "resource-pool", "attach-policy", name, component, "-p", "1").ok()


# -- the seed's tour, shared by the tests up to the state-changing ones ----------------------


@dataclass(frozen=True)
class Tour:
    home: Path
    pool: dict[str, Any]
    #: Allocated: the seed's step (2 GPUs, 4 CPUs, 16GiB).
    a: dict[str, Any]
    #: Allocated: 2 more GPUs, reaching the policy's limit of 4.
    b: dict[str, Any]
    #: Queued behind that limit.
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
    assert attached.err_lines == [
        f"Attached pool policy for component `{COMPONENT}` to resource pool `{POOL}` "
        "with priority 10."
    ]
    request = (*CREATE_REQUEST, COMPONENT, "-o", "json")
    # A and B fit side by side (2 + 2 GPUs <= limit 4); then C waits and D never fits.
    a, b = (r.ok().json for r in fairpool_many(home, [
        (*request, "--gpu-count", "2", "--cpu-count", "4", "--memory", "16GiB"),
        (*request, "--gpu-count", "2", "--label", "team=vision"),
    ]))
    queued, rejected = fairpool_many(home, [
        (*request, "--gpu-count", "2"),
        (*request, "--gpu-count", "10"),
    ])
    # Rejected: printed, and said by the exit code (it was 0: found by helpers 67 and 68).
    assert rejected.code == 1, rejected
    assert rejected.err_lines == [
        f"Resource request `{rejected.json['id']}` rejected: {rejected.json['status_reason']}"]
    return Tour(home, pool, a, b, queued.ok().json, rejected.json)


def test_version_and_home_option(tmp_path: Path) -> None:
    other = tmp_path / "other"
    version, listed = (
        subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=False),
        fairpool(tmp_path / "env", "--home", str(other), "resource-pool", "list", "-o", "json"),
    )
    assert version.returncode == 0
    # The schema it works with: which fairpool may open a store (helper-80: every build
    # said "0.1.0", and "open it with a newer one" could not be followed).
    assert version.stdout.strip() == "fairpool, version 0.1.0 (store schema 0018)"
    assert listed.ok().json == {
        "items": [],
        "pagination": {"index": 1, "max_size": 0, "total_pages": 1, "total": 0, "next": None},
    }
    assert (other / "fairpool.db").exists()  # --home wins over FAIRPOOL_HOME
    assert not (tmp_path / "env").exists()


def test_tour_creates_pool_and_allocates_with_zenml_resources(tour: Tour) -> None:
    assert tour.pool["name"] == POOL
    assert tour.pool["capacity"] == {"gpu": 8, "step_run": 32}
    assert tour.pool["description"] == "Shared training GPUs for the workspace"
    assert tour.a["status"] == "allocated"
    assert tour.a["pool"] == POOL
    assert tour.a["resources"] == TOUR_RESOURCES
    assert tour.b["status"] == "allocated"
    assert tour.b["labels"] == {"team": "vision"}


def test_create_says_which_requests_it_preempted(tmp_path: Path) -> None:
    """The victims' reasons name their preemptor; the one who caused it is told too."""
    fairpool(tmp_path, "resource-pool", "create", "g", "--capacity", '{"gpu": 2}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "g", "low", "-p", "1").ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "g", "high", "-p", "5").ok()
    low = [fairpool(tmp_path, "resource-request", "create", "--component", "low",
                    "--gpu-count", "1", "-o", "json").ok().json["id"] for _ in range(2)]
    high = fairpool(tmp_path, "resource-request", "create", "--component", "high",
                    "--gpu-count", "2")
    assert (f"allocated in resource pool `g`, preempting requests {low[1]}, {low[0]}."
            in " ".join(high.ok().err.split())), high.err


def test_queued_and_rejected_requests_explain_themselves(tour: Tour) -> None:
    """A queued request shows its position and reason; a hard rejection names the pool,
    the key and the numbers."""
    queued_table, queued_json, rejected_table = fairpool_many(tour.home, [
        ("resource-request", "describe", tour.c["id"]),
        ("resource-request", "describe", tour.c["id"], "-o", "json"),
        ("resource-request", "describe", tour.d["id"]),
    ])
    assert tour.c["status"] == "queued"
    (place,) = queued_json.ok().json["queue"]
    assert place["pool"] == POOL
    assert place["position"] == 1
    assert "gpu" in place["reason"] and "limit 4" in place["reason"], place
    out = queued_table.ok().out
    for text in ("queued", "POSITION", "REASON", POOL, place["reason"]):
        assert text in out, text

    assert tour.d["status"] == "rejected"
    reason = tour.d["status_reason"]
    for text in (POOL, "gpu", "10", "8"):
        assert text in reason, (text, reason)
    out = rejected_table.ok().out
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
    queued, active, table = fairpool_many(tour.home, [
        ("resource-pool", "requests", POOL, "--view", "queued", "-o", "json"),
        ("resource-pool", "requests", POOL, "--view", "active", "-o", "json"),
        ("resource-pool", "requests", POOL),  # --view all is the default
    ])
    assert [(r["id"], r["state"]) for r in queued.ok().json["items"]] == [(tour.c["id"], "queued")]
    assert sorted((r["id"], r["state"]) for r in active.ok().json["items"]) == sorted(
        [(tour.a["id"], "active"), (tour.b["id"], "active")]
    )
    out = table.ok().out
    for text in ("STATE", "STATUS", "COMPONENT", "RESOURCES", "POSITION", "REASON",
                 "active", "queued", "limit 4", "3 items found"):
        assert text in out, text


def test_a_table_to_a_pipe_has_a_line_a_row_and_a_narrow_one_a_record_a_row(
    tour: Tour,
) -> None:
    """Piped with no ``COLUMNS``, rich wrapped tables at 80 columns, squeezing each column to
    a few letters a line ("phy/sic/al"; found by helper-65): now each row is one line,
    however long. Too narrow for the columns' words, each row is a record of its own, no
    word broken."""
    listed = fairpool(tour.home, "resource-request", "list", "-o", "json").ok().json["items"]
    reasons = {request["id"]: reason_of(request) for request in listed}
    assert max(map(len, reasons.values())) > 40
    env = {key: value for key, value in cli_env(tour.home).items() if key != "COLUMNS"}
    code, out, err = forked_cli.run(["resource-request", "list"], env)
    assert code == 0, err
    for request in listed:
        [line] = [line for line in out.splitlines() if request["id"] in line]
        assert request["status"] in line and reasons[request["id"]] in line, line
    assert max(map(len, out.splitlines())) > 80
    code, out, err = forked_cli.run(["resource-request", "list"], {**env, "COLUMNS": "60"})
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 60
    assert [line.split()[3] for line in lines if line.split()[1:2] == ["ID"]] == [
        request["id"] for request in listed]
    for request in listed:
        words = " ".join(line.strip("│ ") for line in lines).split()
        assert all(word in words for word in reasons[request["id"]].split()), request


def test_a_description_breaks_no_word_piped_or_narrow(tour: Tour) -> None:
    """A describe table (a property a row) was wrapped at 80 columns when piped, and folded
    an id in two on a narrow terminal (found by helper-67): it is printed whole as a list
    is, and where even its words do not fit, a line per property."""
    request = tour.d
    env = {key: value for key, value in cli_env(tour.home).items() if key != "COLUMNS"}
    args = ["resource-request", "describe", request["id"]]
    code, piped, err = forked_cli.run(args, env)
    assert code == 0, err
    reason = request["status_reason"]
    assert len(reason) > 40
    assert any(request["id"] in line and line.startswith("│ ID ") for line in piped.splitlines())
    assert any(reason in line for line in piped.splitlines()), piped
    code, narrow, err = forked_cli.run(args, {**env, "COLUMNS": "64"})
    assert code == 0, err
    assert max(map(len, narrow.splitlines())) <= 64
    assert any(request["id"] in line for line in narrow.splitlines()), narrow
    code, narrower, err = forked_cli.run(args, {**env, "COLUMNS": "40"})
    assert code == 0, err
    assert f"ID: {request['id']}" in narrower.splitlines()
    assert f"REASON: {reason}" in narrower.splitlines()


def test_tables_keep_ids_whole_at_a_common_terminal_width(tour: Tour) -> None:
    """At 100 columns the other columns wrap, not the ids a user copies into a command."""
    env = {**cli_env(tour.home), "COLUMNS": "100"}
    for args, ids in (
        (("resource-request", "list"), [tour.a["id"], tour.b["id"], tour.c["id"], tour.d["id"]]),
        (("resource-pool", "requests", POOL), [tour.a["id"], tour.b["id"], tour.c["id"]]),
        (("resource-pool", "list"), [tour.pool["id"]]),
    ):
        code, out, err = forked_cli.run(list(args), env)
        assert code == 0, err
        assert max(map(len, out.splitlines())) <= 100
        for request_id in ids:
            assert request_id in out, (args, request_id, out)


def test_tables_print_what_others_wrote_as_text(tmp_path: Path) -> None:
    """A label value holding an escape sequence or a bidirectional override is shown escaped,
    and a name holding rich's markup as it is: neither rewrites the reader's terminal."""
    home = tmp_path / "home"
    fairpool(home, "resource-pool", "create", "[bold red]loud", "-c", '{"gpu": 1}').ok()
    fairpool(home, "resource-pool", "attach-policy", "[bold red]loud", "orch", "-p", "1").ok()
    created = fairpool(home, *CREATE_REQUEST, "orch", "--gpu-count", "1",
                       "--label", "note=v\x1b[2J\u202eX", "-o", "json").ok().json
    assert created["labels"] == {"note": "v\x1b[2J\u202eX"}  # kept as written
    for args in (("resource-pool", "describe", "[bold red]loud"),
                 ("resource-pool", "requests", "[bold red]loud", "--view", "all"),
                 ("resource-request", "describe", created["id"])):
        out = fairpool(home, *args).ok().out
        assert "\x1b" not in out and "\u202e" not in out, (args, out)
    described = fairpool(home, "resource-request", "describe", created["id"]).out
    assert "note v\\x1b[2J\\u202eX" in described
    assert "Resource pool '[bold red]loud'" in fairpool(
        home, "resource-pool", "describe", "[bold red]loud").out


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


def test_a_requests_events_are_its_history(tour: Tour) -> None:
    """Rejected at once: created, then rejected with the reason the request carries."""
    table, data = fairpool_many(tour.home, [
        ("resource-request", "events", tour.d["id"][:8]),
        ("resource-request", "events", tour.d["id"], "-o", "json"),
    ])
    items = data.ok().json["items"]
    assert [(e["kind"], e["request_id"]) for e in items] == [
        ("created", tour.d["id"]), ("rejected", tour.d["id"])]
    assert items[-1]["message"] == tour.d["status_reason"]
    out = table.ok().out
    for text in ("AT", "KIND", "MESSAGE", "request created", "rejected"):
        assert text in out, text


def test_every_output_format_parses(tour: Tour) -> None:
    """JSON and YAML for each read command not covered above, tables where no other test
    reads them; YAML and JSON carry the same document."""
    policies = ("resource-pool", "list-policies", POOL)
    by_component = ("resource-pool", "list-policies", "--component", COMPONENT)
    filtered = ("resource-request", "list", "--status", "queued", "--pool", POOL)
    requests = ("resource-request", "list")
    second_page = (*requests, "--size", "3", "--page", "2")
    calls = [
        (*second_page, "-o", "json"), second_page, (*requests, "--size", "2", "--page", "3"),
        (*policies, "-o", "json"), (*policies, "-o", "yaml"), policies,
        (*by_component, "-o", "json"),
        (*filtered, "-o", "json"),
        (*requests, "-o", "yaml"), requests,
        ("resource-pool", "list", "-o", "yaml"),
        ("resource-pool", "describe", POOL, "-o", "yaml"),
        ("resource-request", "describe", tour.a["id"], "-o", "yaml"),
        ("reconcile", "-o", "json"), ("reconcile", "-o", "yaml"), ("reconcile",),
    ]
    r = dict(zip(calls, fairpool_many(tour.home, calls), strict=True))

    page = r[(*policies, "-o", "json")].ok().json
    assert r[(*policies, "-o", "yaml")].ok().yaml == page
    assert page["pagination"] == {"index": 1, "max_size": 1, "total_pages": 1, "total": 1,
                                  "next": None}
    assert [(p["component"], p["priority"], p["reserved"], p["limit"]) for p in page["items"]] \
        == [(COMPONENT, 10, {"gpu": 2}, {"gpu": 4})]
    assert r[(*by_component, "-o", "json")].ok().json == page
    assert [i["id"] for i in r[(*filtered, "-o", "json")].ok().json["items"]] == [tour.c["id"]]

    listed = r[(*requests, "-o", "yaml")].ok().yaml
    assert listed["pagination"]["total"] == len(listed["items"]) == 4
    paged = r[(*second_page, "-o", "json")].ok().json
    assert paged == {"items": listed["items"][3:], "pagination": {
        "index": 2, "max_size": 3, "total_pages": 2, "total": 4, "next": None}}
    assert "Page (2/2), 4 items found for the applied filters." in r[second_page].ok().out
    assert r[(*requests, "--size", "2", "--page", "3")].ok().out.strip() == (
        "Page (3/2) is empty: 4 items found for the applied filters.")
    pools = r[("resource-pool", "list", "-o", "yaml")].ok().yaml
    assert [p["occupied"] for p in pools["items"]] == [{"gpu": 4, "step_run": 2}]
    assert r[("resource-pool", "describe", POOL, "-o", "yaml")].ok().yaml["name"] == POOL
    described = r[("resource-request", "describe", tour.a["id"], "-o", "yaml")].ok().yaml
    assert described["resources"] == TOUR_RESOURCES

    summary = r[("reconcile", "-o", "json")].ok().json
    assert summary.keys() == r[("reconcile", "-o", "yaml")].ok().yaml.keys()
    assert summary.keys() >= {"granted", "preempted", "rejected", "waiting"}
    assert summary["granted"] == [] and summary["waiting"] == 1

    for table, total in ((policies, 1), (requests, 4)):
        out = r[table].ok().out
        noun = "item" if total == 1 else "items"
        assert f"Page (1/1), {total} {noun} found for the applied filters." in out
        assert "ID" in out and "COMPONENT" in out
    # Counts of what it changed (it printed "waits" and "created", the metrics' inputs).
    table = r[("reconcile",)].ok().out
    assert "Reconcile pass" in table and "STILL QUEUED" in table
    assert "WAITS" not in table and "CREATED" not in table


def test_a_list_filtered_to_a_pool_gives_the_reason_there(tmp_path: Path) -> None:
    """A request queued on two pools showed its first pool's reason in a list filtered to
    the other; its description showed position 0 for a pool that can never serve it, which
    reads as the head of the queue (found by helper-66)."""
    for pool, capacity in (("X", '{"gpu": 1}'), ("Y", '{"gpu": 1}'), ("Z", '{"fpga": 1}')):
        fairpool(tmp_path, "resource-pool", "create", pool, "-c", capacity).ok()
        fairpool(tmp_path, "resource-pool", "attach-policy", pool, "dual", "-p", "1").ok()
    made = [fairpool(tmp_path, "resource-request", "create", "--component", "dual",
                     "--gpu-count", "1", "-o", "json").ok().json for _ in range(3)]
    for pool in ("X", "Y"):
        listed = fairpool(tmp_path, "resource-request", "list", "--status", "queued",
                          "--pool", pool).ok().out
        assert f"policy dual on {pool}: gpu requested 1, in use 1 of limit 1" in listed, listed
    described = fairpool(tmp_path, "resource-request", "describe", made[2]["id"]).ok().out
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in described.splitlines() if line.count("│") == 5}
    assert (rows["X"], rows["Y"], rows["Z"]) == ("1", "1", "-"), described


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
    (("resource-pool", "create", "p2", "-c", "gpu=8"), ("capacity", "gpu=8", "mapping")),
    (("resource-pool", "create", "p2", "-c", '{"gpu": [8'), ("capacity", '{"gpu": [8')),
    (("resource-pool", "create", "p2", "-c", "[" * 2000 + "]" * 2000),
     ("capacity: nested too deeply",)),  # JSON's and YAML's parsers recurse per level
    # Nothing is a date (2024-13-45 was a ValueError): text, refused as text.
    (("resource-pool", "create", "p2", "-c", "{gpu: 2024-13-45}"),
     ("capacity.gpu: must be an integer (got '2024-13-45')",)),
    (("resource-pool", "create", "p2", "-c", '{"gpu": %s}' % ("9" * 5000)),
     ("capacity: is not valid YAML: Exceeds the limit (4300 digits)",)),
    (("resource-pool", "update", POOL, "-c", '{"gpu": -1}'), ("capacity.gpu", "-1")),
    ((*CREATE_REQUEST, COMPONENT, "--memory", "1.5GB"), ("memory", "1.5GB")),
    # In words, not pydantic's pattern, with the spelling meant where it is plain (helper-83).
    ((*CREATE_REQUEST, COMPONENT, "--memory", "16G"), (
        "memory: must be a whole number and a unit, one of KB, KiB, MB, MiB, GB, GiB, TB, TiB, "
        "PB, PiB (got '16G'; did you mean '16GB' or '16GiB'?)",)),
    ((*CREATE_REQUEST, COMPONENT, "--memory", "16gib"), ("(got '16gib'; did you mean '16GiB'?)",)),
    ((*CREATE_REQUEST, COMPONENT, "--memory", "16"), (
        "(got '16'; did you mean '16GiB' or '16MiB'?)",)),
    ((*CREATE_REQUEST, COMPONENT, "--pool-resource", "tpu=x"), ("pool_resources.tpu", "'x'")),
    ((*CREATE_REQUEST, "nobody", "--gpu-count", "1"), ("nobody",)),
    # ZenML's ResourceSettings takes these, but they count no units (its rounding overflows).
    ((*CREATE_REQUEST, COMPONENT, "--cpu-count", "inf"), ("cpu_count: must be a finite number",)),
    ((*CREATE_REQUEST, COMPONENT, "--cpu-count", "1e308"), ("cpu_count: is too large to count",)),
    ((*CREATE_REQUEST, COMPONENT, "--memory", "9" * 5000 + "GiB"), ("memory: is too large to count",)),
    ((*CREATE_REQUEST, COMPONENT, "--memory", "1" + "0" * 400 + "PB"), ("memory: is too large",)),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"gpu": 3}',
      "-l", '{"gpu": 2}'), ("reserved.gpu", "3", "2")),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"tpu": 1}'),
     ("reserved.tpu", "tpu")),
    (("resource-pool", "attach-policy", POOL, "c2", "-p", "1", "-r", '{"gpu": 7}'),
     ("reserved.gpu", "8")),  # 2 + 7 reserved > 8
    (("resource-pool", "attach-policy", "no-such-pool", "c2", "-p", "1"), ("no-such-pool",)),
    # A filter naming no pool is said, the empty name too (it listed every request).
    (("resource-request", "list", "--pool", ""), ("no resource pool ''",)),
    (("resource-pool", "list-policies", ""), ("no resource pool ''",)),
    (("resource-pool", "create", "p\x1b[2J", "-c", '{"gpu": 1}'),
     ("name: must not contain control or other non-printing characters", "U+001B")),
]


@dataclass(frozen=True)
class BadRun:
    before: list[str]
    after: list[str]
    results: dict[tuple[str, ...], Result]


@pytest.fixture(scope="module")
def bad_run(tour: Tour) -> BadRun:
    """Every bad call at once: they are independent, and all of them must write nothing."""
    before = db_dump(tour.home)
    calls = [args for args, _ in BAD_INPUT]
    results = dict(zip(calls, fairpool_many(tour.home, calls), strict=True))
    return BadRun(before, db_dump(tour.home), results)


@pytest.mark.parametrize(
    ("args", "needles"), BAD_INPUT,
    ids=[f"{i}-{' '.join(args[:2])}" for i, (args, _) in enumerate(BAD_INPUT)],
)
def test_bad_input_is_one_error_line(
    bad_run: BadRun, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    assert_one_error(bad_run.results[args], *needles)


def test_bad_input_writes_nothing(tour: Tour, bad_run: BadRun) -> None:
    """Not a row changed in any table, and ``list`` still shows the tour's state."""
    assert bad_run.after == bad_run.before
    pools, requests = fairpool_many(tour.home, [
        ("resource-pool", "list", "-o", "json"), ("resource-request", "list", "-o", "json"),
    ])
    assert [(p["name"], p["capacity"]) for p in pools.ok().json["items"]] == [
        (POOL, {"gpu": 8, "step_run": 32})
    ]
    assert sorted(r["id"] for r in requests.ok().json["items"]) == sorted(
        r["id"] for r in (tour.a, tour.b, tour.c, tour.d)
    )


def test_a_database_that_cannot_be_opened_is_one_error_line(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """Not there, not listening, not a database: the server and the commands that open a
    database say so in one line, the password hidden."""
    missing = postgres.url("fairpool_no_such_database").replace("postgres@", "postgres:pw@")
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("not a database")
    not_listening = "postgresql+psycopg://postgres@127.0.0.1:1/x"

    def module_server(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fairpool.api", "--port", str(free_port()), *args],
            env={**cli_env(tmp_path), **env}, capture_output=True, text=True, timeout=60,
            check=False,
        )

    server, tokens, module, module_env = (
        fairpool(tmp_path, "server", "--port", str(free_port()), "--database-url", missing),
        fairpool(tmp_path, "token", "list", "--database-url", f"sqlite:///{not_a_database}"),
        module_server(["--database-url", not_listening], {}),
        # Read as `fairpool server` reads it: before, the module served the SQLite store.
        module_server([], {"FAIRPOOL_DATABASE_URL": not_listening}),
    )
    assert_one_error(server, "cannot open the database", "postgres:***@",
                     'database "fairpool_no_such_database" does not exist')
    # The driver's words end the line (a check of SQLite's folder added "False": helper-91).
    assert server.err_lines[0].endswith('database "fairpool_no_such_database" does not exist')
    assert_one_error(tokens, f"cannot open the database sqlite:///{not_a_database}: "
                             "file is not a database")
    for started in (module, module_env):
        assert started.returncode == 1 and started.stdout == "", started
        assert started.stderr.startswith(f"Error: cannot open the database {not_listening}"), \
            started.stderr
        assert len(started.stderr.strip().splitlines()) == 1, started.stderr


def test_a_sqlite_url_into_no_directory_is_refused_and_a_home_is_made(tmp_path: Path) -> None:
    """A mistyped SQLite path made its directories and an empty store, read as "No
    resource pools found." (found by helper-67); the home is made, however deep."""
    missing = tmp_path / "no" / "such"
    refused = fairpool(tmp_path, "--database-url", f"sqlite:///{missing}/x.db",
                       "resource-pool", "list")
    assert_one_error(refused, f"database-url: {missing} is not a directory")
    assert not (tmp_path / "no").exists()
    fairpool(tmp_path / "deep" / "er", "resource-pool", "list").ok()
    assert (tmp_path / "deep" / "er" / "fairpool.db").exists()


def test_every_command_works_on_the_database_it_is_given(tmp_path: Path, database_url: str
                                                         ) -> None:
    """FAIRPOOL_DATABASE_URL and --database-url were read by `server` and `token` only: every
    other command opened the store under --home, so a user who exported the server's
    PostgreSQL saw another, empty, store."""
    home = tmp_path / "home"
    env = {**cli_env(home), "FAIRPOOL_DATABASE_URL": database_url}

    def on_env(*args: str) -> Result:
        code, out, err = forked_cli.run(list(args), env, None)
        return Result(args, code, out, err)

    on_env("resource-pool", "create", "gpus", "--capacity", '{"gpu": 2}').ok()
    on_env("resource-pool", "attach-policy", "gpus", "team-a", "-p", "1").ok()
    held = on_env("run", "--component", "team-a", "--gpu-count", "2", "--",
                  sys.executable, "-c", "import os; print(os.environ['FAIRPOOL_RESOURCES'])")
    assert json.loads(held.ok().out.strip().splitlines()[-1])["gpu"] == 2
    made = fairpool(home, "--database-url", database_url, "token", "create", "--role", "admin",
                    "-o", "json").ok().json
    listed = fairpool(home, "--database-url", database_url, "resource-pool", "list", "-o", "json")
    assert [p["name"] for p in listed.ok().json["items"]] == ["gpus"]
    assert made["id"] in fairpool(home, "--database-url", database_url, "token", "list").ok().out
    assert fairpool(home, "resource-pool", "list", "-o", "json").ok().json["items"] == []
    client = Client(database_url=database_url)
    try:
        assert [r.status for r in client.list_requests()] == ["released"]
    finally:
        client.close()


def test_a_server_and_a_database_pick_one(tmp_path: Path) -> None:
    """One given on the command line wins over the environment, where the server wins (the
    database is for `server` and `token`); --url and --database-url together are an error.
    An unusable server URL shows which one a command took, a pool only one store has which
    store."""
    database = f"sqlite:///{tmp_path / 'f.db'}"
    env = {**cli_env(tmp_path), "FAIRPOOL_URL": "nota-url", "FAIRPOOL_DATABASE_URL": database}

    def run(*args: str, **drop: str) -> Result:
        code, out, err = forked_cli.run([*args, "resource-pool", "list"],
                                        {k: v for k, v in env.items() if k not in drop}, None)
        return Result(args, code, out, err)

    server_taken = "url: must be http:// or https:// and a host"
    assert_one_error(run(), server_taken)
    assert_one_error(run("--url", "nota-url", FAIRPOOL_URL=""), server_taken)
    assert run("--database-url", database).ok().out.startswith("No resource pools found")
    home = tmp_path / "home"
    assert run("--home", str(home)).ok().out.startswith("No resource pools found")
    assert run("--home", str(home), FAIRPOOL_URL="").ok().out.startswith("No resource pools")
    assert (home / "fairpool.db").is_file()
    # `token` opens the database whichever server the commands go to, unless --home is given.
    env["FAIRPOOL_URL"] = "http://127.0.0.1:1"
    for args in (["token"], ["--home", str(home), "token"]):
        code, _, err = forked_cli.run([*args, "create", "--role", "admin", "--name", args[0]],
                                      env, None)
        assert code == 0, err
    listed = [forked_cli.run([*where, "token", "list", "-o", "json"], env, None)[1]
              for where in (["--database-url", database], ["--home", str(home)])]
    assert [[t["name"] for t in json.loads(out)["items"]] for out in listed] == [["token"], ["--home"]]
    assert_one_error(run("--url", "http://127.0.0.1:1", "--database-url", database),
                     "database-url: give a server (url 'http://127.0.0.1:1') or a database, "
                     "not both")
    refused = run("--url", "http://127.0.0.1:1", "--database-url", "postgresql://me:pw@db/fp")
    assert_one_error(refused, "(got 'postgresql://me:***@db/fp')")
    # `server` serves a database: a --url given to it was ignored, and the store under the
    # home served instead. (A port already taken: before, the server failed to bind there.)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, out, err = forked_cli.run(
            ["--url", "http://127.0.0.1:1", "server", "--port", port], env, None)
    assert (code, out) == (2, ""), err
    assert err.splitlines()[-1].startswith(
        "Error: --url 'http://127.0.0.1:1': a server serves a database, it does not talk to "
        "another server; choose the database with --home or --database-url"), err


def test_usage_errors_keep_click_exit_code(tour: Tour) -> None:
    (missing, bad_choice, no_number, forever, no_value, no_output, no_size,
     no_page, past_every_page) = fairpool_many(tour.home, [
        ("resource-pool", "create", "p3"),
        ("resource-pool", "requests", POOL, "--view", "sideways"),
        # click's FloatRange lets NaN through: a deadline that never comes.
        (*CREATE_REQUEST, COMPONENT, "--gpu-count", "1", "--wait", "--timeout", "nan"),
        ("run", "--component", COMPONENT, "--grace", "inf", "--", "true"),
        # click's parser raises these without the command's context: it said 'fairpool -h'.
        ("resource-pool", "create", "p3", "--capacity"),
        ("--home", str(tour.home), "token", "list", "-o"),
        ("resource-request", "list", "--page", "2"),
        ("resource-request", "list", "--size", "3", "--page", "0"),
        # Its offset past the largest: the service named "offset", which nobody typed.
        ("resource-request", "list", "--size", "5", "--page", str(2**62)),
    ])
    assert missing.code == 2 and "--capacity" in missing.err
    assert bad_choice.code == 2 and "sideways" in bad_choice.err
    assert no_number.code == 2 and "'--timeout': nan is not a finite number" in no_number.err
    assert forever.code == 2 and "'--grace': inf is not a finite number" in forever.err
    # One line each, saying where to look (click printed a usage block above it).
    for result in (missing, bad_choice, no_number, forever):
        assert len(result.err.strip().splitlines()) == 1, result.err
    assert missing.err == ("Error: Missing option '--capacity' / '-c'. "
                           "(see 'fairpool resource-pool create -h')\n")
    assert no_value.code == 2 and no_value.err == (
        "Error: Option '--capacity' requires an argument. "
        "(see 'fairpool resource-pool create -h')\n")
    assert no_output.code == 2 and no_output.err == (
        "Error: Option '-o' requires an argument. (see 'fairpool token list -h')\n")
    assert no_size.code == 2 and no_size.err == (
        "Error: --page needs --size. (see 'fairpool resource-request list -h')\n")
    assert no_page.code == 2 and no_page.err == (
        "Error: Invalid value for '--page': 0 is not in the range x>=1. "
        "(see 'fairpool resource-request list -h')\n")
    assert past_every_page.code == 2 and past_every_page.err == (
        f"Error: Invalid value for '--page': {2**62} is past any list's last page. "
        "(see 'fairpool resource-request list -h')\n")


# -- state-changing tests ----------------------------------------------------------------


def test_release_returns_units(tour: Tour) -> None:
    """Last on the tour's home: releasing A lets C (queued behind the limit) in; releasing
    the rest empties the pool; releasing twice is an error."""
    released = fairpool(tour.home, "resource-request", "release", tour.a["id"][:8]).ok()
    assert released.err_lines == [f"Released resource request `{tour.a['id']}`."]
    status = {
        r["id"]: r["status"]
        for r in fairpool(tour.home, "resource-request", "list", "-o", "json").ok().json["items"]
    }
    assert (status[tour.a["id"]], status[tour.c["id"]]) == ("released", "allocated")
    for result in fairpool_many(tour.home, [
        ("resource-request", "release", tour.b["id"]),
        ("resource-request", "release", tour.c["id"]),
    ]):
        result.ok()
    pools, again = fairpool_many(tour.home, [
        ("resource-pool", "list", "-o", "json"),
        ("resource-request", "release", tour.a["id"]),
    ])
    (pool,) = pools.ok().json["items"]
    assert pool["occupied"] == {"gpu": 0, "step_run": 0}
    assert pool["queue_length"] == 0
    assert_one_error(again, tour.a["id"], "released")


def test_pool_update_detach_and_delete(tmp_path: Path) -> None:
    """update: nothing to do, or new values (0 removes a key); detach-policy; delete asks
    first, and "n" keeps the pool."""
    fairpool(tmp_path, "resource-pool", "create", "scratch", "-c", "{gpu: 8, tpu: 2}").ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "scratch", "op", "-t", "step_operator",
             "-p", "5").ok()
    detached = fairpool(tmp_path, "resource-pool", "detach-policy", "scratch", "op",
                        "--component-type", "step_operator").ok()
    assert detached.err_lines == [
        "Detached pool policy for component `op` from resource pool `scratch`."
    ]
    nothing = fairpool(tmp_path, "resource-pool", "update", "scratch").ok()
    assert nothing.out == "" and nothing.err_lines == ["No updates specified."]
    typo = fairpool(tmp_path, "resource-pool", "update", "scratc")  # was "No updates" too, 0
    assert (typo.code, typo.err_lines) == (1, ["Error: no resource pool 'scratc'"])
    unnamed = fairpool(tmp_path, "resource-pool", "list-policies")
    assert unnamed.code == 2 and unnamed.err_lines == [
        "Error: Specify a resource pool, a component (--component), or both. "
        "(see 'fairpool resource-pool list-policies -h')"], unnamed
    updated = fairpool(
        tmp_path, "resource-pool", "update", "scratch", "-c", '{"gpu": 4, "tpu": 0}',
        "-d", "smaller", "-o", "json",
    ).ok().json
    assert (updated["capacity"], updated["description"]) == ({"gpu": 4}, "smaller")

    declined = fairpool(tmp_path, "resource-pool", "delete", "scratch", input="n\n").ok()
    policies = fairpool(tmp_path, "resource-pool", "list-policies", "scratch").ok()
    assert policies.out.strip() == "No policies found."
    assert "Are you sure you want to delete resource pool `scratch`?" in declined.err
    # stdin is no terminal, so the answer is not echoed and the message follows the prompt.
    assert declined.err.rstrip().endswith("Resource pool deletion canceled.")
    still = fairpool(tmp_path, "resource-pool", "list", "-o", "json").ok().json["items"]
    assert [p["name"] for p in still] == ["scratch"]
    fairpool(tmp_path, "resource-pool", "delete", "scratch", "-y").ok()
    assert fairpool(tmp_path, "resource-pool", "list", "-o", "json").ok().json["items"] == []


def test_wait(tmp_path: Path) -> None:
    """--wait: exit 1 when rejected, 0 once allocated (here after a release by someone else),
    2 on timeout; meanwhile the position and reason are shown on stderr."""
    setup_pool(tmp_path, "solo", '{"gpu": 1}', "orch")
    create = (*CREATE_REQUEST, "orch", "--gpu-count")
    rejected, holder = fairpool_many(tmp_path, [
        (*create, "2", "--wait"),
        (*create, "1", "--wait", "-o", "json"),
    ])
    assert rejected.code == 1
    assert rejected.err_lines[-1].startswith("Error: Resource request `")
    assert "was rejected" in rejected.err_lines[-1] and "solo" in rejected.err_lines[-1]
    assert holder.ok().json["status"] == "allocated"

    waiter = subprocess.Popen(
        [*CLI, *create, "1", "--wait", "--timeout", "60", "-o", "json"], env=cli_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert waiter.stderr is not None
        seen = []
        for line in waiter.stderr:  # up to the first progress line
            seen.append(line)
            if line.startswith("Waiting for resource request"):
                break
        assert seen and "position 1 in pool `solo`" in seen[-1], seen
        fairpool(tmp_path, "resource-request", "release", holder.json["id"]).ok()
        out, _ = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait()
    assert waiter.returncode == 0
    assert json.loads(out)["status"] == "allocated"

    started = time.monotonic()
    timed_out = fairpool(tmp_path, *create, "1", "--wait", "--timeout", "0.5", "-o", "json")
    assert timed_out.code == 2
    assert time.monotonic() - started < 20
    assert any(line.startswith("Waiting for resource request") and "position 1" in line
               for line in timed_out.err_lines), timed_out.err
    assert timed_out.err_lines[-1].startswith("Error: timed out waiting for resource request")
    still_queued = json.loads(timed_out.out)
    assert still_queued["status"] == "queued"
    cancelled = fairpool(tmp_path, "resource-request", "cancel", still_queued["id"][:8]).ok()
    assert cancelled.err_lines == [f"Cancelled resource request `{still_queued['id']}`."]


# -- concurrency -------------------------------------------------------------------------


@pytest.mark.long
def test_concurrent_clients_lose_nothing_and_never_overcommit(tmp_path: Path) -> None:
    """8 CLI clients at once, 5 one-GPU requests each, on a 4-GPU pool: 40 requests, 4
    allocated, 36 queued. Then the queue drains, oldest first, as units come back."""
    setup_pool(tmp_path, "four", '{"gpu": 4}', "orch")
    failures: list[Result] = []

    def client() -> None:
        for _ in range(5):
            result = fairpool(tmp_path, *CREATE_REQUEST, "orch", "--gpu-count", "1", "-o", "json")
            if result.code != 0 or result.json["status"] not in ("allocated", "queued"):
                failures.append(result)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []

    def by_status() -> dict[str, list[str]]:
        items = fairpool(tmp_path, "resource-request", "list", "-o", "json").ok().json["items"]
        grouped: dict[str, list[str]] = {}
        for item in sorted(items, key=lambda r: (r["created"], r["id"])):
            grouped.setdefault(item["status"], []).append(item["id"])
        return grouped

    state = by_status()
    assert {k: len(v) for k, v in state.items()} == {"allocated": 4, "queued": 36}
    oldest_queued = state["queued"][:4]
    for result in fairpool_many(
        tmp_path, [("resource-request", "release", rid) for rid in state["allocated"]]
    ):
        result.ok()
    summary = fairpool(tmp_path, "reconcile", "-o", "json").ok().json
    assert summary["waiting"] == 32
    state = by_status()
    assert {k: len(v) for k, v in state.items()} == {"allocated": 4, "queued": 32, "released": 4}
    assert sorted(state["allocated"]) == sorted(oldest_queued)

    # The other 32 through the service itself: 36 more CLI start-ups would dominate the run.
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
    assert {k: len(v) for k, v in by_status().items()} == {"released": 40}


def test_a_request_keeps_its_units_unless_given_a_lease(tmp_path: Path) -> None:
    """Plain CLI requests have no holder to heartbeat: held until released, unless
    ``--lease-ttl`` is given, when the units go back after that many seconds."""
    fairpool(tmp_path, "resource-pool", "create", "p", "-c", '{"gpu": 2}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "p", "orch", "-p", "1").ok()
    create = (*CREATE_REQUEST, "orch", "--gpu-count", "1", "-o", "json")
    kept = fairpool(tmp_path, *create).ok().json
    leased = fairpool(tmp_path, *create, "--lease-ttl", "1").ok().json
    assert (kept["lease_ttl"], kept["lease_expires_at"]) == (None, None)
    assert leased["lease_ttl"] == 1
    expires = datetime.fromisoformat(leased["lease_expires_at"])
    assert expires - datetime.fromisoformat(leased["allocated_at"]) == timedelta(seconds=1)
    time.sleep(1.5)
    # No write since: the read runs the pass that releases it (as a server's tick would);
    # before, it showed allocated, its units occupied, until the next write.
    pool = fairpool(tmp_path, "resource-pool", "describe", "p", "-o", "json").ok().json
    assert pool["occupied"] == {"gpu": 1}
    status = {r["id"]: r for r in fairpool(tmp_path, "resource-request", "list", "-o", "json").ok().json["items"]}
    assert status[kept["id"]]["status"] == "allocated"
    assert status[leased["id"]]["status"] == "released"
    assert status[leased["id"]]["status_reason"].startswith("lease expired")
    # Out of range on either side: the same usage error naming the option (above the
    # top it was the service's `lease_ttl: must be at most ...`, exit 1).
    for option, value in [("--lease-ttl", "0"), ("--lease-ttl", "2592001"),
                          ("--max-retries", "-1"), ("--max-retries", "1001")]:
        bad = fairpool(tmp_path, *create, option, value)
        assert bad.code == 2 and f"Invalid value for '{option}': {value} is not in the range" in bad.err


def test_the_cli_starts_without_what_only_some_commands_need() -> None:
    """Every command is a Python start-up: the CLI's entry module loads neither the database
    layer nor the HTTP models (a remote command needs neither), nor YAML and the config
    front-end (only ``config`` commands do), nor asyncio."""
    heavy = ["sqlalchemy", "pydantic", "httpx", "yaml", "asyncio", "fairpool.frontends.config",
             "fairpool.service"]
    run = subprocess.run(
        [sys.executable, "-c", "import json, sys; import fairpool.cli.main; "
         f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert json.loads(run.stdout) == [], run.stdout


@pytest.mark.parametrize("command", [("apply", "-f", "{mine}"), ("rollback", "--version", "1")])
def test_a_confirmed_config_change_is_refused_if_another_came_first(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """The change shown and confirmed is the one made: another admin's version applied while
    the question waited was undone by it, and nobody was shown its queue going."""
    mine, theirs = tmp_path / "mine.yaml", tmp_path / "theirs.yaml"
    mine.write_text("resource_queues: [{name: mine}]\nscheduling_rules: [{resource_queue: mine}]\n")
    theirs.write_text("resource_queues: [{name: theirs}]\n"
                      "scheduling_rules: [{resource_queue: theirs}]\n")
    fairpool(tmp_path, "config", "apply", "-f", str(mine), "--yes").ok()
    asking = subprocess.Popen(
        [*CLI, "config", *(part.format(mine=mine) for part in command)], env=cli_env(tmp_path),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert asking.stderr is not None and asking.stdin is not None
        shown = ""
        while "as a new version?" not in shown:  # the question has no newline
            char = asking.stderr.read(1)
            assert char, shown
            shown += char
        fairpool(tmp_path, "config", "apply", "-f", str(theirs), "--yes").ok()  # version 2
        _, err = asking.communicate("y\n", timeout=60)
    finally:
        if asking.poll() is None:
            asking.kill()
        asking.wait()
    assert asking.returncode == 1, err
    assert err.splitlines()[-1] == (
        "Error: the active scheduler config changed meanwhile: it is version 2, not version 1 "
        "(based_on); nothing applied: look at it again and re-apply")
    versions = fairpool(tmp_path, "config", "list", "-o", "json").ok().json["items"]
    assert [(v["version"], v["active"]) for v in versions] == [(2, True), (1, False)]


def test_a_database_locked_too_long_is_one_error_line(tmp_path: Path) -> None:
    """SQLite's "database is locked" after the busy timeout was a traceback (many processes
    writing one store at once). The error is real: another connection holds the write lock
    and this one does not wait (a timeout of 0 instead of the CLI's 30 s)."""
    from click.testing import CliRunner
    from sqlalchemy import create_engine, text

    from fairpool.cli.main import FairpoolGroup

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    group = FairpoolGroup("t")

    @group.command()
    def write() -> None:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER)"))

    try:
        result = CliRunner().invoke(group, ["write"])
    finally:
        engine.dispose()
        holder.close()
    assert (result.exit_code, result.output.splitlines()) == (1, [
        "Error: the database stayed locked by another process for 30 s (a long write, or "
        "many writing at once)"]), result.output


def test_config_apply_refuses_a_name_that_would_forge_a_line_in_the_diff(tmp_path: Path) -> None:
    """A queue name with a newline and ESC printed as a line of the diff of its own
    (``- queue prod: removed``) and coloured the table; it is refused, naming the field."""
    path = tmp_path / "forged.yaml"
    path.write_text('resource_queues:\n  - name: "ok\\n  - queue prod: removed\\e[31m"\n'
                    "  - name: prod\nscheduling_rules: [{resource_queue: prod}]\n")
    result = fairpool(tmp_path, "config", "apply", "-f", str(path), "--yes")
    assert result.code == 1, result
    assert result.err_lines == [
        f"Error: {path} is not a valid scheduler config (1 problem):",
        "resource_queues[0].name: must not contain control or other non-printing characters "
        "(got 'ok\\n  - queue prod: removed\\x1b[31m', with U+000A)"]
    assert fairpool(tmp_path, "config", "list", "-o", "json").ok().json["items"] == []


def test_config_apply_says_which_running_workloads_lost_their_queue(tmp_path: Path) -> None:
    """In a sentence whose verb agrees with the count ("1 admitted workload ... keep running")."""
    kept, gone = tmp_path / "kept.yaml", tmp_path / "gone.yaml"
    kept.write_text("resource_queues: [{name: a}, {name: b}]\n"
                    "scheduling_rules: [{selector: [{key: team, operator: in, values: [x]}],\n"
                    "  resource_queue: a}, {resource_queue: b}]\n")
    gone.write_text("resource_queues: [{name: b}]\nscheduling_rules: [{resource_queue: b}]\n")
    fairpool(tmp_path, "config", "apply", "-f", str(kept), "--yes").ok()
    first, second, other = (fairpool(tmp_path, "workload", "submit", "--label", label, "-o",
                                     "json").ok().json["id"] for label in ("team=x", "team=x", "a=b"))
    fairpool(tmp_path, "workload", "release", second).ok()
    applied = fairpool(tmp_path, "config", "apply", "-f", str(gone), "--yes").ok()
    assert (f"1 admitted workload whose queue or flavor this version removes keeps running, "
            f"charged to no quota, until it ends: {first}") in applied.err, applied.err
    assert other not in applied.err


def test_queue_describe_says_unlimited_and_a_signed_zero_is_said_plainly(tmp_path: Path) -> None:
    """`queue describe` left an unlimited quota blank where `queue list` says "unlimited";
    `--gpu -0` said "must be >= 0 (got '-0')" (found by helper-69)."""
    config = tmp_path / "c.yaml"
    config.write_text("resource_flavors: [{name: f}]\n"
                      "resource_queues: [{name: q, resource_groups: [{covered_resources: "
                      "[gpu, cpu], flavors: [{name: f, resources: [{name: gpu, "
                      "nominal_quota: 2}]}]}]}]\nscheduling_rules: [{resource_queue: q}]\n")
    fairpool(tmp_path, "config", "apply", "-f", str(config), "--yes").ok()
    workload = fairpool(tmp_path, "workload", "submit", "--gpu", "1", "--cpu", "3", "-o",
                        "json").ok().json["id"]
    # Its id has a row of its own, as a request's: whole on a narrow terminal too.
    code, narrow, err = forked_cli.run(["workload", "describe", workload],
                                       {**cli_env(tmp_path), "COLUMNS": "40"})
    assert code == 0 and f"ID: {workload}" in narrow.splitlines(), (err, narrow)
    described = fairpool(tmp_path, "queue", "describe", "q").ok().out
    rows = [line.split("│")[1:-1] for line in described.splitlines() if line.count("│") == 6]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["f", "gpu", "1", "2", "1"], ["f", "cpu", "3", "unlimited", "1"]], described
    assert_one_error(fairpool(tmp_path, "workload", "submit", "--gpu", "-0"),
                     "demand.gpu: must be >= 0, unsigned (got '-0')")


def test_config_apply_an_equivalent_queue_spec_is_no_change(tmp_path: Path) -> None:
    """Unset preemption is ``never``: spelling it out is the same queue, not a change."""
    plain, spelt = tmp_path / "plain.yaml", tmp_path / "spelt.yaml"
    plain.write_text("resource_queues:\n  - name: p\nscheduling_rules: [{resource_queue: p}]\n")
    spelt.write_text("resource_queues:\n  - name: p\n    preemption: {within_resource_queue: never}\n"
                     "scheduling_rules: [{resource_queue: p}]\n")
    fairpool(tmp_path, "config", "apply", "-f", str(plain), "--yes").ok()
    asked = fairpool(tmp_path, "config", "apply", "-f", str(spelt), input="y\n").ok()
    assert "No change from the config in force" in asked.err, asked.err
    assert "spec changed" not in asked.err


@pytest.mark.parametrize("yes", [True, False], ids=["--yes", "asked"])
def test_config_apply_a_changed_queue_is_refused_before_the_change_is_shown(
    tmp_path: Path, yes: bool
) -> None:
    plain, changed = tmp_path / "plain.yaml", tmp_path / "changed.yaml"
    plain.write_text("resource_queues:\n  - name: p\nscheduling_rules: [{resource_queue: p}]\n")
    changed.write_text("resource_queues:\n  - name: p\n    preemption: {within_resource_queue: "
                       "lower_priority}\nscheduling_rules: [{resource_queue: p}]\n")
    fairpool(tmp_path, "config", "apply", "-f", str(plain), "--yes").ok()
    result = fairpool(tmp_path, "config", "apply", "-f", str(changed),
                      *(["--yes"] if yes else []), input="y\n")
    assert result.code == 1, result
    # Nothing shown as a change, nothing asked: the error only.
    assert result.err_lines == [
        f"Error: {changed} is not a valid scheduler config (1 problem):",
        "resource_queues[0].preemption: queue 'p' differs from its spec in version 1; a queue's "
        "spec cannot change once applied: give the changed queue a new name"]
    assert len(fairpool(tmp_path, "config", "list", "-o", "json").ok().json["items"]) == 1


def test_prune_deletes_what_ended_and_says_how_much(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fairpool(home, "resource-pool", "create", "p", "-c", '{"gpu": 1}').ok()
    fairpool(home, "resource-pool", "attach-policy", "p", "c", "-p", "1").ok()
    ended = fairpool(home, *CREATE_REQUEST, "c", "--gpu-count", "1", "-o", "json").ok().json
    fairpool(home, "resource-request", "release", ended["id"]).ok()
    held = fairpool(home, *CREATE_REQUEST, "c", "--gpu-count", "1", "-o", "json").ok().json
    before = db_dump(home)
    counted = fairpool(home, "prune", "--older-than", "0", "--dry-run", "-o", "json").ok().json
    assert db_dump(home) == before
    assert (counted["dry_run"], counted["requests"], counted["events"]) == (True, 1, 3)
    table = fairpool(home, "prune", "--older-than", "0").ok().out
    assert table.splitlines()[0].strip() == "Deleted"
    assert re.search(r"│ REQUESTS +│ 1 +│", table) and re.search(r"│ EVENTS +│ 3 +│", table)
    listed = fairpool(home, "resource-request", "list", "-o", "json").ok().json["items"]
    assert [r["id"] for r in listed] == [held["id"]]
    assert fairpool(home, "prune", "--older-than", "1d", "-o", "json").ok().json["requests"] == 0
    for bad, needle in (("3x", "'3x' is not a duration"), ("36501d", "longer than 36500 days"),
                        ("٣d", "is not a duration"), ("9" * 17 + "d", "longer than 36500 days"),
                        ("30", "'30' has no unit")):
        refused = fairpool(home, "prune", "--older-than", bad)
        assert refused.code == 2 and needle in refused.err, refused
    assert "--older-than" in fairpool(home, "prune").err  # required


def test_a_wait_that_fails_otherwise_cancels_its_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait ended by a database error it cannot ride out (a full disk) left its request
    queued, to be granted to nobody (helper-78): it is cancelled, and the error said."""
    import sqlite3

    from click.testing import CliRunner
    from sqlalchemy.exc import OperationalError

    from fairpool.cli.main import cli
    from fairpool.service import Service

    fairpool(tmp_path, "resource-pool", "create", "p", "--capacity", '{"gpu": 1}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "p", "c", "--priority", "1").ok()
    fairpool(tmp_path, "resource-request", "create", "--component", "c", "--gpu-count", "1").ok()

    def full(self: Service, ref: str, seconds: float) -> None:
        raise OperationalError("INSERT ...", {}, sqlite3.OperationalError(
            "database or disk is full"))

    monkeypatch.setattr(Service, "wait", full)
    result = CliRunner().invoke(cli, [
        "--home", str(tmp_path), "resource-request", "create", "--component", "c",
        "--gpu-count", "1", "--wait"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[-1] == "Error: database error: database or disk is full", result.output
    assert re.fullmatch(r"Resource request `[\w-]+` cancelled: interrupted while waiting "
                        r"\(OperationalError\)", lines[-2]), result.output
    [waited] = fairpool(tmp_path, "resource-request", "list", "--status", "cancelled",
                        "-o", "json").ok().json["items"]
    assert waited["status_reason"] == "cancelled: interrupted while waiting (OperationalError)"


def test_a_damaged_store_is_one_error_line(tmp_path: Path) -> None:
    """Pages of the requests' table overwritten (a disk's fault): every command that reads
    them printed SQLAlchemy's traceback (helper-78)."""
    from fairpool.service import open_service

    fairpool(tmp_path, "resource-pool", "create", "p", "--capacity", '{"gpu": 100}').ok()
    fairpool(tmp_path, "resource-pool", "attach-policy", "p", "c", "--priority", "1").ok()
    svc = open_service(str(tmp_path))
    for _ in range(60):
        svc.create_request("c", demand={"gpu": 1}, labels={"note": "x" * 200})
    svc.db.close()
    path = tmp_path / "fairpool.db"
    with closing(sqlite3.connect(path)) as connection:  # the table's pages but its root
        pages = [page for (page,) in connection.execute(
            "SELECT pageno FROM dbstat WHERE name = 'request' AND pagetype = 'leaf'")]
    assert pages
    with path.open("r+b") as f:
        for page in pages:
            f.seek((page - 1) * 4096 + 8)
            f.write(b"\xff" * 3000)
    result = fairpool(tmp_path, "resource-request", "list")
    assert (result.code, result.err_lines) == (
        1, ["Error: database error: database disk image is malformed"]), result.err


@pytest.mark.parametrize("kind", ["orchestrator", "step_operator"])
def test_the_hint_for_an_unknown_component_runs_as_it_stands(tmp_path: Path, kind: str) -> None:
    """It said `fairpool resource-pool attach-policy POOL so`, which fails (`--priority` is
    required) and for a step operator attached an orchestrator's policy (helper-83). Run as
    printed but for POOL and N, it now makes the request possible."""
    fairpool(tmp_path, "resource-pool", "create", "gpus", "--capacity", '{"gpu": 1}').ok()
    create = (*CREATE_REQUEST, "my so", "-t", kind, "--gpu-count", "1")
    refused = fairpool(tmp_path, *create)
    assert refused.code == 1
    (line,) = refused.err_lines
    hint = line.partition("attach a policy first (")[2].removesuffix(")")
    assert hint.startswith("fairpool resource-pool attach-policy POOL 'my so'"), line
    words = [{"POOL": "gpus", "N": "5"}.get(word, word) for word in shlex.split(hint)]
    fairpool(tmp_path, *words[1:]).ok()
    assert fairpool(tmp_path, *create, "-o", "json").ok().json["status"] == "allocated"
