"""Remote mode against a real server (``python -m fairpool.api`` on SQLite, in a subprocess).

- The CLI through ``FAIRPOOL_URL`` prints exactly what it prints embedded, for one sequence of
  commands covering every command, output format and error class (ids and times aside). The
  sequence runs in-process with click's runner, so both transcripts cost seconds, not a Python
  start-up per command; ``fairpool run`` runs as a real subprocess.
- The SDK with ``Client(url=...)``: acquire / hold / release, a waiter woken promptly by a
  release, preemption raised in the holder within one heartbeat interval, decorator retries.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from fairpool import AsyncClient, Client, ResourceSettings
from fairpool.cli import output
from fairpool.cli.main import cli
from fairpool.client import Preempted, Rejected, WaitTimeout
from fairpool.errors import Conflict, FairpoolError, InvalidInput, NotFound, Unreachable
from fairpool.paging import Cursor
from fairpool.remote import RemoteScheduling, RemoteService, RemoteTrees
from fairpool.views import RequestView
from tests.conftest import BACKENDS, Backend
from tests.servers import API, ApiServer, clean_env, free_port, running, server_on, setup_pool


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ApiServer]:
    """One server per backend for the module's tests."""
    served = server_on(request, request.param, tmp_path_factory.mktemp("remote"), tick=0.5)
    with running(served) as (started,):
        yield started
    assert "Traceback" not in started.log()


# -- the CLI: the same output embedded and remote -------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scheduler"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")
#: Values that are measurements, not results.
MEASURED = {"seconds", "waits"}


class Normalizer:
    """Replaces ids (by order of first appearance, so the same id keeps its name), their
    8-character prefixes, and timestamps."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def text(self, value: str) -> str:
        for found in UUID.findall(value):
            self.names.setdefault(found, f"<id{len(self.names) + 1}>")
        value = UUID.sub(lambda m: self.names[m.group(0)], value)
        for full, name in self.names.items():
            value = re.sub(rf"\b{full[:8]}\b", name + "[:8]", value)
        return TIME.sub("<time>", value)

    def data(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "<measured>" if k in MEASURED else self.cursor(v) if k == "next"
                    else self.data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


    def cursor(self, value: Any) -> Any:
        """A page's cursor: the last item's time and id, opaque (base64) but for that."""
        if not isinstance(value, str):
            return value
        cursor = Cursor.parse(value)
        return f"<cursor {self.text(cursor.at.isoformat())} {self.text(cursor.id)}>"


@dataclass(frozen=True)
class Step:
    args: tuple[str, ...]
    code: int
    stdout: Any
    stderr: str


class Transcript:
    """Runs CLI commands in-process in one mode and keeps what they printed, normalized."""

    def __init__(self, env: dict[str, str | None]) -> None:
        self.runner = CliRunner()
        self.env = {"COLUMNS": "250", "NO_COLOR": "1", "FAIRPOOL_DEFAULT_OUTPUT": None,
                    "FAIRPOOL_TOKEN": None, **env}
        self.normalizer = Normalizer()
        self.steps: list[Step] = []

    def __call__(self, *args: str, input: str | None = None) -> Any:
        """Run ``fairpool ARGS``; the parsed JSON it printed (or None)."""
        result = self.runner.invoke(cli, list(args), env=self.env, catch_exceptions=False,
                                    input=input)
        data = None
        if result.stdout and ("json" in args or "yaml" in args):  # a rejection prints, exit 1
            data = yaml.safe_load(result.stdout)  # JSON is YAML
        n = self.normalizer
        self.steps.append(Step(
            tuple(n.text(a) for a in args), result.exit_code,
            n.data(data) if data is not None else n.text(result.stdout), n.text(result.stderr),
        ))
        return data


def every_command(fp: Transcript) -> None:
    """One sequence through every command, output format and error class."""
    fp("resource-pool", "create", "gpus", "-c", '{"gpu": 4, "step_run": 8}', "-d", "Shared", "-o", "json")
    fp("resource-pool", "create", "gpus", "-c", '{"gpu": 4}')                 # exists: conflict
    fp("resource-pool", "create", "bad", "-c", '{"gpu": -1}')                 # invalid value
    fp("resource-pool", "create", "bad", "-c", '{"gpu": "many"}')             # wrong type
    fp("resource-pool", "create", "", "-c", '{"gpu": 1}')                     # empty name
    fp("resource-pool", "create", "other", "-c", "gpu: 2\nmemory_mb: 1024", "-o", "yaml")
    fp("resource-pool", "attach-policy", "gpus", "team-a", "-p", "5", "-r", '{"gpu": 2}', "-l", '{"gpu": 4}')
    fp("resource-pool", "attach-policy", "gpus", "team-b", "-p", "1")
    fp("resource-pool", "attach-policy", "gpus", "team-b", "-p", "1")          # twice: conflict
    fp("resource-pool", "attach-policy", "gpus", "team-c", "-p", "1", "-r", '{"gpu": 9}')  # > capacity
    fp("resource-pool", "attach-policy", "other", "team-b", "-t", "step_operator", "-p", "2")
    fp("resource-pool", "attach-policy", "other", "team-d", "-p", "-5")        # out of range
    fp("resource-pool", "attach-policy", "other", "team-d", "-p", "2000000")
    fp("resource-pool", "list", "-o", "json")
    fp("resource-pool", "list")
    fp("resource-pool", "list-policies", "gpus", "-o", "json")
    fp("resource-pool", "list-policies", "-c", "team-b", "-o", "yaml")
    fp("resource-pool", "list-policies", "-c", "team-b", "-t", "step_operator")
    fp("resource-pool", "list-policies")                                      # usage error
    a = fp("resource-request", "create", "--component", "team-a", "--gpu-count", "2", "--memory", "1GiB",
           "--label", "run=1", "-o", "json")
    b = fp("resource-request", "create", "--component", "team-b", "--gpu-count", "2", "--max-retries", "1",
           "-o", "json")
    c = fp("resource-request", "create", "--component", "team-a", "--gpu-count", "2", "-o", "json")
    fp("resource-request", "create", "--component", "team-b", "--gpu-count", "9", "-o", "json")  # rejected
    fp("resource-request", "create", "--component", "team-b", "--gpu-count", "1", "--non-preemptible")
    fp("resource-request", "create", "--component", "nobody", "--gpu-count", "1")  # not found
    other = fp("resource-request", "create", "--component", "team-b", "--gpu-count", "1", "-t", "step_operator",
               "-o", "yaml")
    fp("resource-request", "create", "--component", "team-a", "--pool-resource", "gpu=x")   # invalid
    fp("resource-request", "create", "--component", "team-a", "--cpu-count", "inf")        # invalid
    # The API's limits are the service's: what the embedded CLI writes may be served later.
    fp("resource-pool", "create", "wide", "-c", json.dumps(SIXTY_FIVE_KEYS))     # too many keys
    fp("resource-pool", "create", "p" * 256, "-c", '{"gpu": 1}')                # name too long
    fp("resource-pool", "create", " ", "-c", '{"gpu": 1}')                      # only whitespace
    fp("resource-request", "list", "--component", "c" * 256)                    # no such name
    fp("resource-pool", "create", "wordy", "-c", '{"gpu": 1}', "-d", "d" * 4097)  # too long
    fp("resource-pool", "create", "nan", "-c", '{"gpu": NaN}')              # sent as JSON can't
    fp("resource-pool", "create", "deep", "-c", "[" * 2000 + "]" * 2000)     # nested too deeply
    fp("resource-pool", "create", "none", "-c", "{}")                          # no key
    # Refs that name nothing: not found, in the store's words (the API took them as bad input).
    for ref in (" ", "r" * 300):
        fp("resource-request", "describe", ref)
        fp("resource-pool", "describe", ref)
        fp("workload", "describe", ref)
        fp("operation", "describe", ref)
        fp("pool-tree", "show", ref)
        fp("node", "remove", ref)
    fp("resource-request", "create", "--component", "team-a", "--gpu-count", "1",
       *SIXTY_FIVE_LABELS)                                                        # too many labels
    retry = fp("resource-request", "describe", b["id"], "-o", "json")["retried_as_id"]
    fp("resource-request", "describe", retry[:8], "-o", "json")                 # by id prefix
    fp("resource-request", "describe", a["id"])
    fp("resource-request", "describe", retry)
    fp("resource-request", "describe", "ffffffff")                              # not found
    fp("resource-request", "events", b["id"])                                   # preempted
    fp("resource-request", "events", retry[:8], "-o", "json")                   # retried
    fp("resource-request", "events", "ffffffff")                                # not found
    fp("resource-request", "list", "-o", "json")
    fp("resource-request", "list")
    fp("resource-request", "list", "--status", "queued", "-o", "yaml")
    fp("resource-request", "list", "--component", "team-b", "--pool", "gpus", "-o", "json")
    fp("resource-request", "list", "--status", "bogus")                         # invalid
    fp("resource-request", "list", "--pool", "")                                # no resource pool ''
    fp("resource-request", "list", "--component", "nope")                       # a typo
    fp("resource-request", "list", "--size", "2", "--page", "2", "-o", "json")
    fp("resource-request", "list", "--size", "2", "--page", "2")
    fp("resource-request", "list", "--size", "1", "--page", "99")              # past the end
    fp("resource-request", "list", "--page", "2")                               # no --size
    fp("resource-request", "list", "--size", "0")                               # invalid
    fp("resource-pool", "list-policies", "gpus", "-c", "nope")                  # a typo
    fp("resource-pool", "list-policies", "")                                    # no resource pool ''
    fp("component", "list")
    fp("component", "list", "-t", "orchestrator", "-o", "json")
    fp("resource-pool", "describe", "gpus", "-o", "json")
    fp("resource-pool", "describe", "gpus")
    fp("resource-pool", "describe", "nope")                                     # not found
    fp("resource-pool", "requests", "gpus", "--view", "queued", "-o", "json")
    fp("resource-pool", "requests", "gpus")
    fp("resource-pool", "detach-policy", "gpus", "team-a")                      # live allocations
    fp("resource-pool", "update-policy", "gpus", "team-a", "-p", "7", "-l", '{"gpu": 4}', "-o", "json")
    fp("resource-pool", "update-policy", "gpus", "team-b", "-t", "orchestrator", "-p", "1")
    fp("resource-pool", "update-policy", "gpus", "team-a")                      # nothing to update
    fp("resource-pool", "update-policy", "gpus", "team-a", "-r", '{"gpu": 5}')  # > limit
    fp("resource-pool", "update-policy", "gpus", "team-a", "-l", "[1]")         # not a mapping
    fp("resource-pool", "update-policy", "gpus", "nobody", "-p", "1")           # not found
    fp("resource-pool", "update-policy", "nope", "team-a", "-p", "1")           # not found
    fp("resource-pool", "delete", "gpus", "-y")                                 # live allocations
    fp("resource-request", "release", a["id"])                                  # the retry gets it
    fp("resource-request", "release", a["id"])                                  # already released
    fp("resource-request", "cancel", c["id"], "--reason", " ")                  # only whitespace
    fp("resource-request", "cancel", c["id"], "--reason", "r" * 1025)           # too long
    fp("resource-request", "cancel", c["id"], "--reason", "node drained")
    fp("resource-request", "cancel", c["id"])                                   # already cancelled
    fp("resource-request", "describe", c["id"], "-o", "json")                  # the reason kept
    fp("resource-request", "create", "--component", "team-b", "--gpu-count", "4", "--wait",
       "--timeout", "0.3", "-o", "json")                                        # times out: exit 2
    fp("reconcile", "-o", "json")
    fp("resource-pool", "update", "gpus")                                       # nothing to do
    fp("resource-pool", "update", "gpus", "-c", '{"gpu": 8}', "-d", "Bigger", "-o", "json")
    held = fp("resource-request", "create", "--component", "team-a", "--gpu-count", "1", "--lease-ttl", "60",
              "--wait", "-o", "json")
    fp("resource-request", "describe", held["id"])
    fp("resource-request", "delete", held["id"])
    fp("resource-request", "delete", held["id"])                                # gone
    fp("resource-request", "events", held["id"], "-o", "yaml")                  # the log stays
    fp("resource-request", "events", held["id"][:8])                            # gone by prefix
    fp("resource-pool", "detach-policy", "other", "team-b", "-t", "step_operator")   # live allocation
    fp("resource-request", "release", other["id"][:8])
    fp("resource-pool", "detach-policy", "other", "team-b", "-t", "step_operator")
    fp("resource-pool", "delete", "other", "-y")
    fp("resource-pool", "list", "-o", "json")
    fp("reconcile", "-o", "yaml")  # (its table's width follows the measured duration)
    scheduler_commands(fp)
    tree_commands(fp)


def scheduler_commands(fp: Transcript) -> None:
    """The scheduler config's commands (seed 004), the same way."""
    m5, complete = str(EXAMPLES / "m5-cap.yaml"), str(EXAMPLES / "complete.yaml")
    fp("config", "list")                                                      # none yet
    fp("config", "get")                                                       # none: error
    fp("queue", "list")
    fp("workload", "submit", "--gpu", "1", "-o", "json")                      # passes through
    fp("config", "apply", "-f", m5)                                           # no answer: aborted
    fp("config", "apply", "-f", m5, input="y\n")                             # confirmed
    fp("config", "apply", "-f", "-", "--yes", input="resource_queues: [{name: q, x: 1}]\n")
    fp("config", "apply", "-f", "-", "--yes", "-o", "json",
       input="scheduling_rules: [{resource_queue: nowhere}]\n")              # reference error
    fp("config", "apply", "-f", complete, "--yes", "-o", "json")
    ids = [fp("workload", "submit", "--instance-type", "m5.2xlarge", "--cpu", "8", "--memory-gb",
              "32", "-o", "json")["id"] for _ in range(2)]
    research = ("--label", "team=research", "--gpu", "8", "--cpu", "64")
    low = fp("workload", "submit", *research, "--priority", "10", "-o", "json")
    fp("workload", "submit", *research, "--priority", "10", "-o", "json")
    fp("workload", "submit", *research, "--priority", "90", "-o", "yaml")   # preempts one
    fp("workload", "submit", *research, "--priority", "101")                  # rule rejects
    fp("workload", "submit", "--label", "instance-type=x")                    # reserved key
    fp("workload", "submit", "--market-type", "CHEAP")                        # invalid value
    fp("workload", "submit", "--gpu", "1", *SIXTY_FIVE_LABELS)                 # too many labels
    every = [w["id"] for w in fp("workload", "list", "-o", "json")["items"]]
    fp("workload", "list", "--status", "queued")
    fp("workload", "list", "--status", "")                                    # invalid, not all
    fp("workload", "list", "--status", "cancelled_or_failed")                 # the same words
    second = fp("workload", "list", "--size", "2", "--page", "2", "-o", "json")
    assert [w["id"] for w in second["items"]] == every[2:4]
    cursor = second["pagination"].pop("next")  # the SDK's and the API's `after`
    assert second["pagination"] == {"index": 2, "max_size": 2, "total": len(every),
                                    "total_pages": -(-len(every) // 2)}
    assert [w["id"] for w in fp("workload", "list", "-o", "json")["items"]] == every
    assert isinstance(cursor, str) and cursor
    fp("workload", "list", "--status", "admitted", "--size", "1", "--page", "2")
    fp("workload", "list", "--size", "3", "--page", "99")                     # past the end
    fp("workload", "list", "--page", "2")                                     # no --size
    # The API's limits and words are the service's (each of these differed).
    fp("workload", "submit", "--instance-type", " ")                         # only whitespace
    fp("workload", "submit", "--priority", "-1")                             # below 0
    fp("workload", "list", "--queue", "q" * 256)                             # no name that long
    fp("workload", "submit", "--workload-type", "\udcff")                    # bytes not UTF-8
    fp("config", "apply", "-f", "-", "--yes", input="#" * 60_001)            # document too long
    fp("workload", "describe", low["id"])
    fp("workload", "describe", ids[0][:8], "-o", "json")
    fp("workload", "release", ids[0], "-o", "json")
    fp("workload", "release", ids[0])                                         # already finished
    fp("workload", "cancel", ids[1], "--reason", "\udcff")                     # bytes not UTF-8
    fp("workload", "cancel", ids[1], "--reason", "quota moved", "-o", "json")
    fp("workload", "cancel", ids[1])                                          # already cancelled
    fp("workload", "describe", "ffffffff")                                    # not found
    fp("queue", "list", "-o", "json")
    fp("queue", "describe", "ml_training")
    fp("queue", "describe", "nope")                                           # not found
    fp("workload", "list", "--queue", "nope")                                 # in no version
    fp("config", "explain", *research, "--priority", "95", "-o", "json")
    fp("config", "explain", "--label", "team=infra", "--gpu", "1")
    fp("config", "list", "-o", "json")
    fp("config", "diff", "--version", "1")
    fp("config", "diff", "--version", "1", "-o", "json")
    fp("config", "get", "--version", "1")
    fp("config", "get", "-o", "json")
    fp("config", "rollback", "--version", "1", "--yes", "-o", "json")
    fp("config", "rollback", "--version", "7", "--yes")                       # no such version
    fp("config", "get", "--version", "0")                                     # bad value
    fp("config", "diff", "--version", "-1")                                   # bad value
    fp("config", "rollback", "--version", "99999999999999999999", "--yes")    # beyond 32 bits


SIXTY_FIVE_KEYS = {f"k{i}": 1 for i in range(65)}
SIXTY_FIVE_LABELS = [f"--label=k{i}=v" for i in range(65)]


CPU_TREE = """
name: cpus
config: {node_tag_filter: cpu, max_operation_count: 1, max_running_operation_count: 1}
pools:
  research:
    strong_guarantee_resources: {cpu: 8}
    pools:
      nightly: {mode: fifo}
"""
TPU_TREE = "name: tpus\nconfig: {node_tag_filter: tpu}\npools: {inference: {weight: 2}}\n"


def tree_commands(fp: Transcript) -> None:
    """The pool trees' commands (seed 003): the issue's tour, then every other command and
    error class, the same way."""
    gpu = '{"cpu": 64, "memory": "512GiB", "gpu": 8, "user_slots": 64}'
    fp("pool-tree", "show")                                                   # no default_tree
    fp("pool-tree", "list")
    fp("node", "add", "gpu-01", "--tags", "gpu,a100", "--resources", gpu, "-o", "json")
    fp("node", "add", "gpu-02", "--tags", "gpu", "--resources", gpu.replace("64,", "36,", 1))
    fp("node", "add", "gpu-02", "--resources", '{"cpu": 1}')                 # exists: conflict
    fp("node", "add", "cpu-01", "--tags", "cpu", "--resources", '{"cpu": 16}', "-o", "yaml")
    fp("node", "add", "bad", "--resources", '{"cpu": -1}')                   # bad value
    fp("node", "add", "bad", "--resources", '{"memory": "lots"}')            # bad value
    fp("node", "add", "bad", "--resources", json.dumps(SIXTY_FIVE_KEYS))     # too many keys
    fp("node", "add", "bad", "--resources", '{"cpu": true}')                 # no union member
    fp("node", "add", "bad", "--resources", "{cpu:3,memory:2GiB}")           # keys, no values
    fp("node", "add", "bad", "--resources", '{"cpu": 1, "bad key": null}')   # a key's words first
    fp("node", "add", "n" * 256, "--resources", '{"cpu": 1}')                 # name too long
    fp("node", "add", "bad", "--tags", "t" * 256, "--resources", '{"cpu": 1}')  # tag too long
    fp("node", "add", "bad", "--tags", ",".join(SIXTY_FIVE_KEYS), "--resources", '{"cpu": 1}')
    fp("pool-tree", "create", "physical", "--node-tag-filter", "gpu", "--main-resource", "cpu",
       "-o", "json")
    fp("pool-tree", "create", "physical")                                     # exists: conflict
    fp("pool-tree", "create", "cpus", "--node-tag-filter", "cpu", "--config",
       '{"max_operation_count": 1}')                                          # running > total
    fp("pool-tree", "create", "cpus", "--node-tag-filter", "cpu", "--config",
       '{"max_operation_count": 1, "max_running_operation_count": 1}')
    fp("pool", "create", "project-root", "--tree", "physical", "--strong-guarantee",
       '{"cpu": 100}', "--max-running-operation-count", "10", "-o", "json")
    fp("pool", "create", "project-adhoc", "--tree", "physical", "--parent", "project-root",
       "--strong-guarantee", '{"cpu": 80}')
    fp("pool", "create", "project-batch", "--tree", "physical", "--parent", "project-root")
    fp("pool", "create", "too-big", "--tree", "physical", "--parent", "project-root",
       "--strong-guarantee", '{"cpu": 81}')                                  # > the parent's rest
    fp("pool", "create", "orphan", "--tree", "physical", "--parent", "nope")  # unknown parent
    fp("pool", "create", "x", "--tree", "nope")                               # unknown tree
    fp("pool", "create", "", "--tree", "physical")                            # no name
    fp("pool", "create", "x", "--tree", "physical", "--parent", "")           # no parent name
    fp("pool", "create", "p" * 256, "--tree", "physical")                     # name too long
    fp("pool", "create", "x", "--tree", "physical", "--config", '{"weight": 1e309}')  # infinite
    fp("pool-tree", "create", "x", "--config", "{fair_share_starvation_timeout: .inf}")
    fp("pool", "create", "x", "--tree", "physical", "--config",
       "{strong_guarantee_resources: {cpu: .nan}}")                           # not a number
    fp("pool", "create", "x", "--tree", "physical", "--config",
       json.dumps({"mode": "m" * 1500}))                                      # not a mode
    fp("pool", "create", "x", "--tree", "physical", "--config",
       json.dumps({"mode": "m" * 4097}))                                      # too long
    fp("pool-tree", "create", "x", "--node-tag-filter", " | ".join(["gpu"] * 600))
    fp("pool-tree", "create", "x", "--node-tag-filter", " | ".join(["gpu"] * 700))  # too long
    fp("pool", "create", "x", "--tree", "physical", "--config",
       json.dumps({"offloading_settings": {"t": {"pool": "n" * 4097}}}))     # too long, nested
    fp("pool", "create", "x", "--tree", "physical", "--config",
       json.dumps({"strong_guarantee_resources": {"cpu": 1, "k" * 300: 1}}))  # key too long
    fp("pool-tree", "create", "x", "--config",
       json.dumps({"node_tag_filter": "gpu", "k" * 300: 1}))                 # option too long
    fp("node", "add", "x", "--resources", json.dumps({"k" * 300: 1}))         # resource too long
    fp("pool-tree", "create", "")                                             # no name
    fp("pool-tree", "default", "")                                            # unknown tree
    fp("pool", "set", "project-batch", "--tree", "physical", "weight", "10", "-o", "json")
    fp("pool", "set", "project-batch", "--tree", "physical", "wieght", "10")  # unknown option
    fp("pool", "set", "project-batch", "--tree", "physical", "weight", "0")   # bad value
    fp("pool", "set", "nope", "--tree", "physical", "weight", "1")            # unknown pool
    fp("pool", "create", "scratch", "--tree", "physical", "--mode", "fifo", "--config",
       "{fifo_sort_parameters: [weight, start_time]}", "-o", "yaml")
    fp("pool", "delete", "scratch", "--tree", "physical")
    fp("pool", "delete", "scratch", "--tree", "physical")                     # unknown pool
    batch = fp("operation", "start", "--tree", "physical", "--pool", "project-batch", "--user",
               "alice", "--job-resources", '{"cpu": 1, "memory": "4GiB"}', "--job-count", "200",
               "--weight", "2", "-o", "json")
    adhoc = fp("operation", "start", "--pool", "project-adhoc", "--user", "bob",
               "--job-resources", '{"cpu": 1}', "--job-count", "10", "-o", "json")
    fp("operation", "start", "--user", "carol", "--job-resources", '{"cpu": 2}',
       "--job-count", "1", "-o", "yaml")                                      # ephemeral pool
    fp("operation", "start", "--pool", "project-batch", "--user", "dan", "--job-resources",
       '{"cpu": 1}', "--job-count", "1", "--interruptible")                  # interruptible
    both = fp("operation", "start", "--tree", "physical", "--tree", "cpus", "--pool",
              "project-batch", "--user", "fay", "--job-resources", '{"cpu": 1}', "--job-count",
              "3", "--tree-options", '{"cpus": {"pool": "fay-cpus", "weight": 2}}', "-o",
              "json")                                                         # two trees
    fp("operation", "describe", both["id"])
    fp("operation", "start", "--tree", "physical", "--user", "u", "--job-resources",
       '{"cpu": 1}', "--job-count", "1", "--tree-options", '{"cpus": {"pool": "x"}}')  # not its
    fp("operation", "start", "--tree", "physical", "--tree", "nope", "--user", "u",
       "--job-resources", '{"cpu": 1}', "--job-count", "1")                 # unknown tree
    fp("operation", "abort", both["id"])
    fp("operation", "start", "--pool", "project-batch", "--user", "u", "--job-resources",
       '{"cpu": 65}', "--job-count", "1")                                     # fits no node
    fp("operation", "start", "--pool", "project-batch", "--user", "u", "--job-resources",
       '{"cpu": 1}', "--job-count", "0")                                      # bad value
    fp("operation", "start", "--pool", "project-batch", "--user", "u", "--job-resources",
       '{"cpu": 1}', "--job-count", "10001")                                  # too many jobs
    fp("operation", "start", "--pool", "project-batch", "--user", "", "--job-resources",
       '{"cpu": 1}', "--job-count", "1")                                      # no user
    fp("operation", "start", "--pool", "", "--user", "u", "--job-resources",
       '{"cpu": 1}', "--job-count", "1")                                      # no pool name
    fp("operation", "start", "--user", "u$v", "--job-resources",
       '{"cpu": 1}', "--job-count", "1")                                      # not a pool name
    fp("operation", "start", "--pool", "project-batch", "--user", "u", "--job-resources",
       '{"cpu": 1}', "--job-count", "1", "--weight", "heavy")                 # bad value
    fp("pool-tree", "show", "physical")
    fp("pool-tree", "show", "-o", "json")
    fp("pool-tree", "show", "nope")                                           # unknown tree
    fp("pool-tree", "list")
    fp("pool-tree", "list", "-o", "json")
    fp("pool-tree", "export")
    fp("pool-tree", "export", "physical", "-o", "json")
    fp("pool-tree", "export", "nope")                                         # unknown tree
    fp("pool", "describe", "project-batch", "--tree", "physical", "-o", "json")
    fp("pool", "describe", "project-adhoc")                                   # the default tree
    fp("pool", "describe", "nope", "--tree", "physical")                      # unknown pool
    # Integral guarantees without a flow: no volume, so the same numbers at any time.
    fp("pool", "set", "project-root", "--tree", "physical", "integral_guarantees",
       "{guarantee_type: relaxed}", "-o", "json")
    fp("pool", "describe", "project-root", "--tree", "physical")
    fp("pool", "set", "project-root", "--tree", "physical", "integral_guarantees",
       "{guarantee_type: bursty}")                                            # bad value
    fp("operation", "describe", batch["id"])
    fp("operation", "describe", adhoc["id"][:8], "-o", "json")
    fp("operation", "describe", "ffffffff")                                   # not found
    fp("operation", "list")
    fp("operation", "list", "--tree", "physical", "--status", "running", "-o", "json")
    fp("operation", "list", "--status", "bogus")                              # bad value
    fp("operation", "list", "--status", "s" * 70)                             # the same words
    fp("operation", "list", "--tree", "nope")                                 # unknown tree
    every = [op["id"] for op in fp("operation", "list", "-o", "json")["items"]]
    second = fp("operation", "list", "--size", "2", "--page", "2", "-o", "json")
    assert [op["id"] for op in second["items"]] == every[2:4]
    assert second["pagination"]["total"] == len(every) > 4
    fp("operation", "list", "--tree", "physical", "--size", "1", "--page", "3")
    fp("operation", "list", "--size", "2", "--page", "99")                    # past the end
    fp("operation", "list", "--size", "10001")                                # invalid
    fp("node", "list", "-o", "json")
    fp("node", "list")
    fp("node", "remove", "gpu-01")                                            # runs jobs
    fp("pool", "delete", "project-batch", "--tree", "physical")               # has operations
    fp("operation", "complete", batch["id"], "-o", "json")
    fp("operation", "complete", batch["id"])                                  # already ended
    fp("operation", "abort", adhoc["id"][:8])
    fp("operation", "abort", "ffffffff")                                      # not found
    fp("operation", "abort", "f" * 3000)                          # not found: shown clipped
    fp("resource-pool", "describe", "p" * 256)                    # longer than any name
    fp("resource-pool", "describe", "p" * 255)                    # could be one: shown whole
    fp("pool-tree", "set", "physical", "fair_share_starvation_timeout", "1000", "-o", "json")
    fp("pool-tree", "set", "physical", "fair_share_starvation_tolerance", "2")  # bad value
    fp("pool-tree", "set", "physical", "max_operation_count", "2024-13-45")    # a 500 remotely
    fp("pool-tree", "set", "physical", "node_tag_filter", "(" * 100 + "a" + ")" * 100)  # so was this
    fp("pool-tree", "set", "nope", "main_resource", "gpu")                    # unknown tree
    fp("pool-tree", "reconcile", "physical")
    fp("pool-tree", "reconcile", "-o", "json")                                # the default tree
    fp("pool-tree", "apply", "-f", "-", input=CPU_TREE)
    fp("pool-tree", "apply", "-f", "-", "-o", "json", input=CPU_TREE)        # unchanged
    fp("pool-tree", "apply", "-f", "-", input="name: cpus\npools: {a: {weight: 0}}\n")  # bad
    fp("pool-tree", "apply", "-f", "-", input="name: cpus\npools: {a: [\n")  # YAML: many lines
    fp("pool-tree", "apply", "-f", "-", input="name: cpus\n" + "#" * 60_000)  # too long
    fp("operation", "start", "--tree", "cpus", "--pool", "nightly", "--user", "erin",
       "--job-resources", '{"cpu": 4}', "--job-count", "2", "-o", "json")
    fp("operation", "start", "--tree", "cpus", "--pool", "nightly", "--user", "erin",
       "--job-resources", '{"cpu": 4}', "--job-count", "2")                   # max_operation_count
    fp("pool-tree", "create", "tpus", "--config-file", "-", input=TPU_TREE)
    fp("pool-tree", "create", "other", "--config-file", "-", input=TPU_TREE)  # another name
    fp("pool-tree", "default")
    fp("pool-tree", "default", "cpus")
    fp("pool-tree", "default", "nope")                                        # unknown tree
    fp("pool-tree", "show")
    fp("pool-tree", "delete", "other")
    fp("pool-tree", "delete", "other")                                        # gone
    fp("pool-tree", "delete", "cpus")                                         # started operations
    fp("node", "remove", "gpu-02")
    fp("node", "remove", "gpu-02")                                            # unknown node
    fp("operation", "list", "-o", "yaml")
    fp("operation", "list", "--tree", "")                # an empty name (remotely: every tree)
    fp("prune", "--older-than", "0", "--dry-run", "-o", "json")
    fp("prune", "--older-than", "30d")                                        # none that old
    fp("prune", "--older-than", "3x")                                         # not a duration
    fp("prune", "--older-than", "36501d")                                     # too long
    # Options the service takes or refuses in its words, which the API's own shape refused
    # (65 entries) or named wrongly (deeper than five levels: "config.…bool: Input should be
    # a valid boolean"); an empty option name and 17 trees, which only one side refused.
    presets = ", ".join(f"p{i}: {{weight: 1}}" for i in range(65))
    fp("pool-tree", "create", "wide", "--node-tag-filter", "wide", "--config",
       f"{{pool_config_presets: {{{presets}}}}}")
    names = ", ".join(f"p{i}" for i in range(65))
    fp("pool", "create", "many", "--tree", "wide", "--config", f"{{config_presets: [{names}]}}",
       "-o", "json")
    fp("pool", "create", "deep", "--tree", "wide", "--config",
       "{offloading_settings: {a: {b: {c: {d: {e: 1}}}}}}")
    fp("pool", "create", "keys", "--tree", "wide", "--config",
       json.dumps({"resource_limits": {f"k{i}": 1 for i in range(65)}}))
    fp("pool", "create", "blank", "--tree", "wide", "--config", '{"": 2}')
    fp("pool", "set", "many", "--tree", "wide", "", "2")
    fp("operation", "start", *(f"--tree=t{i}" for i in range(17)), "--pool", "p", "--user", "u",
       "--job-resources", '{"cpu": 1}', "--job-count", "1")
    fp("operation", "start", "--pool", "p", "--user", "u", "--job-resources", '{"cpu": 1}',
       "--job-count", "1", "--weight", "1." + "0" * 67 + "1")  # "at most 64 characters" remotely


@pytest.mark.long
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_cli_command_prints_the_same_embedded_and_remote(
    request: pytest.FixtureRequest, tmp_path: Path, backend: Backend
) -> None:
    """The same commands embedded, then through a server on ``backend``'s store."""
    output.out.cache_clear()
    output.err.cache_clear()
    embedded = Transcript({"FAIRPOOL_HOME": str(tmp_path / "embedded"), "FAIRPOOL_URL": None})
    server = server_on(request, backend, tmp_path / "served")
    try:
        starting = threading.Thread(target=server.start)  # while the embedded run goes
        starting.start()
        every_command(embedded)
        starting.join()
        remote = Transcript({"FAIRPOOL_HOME": str(tmp_path / "unused"), "FAIRPOOL_URL": server.url})
        started = time.monotonic()
        every_command(remote)
        print(f"\n{len(remote.steps)} CLI commands through the server in {time.monotonic() - started:.1f} s")
    finally:
        server.stop()
    assert not (tmp_path / "unused").exists()  # remote mode never opened a local store

    assert len(embedded.steps) == len(remote.steps)
    differences = [
        f"fairpool {' '.join(mine.args)}\n  embedded: {mine}\n  remote:   {theirs}"
        for mine, theirs in zip(embedded.steps, remote.steps, strict=True)
        if theirs != mine
    ]
    assert not differences, "\n".join(differences)
    # And the sequence did what it says (both modes equally wrong would pass the above).
    codes = {" ".join(s.args): s.code for s in embedded.steps}
    assert sorted(set(codes.values())) == [0, 1, 2]
    errors = [s.stderr for s in embedded.steps if s.code == 1]
    for needle in ("already exists", "gpu", "live allocation", "no request", "already cancelled",
                   "nothing to update", "No policy found for orchestrator `nobody`"):
        assert any(needle in e for e in errors), needle
    statuses = [s.stdout.get("status") for s in embedded.steps if isinstance(s.stdout, dict)]
    assert {"allocated", "queued", "rejected"} <= set(statuses)
    for needle in ("no resource pool 'nope'", "no resource pool ''", "no pool tree 'nope'", "unknown pool option",
                   "no component 'nope'", "no resource queue 'nope' in any scheduler config",
                   "max_operation_count is 1", "job_count: must be a positive integer",
                   "Error: tree: there is no pool tree yet (`fairpool pool-tree create NAME` "
                   "makes one; resource pools are `fairpool resource-pool`)\n",
                   "already completed",
                   "tree_options.cpus: is not one of the operation's trees",
                   "no pool tree 'other'", "complete or abort them first", "no pool tree ''",
                   "offloading_settings.a: must be {pool: <name>}",
                   "resource_limits: must have at most 64 keys",
                   "pool key: an empty name is no pool option",
                   "tree: an operation runs in at most 16 trees (got 17)",
                   "weight: must be a number written in at most 64 characters"):
        assert any(needle in e for e in errors), needle
    [many] = [s.stdout for s in embedded.steps if s.args[:3] == ("pool", "create", "many")]
    assert len(many["config"]["config_presets"]) == 65
    [updated] = [s.stdout for s in embedded.steps
                 if s.args[:2] == ("resource-pool", "update-policy") and isinstance(s.stdout, dict)]
    assert (updated["priority"], updated["limit"]) == (7, {"gpu": 4})
    started = [s.stdout for s in embedded.steps
               if s.args[:2] == ("operation", "start") and isinstance(s.stdout, dict)]
    assert [(op["status"], op["running_jobs"]) for op in started] == [
        ("running", 100), ("running", 0), ("running", 0), ("running", 3), ("running", 2)]
    applies = [s.code for s in embedded.steps if s.args[:2] == ("config", "apply")]
    # aborted, confirmed, shape error, reference error, --yes, too long
    assert applies == [1, 0, 1, 1, 0, 1]
    reasons = [str(s.stdout.get("reason")) for s in embedded.steps
               if s.args[:2] == ("workload", "submit") and isinstance(s.stdout, dict)]
    assert any("preempting" in reason for reason in reasons)
    [counted] = [s.stdout for s in embedded.steps if s.args[:1] == ("prune",) and s.code == 0
                 and isinstance(s.stdout, dict)]
    assert counted["dry_run"] and counted["requests"] > 0 and counted["events"] > 0
    [none_that_old] = [s for s in embedded.steps if s.args == ("prune", "--older-than", "30d")]
    assert "Deleted" in none_that_old.stdout and " 0 " in none_that_old.stdout
    for args, needle in ((("prune", "--older-than", "3x"), "'3x' is not a duration"),
                         (("prune", "--older-than", "36501d"), "is longer than 36500 days")):
        [refused] = [s for s in embedded.steps if s.args == args]
        assert refused.code == 2 and needle in refused.stderr, refused
    for ref, shown in (("f" * 3000, "f" * 20 + "..."), ("p" * 256, "p" * 20 + "..."),
                       ("p" * 255, "p" * 255)):
        [missing] = [s for s in embedded.steps if s.args[-1] == ref]
        assert missing.code == 1 and f"{shown!r}" in missing.stderr, missing  # one line, short
        assert len(missing.stderr) < 300 + len(shown), missing
    assert "Traceback" not in server.log()


# -- fairpool run through the server -----------------------------------------------------------

def fairpool_cli(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**clean_env(), "FAIRPOOL_URL": url, "NO_COLOR": "1", "COLUMNS": "250"}
    return subprocess.Popen(
        [sys.executable, "-m", "fairpool.cli.main", *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


def test_fairpool_run_through_the_server(server: ApiServer) -> None:
    setup_pool(server.url, "run-gpus", ["run-orch"], {"gpu": 1})
    show = "import os; print(os.environ['FAIRPOOL_REQUEST_ID'], os.environ['FAIRPOOL_POOL'], os.environ['FAIRPOOL_RESOURCES']); raise SystemExit(3)"
    with httpx.Client(base_url=server.url + API, timeout=30.0) as http:
        holder = http.post("/requests", json={"component": "run-orch", "resources": {"gpu": 1}}).json()
        assert holder["status"] == "allocated"

        # The run waits for the holder's GPU (shown live), runs with the grant, passes the
        # exit code back and releases.
        run = fairpool_cli(server.url, "run", "--component", "run-orch", "--gpu-count", "1",
                           "--", sys.executable, "-c", show)
        deadline = time.monotonic() + 30
        while not http.get("/requests", params={"status": "queued", "component": "run-orch"}).json()["items"]:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        http.post(f"/requests/{holder['id']}/release").raise_for_status()
        out, err = run.communicate(timeout=60)
        assert run.returncode == 3, err
        request_id, pool, resources = out.split(maxsplit=2)
        assert pool == "run-gpus" and json.loads(resources) == {"gpu": 1, "step_run": 1}
        assert http.get(f"/requests/{request_id}").json()["status"] == "released"
        assert http.get("/pools/run-gpus").json()["occupied"] == {"gpu": 0}

        # Never fits: exit 1 with the reason, nothing run.
        never = fairpool_cli(server.url, "run", "--component", "run-orch", "--gpu-count", "2",
                             "--", sys.executable, "-c", "print('ran')")
        out, err = never.communicate(timeout=60)
        assert never.returncode == 1 and "ran" not in out
        assert "gpu requested 2 > capacity 1" in err


def ref_calls(client: Client) -> list[Callable[[Any], object]]:
    """SDK calls that look a name or id up, given it: on a client with pool ``seg`` and pool
    tree ``t`` (``with_seg_and_t``)."""
    trees, scheduling = client.trees, client.scheduling
    return [
        client.get, client.events, client.heartbeat, client.release, client.cancel,
        client.delete, client.get_pool, client.pool_requests, client.delete_pool,
        lambda r: client.update_pool(r, {"gpu": 1}),
        lambda r: client.detach_policy("seg", r), lambda r: client.detach_policy("no", r),
        scheduling.get_workload, scheduling.cancel_workload, scheduling.describe_queue,
        trees.delete_tree, trees.show_tree, trees.remove_node, trees.describe_operation,
        lambda r: trees.describe_pool("t", r), lambda r: trees.set_pool("t", r, "weight", "2"),
        lambda r: trees.delete_pool("no", r), lambda r: trees.create_pool(r, "p"),
    ]


def with_seg_and_t(client: Client) -> Client:
    client.create_pool("seg", {"gpu": 1})
    client.trees.create_tree("t")
    return client


def test_a_ref_no_path_segment_can_carry_is_not_found_not_another_route(tmp_path: Path) -> None:
    """An empty ref made "/pools/", which the server redirected (307) to "/pools": the SDK
    then took the redirect's body for a pool, and a delete of it for a success. A "/" in a
    ref reached another route (the server decodes "%2F" before routing). Such a ref is not
    found without asking, in the words the embedded store has for it."""

    def errors(client: Client) -> list[str]:
        calls = ref_calls(with_seg_and_t(client))
        found = []
        for ref in ("", "a/b", "/", ".", ".."):
            for call in calls:
                with pytest.raises(NotFound) as error:
                    call(ref)
                found.append(str(error.value))
        for bad in ("a\x00b", "a\udcffb", 5):  # no name or id (in the server's words)
            for call in calls:
                with pytest.raises(InvalidInput) as refused:
                    call(bad)
                found.append(str(refused.value))
        return found

    with running(ApiServer(tmp_path / "server.log", home=tmp_path / "home")) as (server,):
        with Client(url=server.url, home=str(tmp_path / "unused")) as client:
            remote = errors(client)
            assert [p.name for p in client.list_pools()] == ["seg"]
        for path in ("/pools/", "/requests/", "/pool-trees/"):
            assert httpx.get(server.url + API + path).status_code == 404
            assert httpx.delete(server.url + API + path).status_code in (404, 405)
    with Client(home=str(tmp_path / "embedded")) as client:
        embedded = errors(client)
    assert remote == embedded
    assert "No policy found for orchestrator `a/b` in resource pool `seg`" in remote
    assert {"no pool tree 'no'", "no pool '/' in tree t",
            "no resource queue '' in the active scheduler config"} <= set(remote)


@pytest.mark.parametrize("userinfo", ["", "user:s3cret@"], ids=["plain", "password"])
def test_an_unreachable_server_is_one_error_line_naming_it(userinfo: str) -> None:
    """Its password, if the URL has one, shown as *** (it was shown; helper-59)."""
    port = free_port()  # nothing listens there
    listing = fairpool_cli(f"http://{userinfo}127.0.0.1:{port}", "resource-pool", "list")
    out, err = listing.communicate(timeout=60)
    assert listing.returncode == 1 and out == ""
    shown = userinfo.replace("s3cret", "***")
    assert err.strip().splitlines() == [
        f"Error: cannot reach the fairpool server at http://{shown}127.0.0.1:{port} after 6 "
        "attempts: [Errno 111] Connection refused"
    ]


@pytest.mark.parametrize("url", ["127.0.0.1:8600", "ftp://127.0.0.1:8600", "http://[::1",
                                 "http://", "http://127.0.0.1:99999", "http://127.0.0.1:8600?x=1",
                                 "http://127.0.0.1:8600/#top", "ftp://u:s3cret@127.0.0.1"])
def test_a_malformed_url_is_one_error_line_at_once(url: str) -> None:
    """Not retried as an outage would be; a password in it shown as ***."""
    listing = fairpool_cli(url, "resource-pool", "list")
    out, err = listing.communicate(timeout=60)
    assert listing.returncode == 1 and out == ""
    [line] = err.strip().splitlines()
    shown = url.replace("s3cret", "***")
    assert line.startswith("Error: url: ") and line.endswith(f"(got {shown!r})"), line


def test_a_url_that_is_not_the_servers_root_says_so(server: ApiServer) -> None:
    """A URL with the API's path in it answered a bare "Error: Not Found"."""
    for url in (server.url + API, server.url + "/fairpool"):
        listing = fairpool_cli(url, "resource-pool", "list")
        out, err = listing.communicate(timeout=60)
        assert listing.returncode == 1 and out == ""
        path = url.removeprefix(server.url) + API + "/pools"
        assert err.strip().splitlines() == [
            f"Error: HTTP 404: the server has no route GET {path}: is the URL its root "
            "(http://HOST:PORT, with a proxy's path prefix if any), and is it a fairpool server "
            "as new as this client?"]


def test_a_proxy_path_left_out_of_the_url_is_said_so_not_the_proxys_page() -> None:
    """A proxy serving the server under a path answers others with its HTML 404 page, which
    was the whole error line."""
    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = b"<html><head><title>404 Not Found</title></head><body>nginx</body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            listing = fairpool_cli(f"http://127.0.0.1:{proxy.server_port}", "resource-pool", "list")
            out, err = listing.communicate(timeout=60)
        finally:
            proxy.shutdown()
    assert listing.returncode == 1 and out == ""
    assert err.strip().splitlines() == [
        f"Error: HTTP 404: the server has no route GET {API}/pools: is the URL its root "
        "(http://HOST:PORT, with a proxy's path prefix if any), and is it a fairpool server as "
        "new as this client?"]


def test_a_whole_list_misses_nothing_that_a_delete_between_its_pages_moves(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote list reads page after page; the requests on its first page are deleted
    before it asks for the second. It asks after where the first ended: asking from an
    offset skipped the two after them."""
    setup_pool(server.url, "paged-gpus", ["paged-orch"], {"gpu": 1})
    monkeypatch.setattr("fairpool.remote._LIST_PAGE", 2)
    asked: list[dict[str, Any]] = []
    call = RemoteService._call

    def deleting_what_the_first_page_held(
        self: RemoteService, method: str, path: str, **options: Any
    ) -> Any:
        answer = call(self, method, path, **options)
        if path == "/requests" and method == "GET":
            asked.append(options["params"])
            if len(asked) == 1:
                for item in answer["items"]:
                    self.delete_request(item["id"])
        return answer

    with Client(url=server.url) as client:
        made = [client.submit({"gpu": 1}, component="paged-orch", lease_ttl=None).id
                for _ in range(6)]
        monkeypatch.setattr(RemoteService, "_call", deleting_what_the_first_page_held)
        assert [r.id for r in client.list_requests(component="paged-orch")] == made
        assert [r.id for r in client.list_requests(component="paged-orch")] == made[2:]
    assert [params.get("after") is None for params in asked] == [True, False, False, True, False]


def test_waits_ride_out_a_server_restart_and_say_what_is_left_when_they_give_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9, down for longer than one call's retries, up again on the same store: the
    waiting ``create --wait`` and SDK ``wait`` go on, and get the units once released. Down
    for longer than ``WAIT_OUTAGE``: ``Unreachable``, naming the request left queued."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "store")
    with running(server), Client(url=server.url) as client:
        setup_pool(server.url, "outage-gpus", ["outage-orch"], {"gpu": 1})
        holder = client.submit({"gpu": 1}, component="outage-orch", lease_ttl=None)
        waiting = fairpool_cli(server.url, "resource-request", "create", "--component",
                               "outage-orch", "--gpu-count", "1", "--wait", "-o", "json")
        deadline = time.monotonic() + 30
        while not client.list_requests("queued", "outage-orch"):  # first in the queue
            assert time.monotonic() < deadline
            time.sleep(0.05)
        queued = client.submit({"gpu": 1}, component="outage-orch", lease_ttl=None)
        sdk: list[Any] = []
        sdk_waiter = threading.Thread(target=lambda: sdk.append(client.wait(queued.id, 60)))
        sdk_waiter.start()
        time.sleep(0.5)  # both in their long-polls
        server.kill()
        time.sleep(8)  # a call's retries give up after ~6 s
        server.start()
        client.release(holder.id)
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert json.loads(out)["status"] == "allocated"
        # Said as the CLI's other lines are (bare, before 2026-12-01): "answers again", news.
        said = err.splitlines()
        assert any(line.startswith("Warning: ") and line.endswith("still waiting, for up to "
                                                                  "120 s") for line in said), err
        assert "The fairpool server answers again" in said, err
        client.release(json.loads(out)["id"])
        sdk_waiter.join(timeout=60)
        assert [r.status for r in sdk] == ["allocated"]

        left = client.submit({"gpu": 1}, component="outage-orch", lease_ttl=None)
        client.wait(left.id, 0)
        monkeypatch.setattr("fairpool.outage.WAIT_OUTAGE", 1.0)
        monkeypatch.setattr("fairpool.remote._ATTEMPTS", 2)
        server.kill()
        with pytest.raises(Unreachable, match=f"resource request `{left.id}` may still be "
                           f"queued there .*fairpool resource-request cancel {left.id}"):
            client.wait(left.id, 60)


def test_a_block_that_ends_while_the_server_is_down_keeps_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its work is done; only the release cannot be sent, and the lease gives the units back
    anyway: a warning, as ``fairpool run`` gives, not ``Unreachable`` in place of the result."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "store")
    monkeypatch.setattr("fairpool.remote._ATTEMPTS", 2)  # give up the release sooner
    with running(server), Client(url=server.url) as client:
        setup_pool(server.url, "down-gpus", ["down-orch"], {"gpu": 1})

        @client.acquire({"gpu": 1}, component="down-orch", lease_ttl=60)
        def work() -> str:
            server.kill()
            return "result"

        with caplog.at_level("WARNING", logger="fairpool.client"):
            assert work() == "result"
        assert "the units go back when the lease expires" in caplog.text
        server.start()
        [held] = client.list_requests(component="down-orch")
        assert held.status == "allocated" and held.lease_ttl == 60  # until its lease ends


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_an_acquire_that_gives_up_while_the_server_is_down_says_what_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    flavour: str,
) -> None:
    """The cancel of the request it stopped waiting for could not be sent: its
    ``Unreachable`` took the place of the ``WaitTimeout``, naming no request."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "store")
    monkeypatch.setattr("fairpool.remote._ATTEMPTS", 2)  # give up each call sooner
    with running(server), Client(url=server.url) as client:
        setup_pool(server.url, "down-gpus", ["down-orch"], {"gpu": 1})
        client.submit({"gpu": 1}, component="down-orch", lease_ttl=None)
        threading.Timer(0.5, server.kill).start()  # while it waits, queued

        def sync() -> None:
            with client.acquire({"gpu": 1}, component="down-orch", timeout=2):
                pass

        async def in_loop() -> None:
            async with AsyncClient(url=server.url) as remote, remote.acquire(
                {"gpu": 1}, component="down-orch", timeout=2
            ):
                pass

        with caplog.at_level("WARNING"), pytest.raises(WaitTimeout) as raised:
            sync() if flavour == "sync" else asyncio.run(in_loop())
    request_id = raised.value.request.id
    assert (f"Resource request `{request_id}` is still waiting (cannot reach the fairpool "
            f"server") in caplog.text
    assert f"cancel it with `fairpool resource-request cancel {request_id}`" in caplog.text


# -- the SDK with Client(url=...) --------------------------------------------------------------

@pytest.fixture
def client(server: ApiServer) -> Iterator[Client]:
    with Client(url=server.url) as remote:
        yield remote


def later(seconds: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()
    return timer


def test_remote_answers_have_the_views_fields_as_attributes(client: Client) -> None:
    """``w.status`` as embedded (remote answers were dicts only: code written against one
    mode broke on the other)."""
    workload = client.scheduling.submit_workload(demand={"gpu": "1"})
    assert workload.status == workload["status"] and workload.id == workload.as_dict()["id"]
    with pytest.raises(AttributeError):
        _ = workload.no_such_field


def test_sdk_acquire_holds_then_releases(server: ApiServer, client: Client) -> None:
    setup_pool(server.url, "sdk-gpus", ["sdk-orch"], {"gpu": 2})
    with client.acquire(ResourceSettings(gpu_count=2, memory="1GiB"), component="sdk-orch") as grant:
        assert grant.pool == "sdk-gpus"
        assert grant.resources == {"gpu": 2, "memory_mb": 1074, "step_run": 1}
        seen = client.get(grant.id)
        assert seen.status == "allocated" and seen.lease_ttl == 60
    assert client.get(grant.id).status == "released"
    with pytest.raises(Rejected, match="gpu requested 3 > capacity 2"):
        with client.acquire({"gpu": 3}, component="sdk-orch"):
            pytest.fail("never granted")
    blocker = client.submit({"gpu": 2}, component="sdk-orch")
    with pytest.raises(WaitTimeout, match=r"cancelled: gave up waiting after 0\.3 s \(it was "
                       "queued: sdk-gpus #1: ") as raised:
        with client.acquire({"gpu": 1}, component="sdk-orch", timeout=0.3):
            pytest.fail("never granted")
    assert client.get(raised.value.request.id).status == "cancelled"
    client.release(blocker.id)


def test_a_waiter_wakes_promptly_when_units_are_released(server: ApiServer, client: Client) -> None:
    """Release → the waiting ``acquire`` returns: the long-poll is woken by the release's
    pass, not by a poll interval."""
    setup_pool(server.url, "wake-gpus", ["wake-orch"], {"gpu": 1})
    latencies = []
    for _ in range(5):
        holder = client.submit({"gpu": 1}, component="wake-orch")
        assert holder.status == "allocated"
        got: list[float] = []

        def wait_for_units(got: list[float] = got) -> None:
            with client.acquire({"gpu": 1}, component="wake-orch", timeout=20):
                got.append(time.monotonic())

        waiter = threading.Thread(target=wait_for_units)
        waiter.start()
        # The waiter is queued and its long-poll is in place.
        deadline = time.monotonic() + 10
        while len(client.list_requests("queued", "wake-orch")) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        released = time.monotonic()
        client.release(holder.id)
        waiter.join(timeout=20)
        assert got, "the waiter never got the units"
        latencies.append(got[0] - released)
    print(f"\nrelease -> waiter's acquire returned: median {statistics.median(latencies) * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms")
    assert max(latencies) < 1.0


def test_preemption_reaches_the_holder_within_one_heartbeat(server: ApiServer, client: Client) -> None:
    setup_pool(server.url, "pre-gpus", ["pre-low"], {"gpu": 2})
    with httpx.Client(base_url=server.url + API) as http:
        http.post("/pools/pre-gpus/policies", json={"component": "pre-high", "priority": 9}).raise_for_status()
    lease_ttl = 3  # one heartbeat per second
    preempted_at: list[float] = []

    def preempt() -> None:
        client.submit({"gpu": 2}, component="pre-high")
        preempted_at.append(time.monotonic())

    with pytest.raises(Preempted, match="priority 9 > 0") as raised:
        with client.acquire({"gpu": 2}, component="pre-low", lease_ttl=lease_ttl) as grant:
            later(0.5, preempt)
            time.sleep(10)  # interrupted by the heartbeat thread
    heard = time.monotonic() - preempted_at[0]
    print(f"\npreemption -> Preempted raised in the holder: {heard * 1000:.0f} ms "
          f"(heartbeat every {lease_ttl / 3:.1f} s)")
    assert heard < lease_ttl / 3 + 0.5
    assert raised.value.request.id == grant.id
    assert client.get(grant.id).status == "preempted"


def test_the_decorator_runs_again_on_the_retry_attempt(server: ApiServer, client: Client) -> None:
    setup_pool(server.url, "deco-gpus", ["deco-low"], {"gpu": 2})
    with httpx.Client(base_url=server.url + API) as http:
        http.post("/pools/deco-gpus/policies", json={"component": "deco-high", "priority": 9}).raise_for_status()
    runs: list[str] = []

    @client.acquire({"gpu": 2}, component="deco-low", lease_ttl=1, max_retries=1, timeout=20)
    def train() -> str:
        runs.append("start")
        if len(runs) == 1:
            boss = client.submit({"gpu": 2}, component="deco-high")
            later(0.8, lambda: client.release(boss.id))
            time.sleep(10)  # interrupted by the preemption
        return "done"

    assert train() == "done"
    assert runs == ["start", "start"]
    attempts = client.list_requests(component="deco-low")
    assert [(r.attempt, r.status) for r in attempts] == [(1, "preempted"), (2, "released")]
    assert attempts[1].previous_attempt_id == attempts[0].id


# -- every SDK operation: the same answers embedded and remote ------------------------------------

#: Pool and component names that a URL would read otherwise, unescaped: as a query, a
#: fragment, an escape. (The current or the parent directory, "." and "..", are no new
#: name's since 2026-12-02: ``test_a_ref_no_path_segment_can_carry_is_not_found_not_another_route``
#: looks them up.)
ODD_NAMES = ("sdk?old", "sdk#2", "sdk%20", "100%")


def ambiguous(client: Client, *ids: str) -> RequestView:
    """``get`` by the prefix ``ids`` share (ids begin with their time: requests made a moment
    apart share one), which the error's message then names as ``<prefix>``."""
    prefix = os.path.commonprefix(ids)  # noqa: RUF071 (characters, as id prefixes are)
    try:
        return client.get(prefix)
    except Conflict as error:
        raise type(error)(str(error).replace(prefix, "<prefix>")) from None


def every_sdk_call(client: Client) -> list[tuple[str, Any]]:
    """One sequence through every ``Client`` operation and error class; each answer (or
    error, by class and message) as JSON data, normalized."""
    normalizer = Normalizer()
    steps: list[tuple[str, Any]] = []

    def step(name: str, call: Callable[[], Any]) -> Any:
        try:
            result = call()
        except FairpoolError as error:
            data: Any = f"{type(error).__name__}: {error}"
            result = None
        else:
            data = [r.as_dict() for r in result] if isinstance(result, list) else (
                None if result is None else result.as_dict())
        steps.append((name, normalizer.data(data)))
        return result

    step("create_pool", lambda: client.create_pool("sdk", {"gpu": 2, "step_run": 8}, "SDK's"))
    step("create_pool again", lambda: client.create_pool("sdk", {"gpu": 2}))
    step("create_pool invalid", lambda: client.create_pool("bad", {"gpu": -1}))
    # httpx sends no NaN; the remote SDK writes it as JavaScript does, for the server to refuse.
    step("create_pool NaN", lambda: client.create_pool("bad", {"gpu": float("nan")}))
    # JSON would write the key 5 as "5": remotely another ask, accepted (then unplaceable).
    step("create_pool, a key not text", lambda: client.create_pool("bad", {5: 1}))  # type: ignore[dict-item]
    step("create_pool, description not text",
         lambda: client.create_pool("bad", {"gpu": 1}, description=5))  # type: ignore[arg-type]
    step("update_pool", lambda: client.update_pool("sdk", {"gpu": 3}, description="more"))
    # A list where a mapping goes: Python's own ValueError or AttributeError, embedded and
    # (from the SDK's own dict()) remote, before 2026-11-29.
    step("create_pool, capacity a list", lambda: client.create_pool("bad", ["gpu"]))  # type: ignore[arg-type]
    step("update_pool, capacity a list", lambda: client.update_pool("sdk", capacity=["gpu"]))  # type: ignore[arg-type]
    step("attach_policy, reserved a list",
         lambda: client.attach_policy("sdk", "other", priority=1, reserved=["gpu"]))  # type: ignore[arg-type]
    step("submit, demand a list", lambda: client.submit(["gpu"], component="sdk-low"))  # type: ignore[arg-type]
    step("submit, labels a list",
         lambda: client.submit({"gpu": 1}, component="sdk-low", labels=["a"]))  # type: ignore[arg-type]
    step("update_pool unknown", lambda: client.update_pool("nope", {"gpu": 3}))
    step("attach_policy low", lambda: client.attach_policy("sdk", "sdk-low", priority=1, limit={"gpu": 3}))
    step("attach_policy high", lambda: client.attach_policy("sdk", "sdk-high", priority=9, reserved={"gpu": 1}))
    step("attach_policy unknown key", lambda: client.attach_policy("sdk", "x", reserved={"tpu": 1}))
    step("list_policies", lambda: client.list_policies(pool="sdk"))
    step("list_components, none yet", client.list_components)
    held = step("submit", lambda: client.submit(ResourceSettings(gpu_count=2), component="sdk-low", lease_ttl=None))
    queued = step("submit queued", lambda: client.submit({"gpu": 2}, component="sdk-low", lease_ttl=None))
    step("submit rejected", lambda: client.submit({"gpu": 9}, component="sdk-low"))
    step("submit invalid", lambda: client.submit({"gpu": 0}, component="sdk-low"))
    step("update_policy in use", lambda: client.update_policy("sdk", "sdk-low", priority=2))
    step("update_policy nothing", lambda: client.update_policy("sdk", "sdk-low"))
    step("update_policy, limit a list",
         lambda: client.update_policy("sdk", "sdk-low", limit=["gpu"]))  # type: ignore[arg-type]
    step("update_policy step_operator",
         lambda: client.update_policy("sdk", "sdk-low", "step_operator", priority=2))
    step("submit bad component type",
         lambda: client.submit({"gpu": 1}, component="sdk-low", component_type="deployer"))
    step("get by prefix", lambda: client.get(queued.id[:8]))
    step("get by an ambiguous prefix", lambda: ambiguous(client, held.id, queued.id))
    step("list_requests queued", lambda: client.list_requests(status="queued", pool="sdk"))
    step("list_requests bad status", lambda: client.list_requests(status="done"))
    step("request_page", lambda: client.request_page(component="sdk-low", limit=2, offset=1))
    step("request_page to the end", lambda: client.request_page(component="sdk-low", offset=1))
    step("request_page past the end", lambda: client.request_page(limit=5, offset=10))
    step("request_page after a page's end", lambda: list(client.request_page(
        component="sdk-low", limit=5, after=client.request_page(component="sdk-low", limit=1).next
    ).items))
    step("request_page after no cursor", lambda: client.request_page(after="MjAyNg"))
    for bad in (0, 10_001, True, "2", 1.5):
        step(f"request_page limit {bad!r}", lambda bad=bad: client.request_page(limit=bad))
    for bad in (-1, 2**62 + 1, "0"):
        step(f"request_page offset {bad!r}", lambda bad=bad: client.request_page(offset=bad))
    step("list_components", client.list_components)
    step("list_components of a type", lambda: client.list_components("step_operator"))
    step("list_components bad type", lambda: client.list_components("robot"))
    step("list_policies empty type", lambda: client.list_policies(component_type=""))
    step("pool_requests active", lambda: client.pool_requests("sdk", "active"))
    step("pool_requests bad view",
         lambda: client.pool_requests("sdk", "actives"))  # type: ignore[arg-type]
    # A filter given as a number: a query string would carry it as text ("no component '5'").
    step("pool_requests view a number", lambda: client.pool_requests("sdk", 5))  # type: ignore[arg-type]
    step("list_requests, component a number", lambda: client.list_requests(component=5))  # type: ignore[arg-type]
    step("list_policies, pool a number", lambda: client.list_policies(pool=5))  # type: ignore[arg-type]
    step("get_pool", lambda: client.get_pool("sdk"))
    step("list_pools", client.list_pools)
    # Names that read otherwise in a URL address their own pool and policy, never "sdk"'s.
    for odd in ODD_NAMES:
        step(f"create_pool {odd}", lambda odd=odd: client.create_pool(odd, {"gpu": 1}))
        step(f"attach_policy {odd}", lambda odd=odd: client.attach_policy(odd, odd))
        step(f"update_pool {odd}", lambda odd=odd: client.update_pool(odd, {"gpu": 2}))
        step(f"update_policy {odd}",
             lambda odd=odd: client.update_policy(odd, odd, limit={"gpu": 1}))
        step(f"pool_requests {odd}", lambda odd=odd: client.pool_requests(odd))
    step("attach_policy sdk-low?x", lambda: client.attach_policy("sdk", "sdk-low?x"))
    step("detach_policy sdk-low?x", lambda: client.detach_policy("sdk", "sdk-low?x"))
    for odd in ODD_NAMES:
        step(f"detach_policy {odd}", lambda odd=odd: client.detach_policy(odd, odd))
        step(f"delete_pool {odd}", lambda odd=odd: client.delete_pool(odd))
    step("get_pool after the odd names", lambda: client.get_pool("sdk"))
    step("list_policies after the odd names", lambda: client.list_policies(pool="sdk"))
    step("create_pool with a slash", lambda: client.create_pool("sdk/2", {"gpu": 1}))
    step("create_pool ..", lambda: client.create_pool("..", {"gpu": 1}))
    step("create_pool, name a number", lambda: client.create_pool(5, {"gpu": 1}))  # type: ignore[arg-type]
    step("attach_policy, component a number", lambda: client.attach_policy("sdk", 5))  # type: ignore[arg-type]
    step("attach_policy for a component .", lambda: client.attach_policy("sdk", "."))
    step("heartbeat", lambda: client.heartbeat(held.id))
    step("wait, still queued", lambda: client.wait(queued.id, timeout=0))
    step("release", lambda: client.release(held.id))
    step("wait", lambda: client.wait(queued.id, timeout=30))
    step("release again", lambda: client.release(held.id))
    step("cancel released", lambda: client.cancel(held.id))
    step("cancel, reason not text", lambda: client.cancel(queued.id, 5))  # type: ignore[arg-type]
    step("cancel, reason blank", lambda: client.cancel(queued.id, " \t"))
    step("cancel with a reason", lambda: client.cancel(
        client.submit({"gpu": 1}, component="sdk-low").id, "node drained"))
    step("delete_pool with a live allocation", lambda: client.delete_pool("sdk"))
    step("delete", lambda: client.delete(queued.id))
    step("get deleted", lambda: client.get(queued.id))
    step("events", lambda: client.events(held.id[:8]))
    step("events of a deleted request", lambda: client.events(queued.id))
    step("events unknown", lambda: client.events("ffffffff"))
    step("reconcile", client.reconcile)
    step("detach_policy", lambda: client.detach_policy("sdk", "sdk-high"))
    step("detach_policy again", lambda: client.detach_policy("sdk", "sdk-high"))
    step("delete_pool", lambda: client.delete_pool("sdk"))
    step("scheduling.preview_config", lambda: client.scheduling.preview_config(
        (EXAMPLES / "complete.yaml").read_text()))
    step("scheduling.apply_config", lambda: client.scheduling.apply_config((EXAMPLES / "complete.yaml").read_text()))
    step("scheduling.preview_config of a changed queue", lambda: client.scheduling.preview_config(
        (EXAMPLES / "complete.yaml").read_text().replace("nominal_quota: 64", "nominal_quota: 65")))
    step("scheduling.apply_config based on another",
         lambda: client.scheduling.apply_config("resource_queues: [{name: q}]\n", based_on=7))
    step("scheduling.rollback_config based on a bad version",
         lambda: client.scheduling.rollback_config(1, based_on=-1))
    step("scheduling.diff_config of text", lambda: client.scheduling.diff_config("a\x00b"))
    # Embedded, a TypeError (helper-94).
    step("scheduling.apply_config of a number",
         lambda: client.scheduling.apply_config(123))  # type: ignore[arg-type]
    step("scheduling.preview_config of a list",
         lambda: client.scheduling.preview_config(["a"]))  # type: ignore[arg-type]
    step("scheduling.get_config of version 0", lambda: client.scheduling.get_config(0))
    step("scheduling.rollback_config of a version past the last",
         lambda: client.scheduling.rollback_config(2**40))
    step("scheduling.rollback_config based on the active one",
         lambda: client.scheduling.rollback_config(1, based_on=1))
    for label, bad, _ in BAD_WORKLOADS:
        step(f"scheduling.submit_workload {label}",
             lambda bad=bad: client.scheduling.submit_workload(**bad))
    step("scheduling.list_configs", client.scheduling.list_configs)
    step("trees.create_tree", lambda: client.trees.create_tree("tpus"))
    # Read-only mappings, one inside another: the remote SDK's json.dumps refused the inner
    # one (a TypeError) before 2026-11-30.
    step("trees.create_pool, read-only options", lambda: client.trees.create_pool(
        "tpus", "ro", options=MappingProxyType({"resource_limits": MappingProxyType({"gpu": 2})})))
    for label, call, _ in BAD_TREE_CALLS:
        step(f"trees.{label}", lambda call=call: call(client.trees))
    step("trees.list_trees", client.trees.list_trees)
    # Pages of workloads and operations: as requests', the same embedded and remote.
    client.trees.add_node("sdk-node", [], {"gpu": 2})
    for user in ("u1", "u2", "u3"):
        client.scheduling.submit_workload(demand={"cpu": "1"}, labels={"team": user})
        client.trees.start_operation(user=user, trees=["tpus"], pool="ro",
                                     job_resources={"gpu": 1}, job_count=1)
    for what in ("workload", "operation"):
        page = getattr(client.scheduling if what == "workload" else client.trees, f"{what}_page")
        step(f"{what}_page", lambda page=page: page(limit=2, offset=1))
        step(f"{what}_page to the end", lambda page=page: page(offset=1))
        step(f"{what}_page past the end", lambda page=page: page(limit=5, offset=10))
        step(f"{what}_page after a page's end",
             lambda page=page: list(page(limit=5, after=page(limit=1).next).items))
        step(f"{what}_page after no cursor", lambda page=page: page(after="x"))
        step(f"{what}_page limit 0", lambda page=page: page(limit=0))
        step(f"{what}_page offset '1'", lambda page=page: page(offset="1"))
        step(f"{what}_page bad status", lambda page=page: page(status="done"))
    step("prune, older_than text", lambda: client.prune("30d"))  # type: ignore[arg-type]
    step("prune, older_than -1", lambda: client.prune(-1))
    step("prune, a dry run", lambda: client.prune(0, dry_run=True))
    step("prune", lambda: client.prune(0))
    step("list_requests after the prune", client.list_requests)
    # The most labels, keys and values as long as may be, in characters UTF-8 writes in 4
    # bytes: remotely a 413 before 2026-11-30 (a 64 KiB cap, and the SDK's JSON wrote each
    # as a 12-byte escape; found by helper-65).
    widest = {f"{i:02d}" + "\U0001F600" * 253: "\U0001F600" * 255 for i in range(64)}
    step("submit, the widest labels",
         lambda: client.submit({"gpu": 1}, component="sdk-low", labels=widest))
    step("scheduling.submit_workload, the widest labels",
         lambda: client.scheduling.submit_workload(demand={"cpu": "1"}, labels=widest))
    return steps


#: Workloads the service refuses: the API took some of them as its own (a label value by a
#: request's bound, 9 demand keys, ``instance_type`` by its argument's name), and the
#: embedded SDK let Python's own errors out for a list.
BAD_WORKLOADS: list[tuple[str, dict[str, Any], str]] = [
    ("a long label value", {"labels": {"a": "v" * 1025}},
     "InvalidInput: labels.a: must be at most 255 characters"),
    ("nine demand keys", {"demand": {f"k{i}": 1 for i in range(9)}},
     "InvalidInput: demand: unknown resource"),
    ("labels as a list", {"labels": ["a"]}, "InvalidInput: labels: must be a mapping (got ['a'])"),
    ("demand as a list", {"demand": [1]}, "InvalidInput: demand: must be a mapping (got [1])"),
    ("instance_type a number", {"instance_type": 5},
     "InvalidInput: instance_type: must be a string (got 5)"),
    ("a label value None", {"labels": {"a": None}},
     "InvalidInput: labels.a: must be a string (got null)"),
    ("a label key a number", {"labels": {5: "a"}}, "InvalidInput: labels key: must be a string (got 5)"),
    ("a demand key a number", {"demand": {5: 1}}, "InvalidInput: demand key: must be a string (got 5)"),
]


def test_every_sdk_call_answers_the_same_embedded_and_remote(tmp_path: Path, database_url: str) -> None:
    """Embedded on SQLite, remote through a server on SQLite, then on PostgreSQL."""
    server = ApiServer(tmp_path / "server.log", database_url=database_url)
    with running(server):
        with Client(home=str(tmp_path / "embedded"), url="") as embedded:
            local = every_sdk_call(embedded)
        with Client(url=server.url, home=str(tmp_path / "unused")) as over_http:
            remote = every_sdk_call(over_http)
        assert "Traceback" not in server.log()
    assert not (tmp_path / "unused").exists()  # remote mode never opened a local store
    differences = [f"{mine[0]}\n  embedded: {mine[1]}\n  remote:   {theirs[1]}"
                   for mine, theirs in zip(local, remote, strict=True) if mine != theirs]
    assert not differences, "\n".join(differences)
    # And the sequence did what it says (both modes equally wrong would pass the above).
    answers = dict(local)
    for name in ("submit, the widest labels", "scheduling.submit_workload, the widest labels"):
        assert len(answers[name]["labels"]) == 64, answers[name]
    for name, needle in [
        ("create_pool again", "Conflict: a resource pool named `sdk` already exists"),
        ("create_pool invalid", "InvalidInput: capacity.gpu"),
        ("create_pool NaN", "InvalidInput: capacity.gpu: must be an integer (got nan)"),
        ("pool_requests bad view", "InvalidInput: view: must be one of queued, active, all"),
        ("submit bad component type",
         "InvalidInput: component_type: must be one of orchestrator, step_operator"),
        ("create_pool, description not text", "InvalidInput: description: must be a string"),
        ("update_pool unknown", "NotFound: "),
        ("attach_policy unknown key", "InvalidInput: reserved.tpu"),
        ("update_policy nothing", "InvalidInput: policy: nothing to update"),
        ("update_policy step_operator", "NotFound: No policy found for step_operator `sdk-low`"),
        ("submit invalid", "InvalidInput: "),
        ("list_requests bad status", "InvalidInput: status"),
        ("request_page limit 0", "InvalidInput: limit: must be a positive integer (got 0)"),
        ("request_page limit 10001", "InvalidInput: limit: must be at most 10000"),
        ("request_page limit True", "InvalidInput: limit: must be an integer (got true)"),
        ("request_page limit '2'", "InvalidInput: limit: must be an integer (got '2')"),
        ("request_page limit 1.5", "InvalidInput: limit: must be an integer (got 1.5)"),
        ("request_page offset -1",
         "InvalidInput: offset: must be a non-negative integer (got -1)"),
        ("request_page offset 4611686018427387905",
         "InvalidInput: offset: must be at most 4611686018427387904"),
        ("request_page offset '0'", "InvalidInput: offset: must be an integer (got '0')"),
        ("request_page after no cursor", "InvalidInput: after: not the cursor of a page "
         "(a page's `next`) (got 'MjAyNg')"),
        ("prune, older_than text", "InvalidInput: older_than: must be an integer (got '30d')"),
        ("prune, older_than -1",
         "InvalidInput: older_than: must be a non-negative integer (got -1)"),
        *((f"{what}_page {label}", message) for what in ("workload", "operation")
          for label, message in (
              ("limit 0", "InvalidInput: limit: must be a positive integer (got 0)"),
              ("offset '1'", "InvalidInput: offset: must be an integer (got '1')"),
              ("bad status", "InvalidInput: status: must be one of"),
              ("after no cursor", "InvalidInput: after: not the cursor of a page"))),
        ("release again", "Conflict: "),
        ("cancel released", "Conflict: "),
        ("cancel, reason not text", "InvalidInput: reason: must be a string (got 5)"),
        ("create_pool, name a number", "InvalidInput: name: must be a string (got 5)"),
        ("pool_requests view a number",
         "InvalidInput: view: must be one of queued, active, all (got 5)"),
        ("list_requests, component a number", "InvalidInput: component: must be a string (got 5)"),
        ("list_policies, pool a number", "InvalidInput: pool: must be a string (got 5)"),
        ("attach_policy, component a number", "InvalidInput: component: must be a string (got 5)"),
        ("cancel, reason blank", "InvalidInput: reason: must be a non-empty string"),
        ("scheduling.apply_config based on another",
         "InvalidInput: based_on: no scheduler config version 7; the active one is version 1"),
        ("scheduling.rollback_config based on a bad version",
         "InvalidInput: based_on: must be a non-negative integer (got -1)"),
        ("scheduling.diff_config of text",
         "InvalidInput: version: must be an integer (got 'a\\x00b')"),
        ("scheduling.get_config of version 0",
         "InvalidInput: version: must be a positive integer (got 0)"),
        ("scheduling.rollback_config of a version past the last",
         "InvalidInput: version: must be at most 2147483647"),
        ("delete_pool with a live allocation", "Conflict: resource pool `sdk` has 1 live allocation"),
        ("get deleted", "NotFound: "),
        ("detach_policy again", "NotFound: "),
    ]:
        assert str(answers[name]).startswith(needle), (name, answers[name])
    assert answers["create_pool"]["capacity"] == {"gpu": 2, "step_run": 8}
    assert answers["update_pool"]["capacity"] == {"gpu": 3, "step_run": 8}
    assert [p["component"] for p in answers["list_policies"]] == ["sdk-high", "sdk-low"]  # by priority
    assert answers["submit"]["status"] == "allocated"
    assert answers["submit queued"]["status"] == "queued"
    assert answers["submit rejected"]["status"] == "rejected"
    assert answers["get by prefix"]["id"] == answers["submit queued"]["id"]
    assert [r["id"] for r in answers["list_requests queued"]] == [answers["submit queued"]["id"]]
    # sdk-low's three: held, queued, rejected; a page of two from the second on.
    low = [answers[n]["id"] for n in ("submit", "submit queued", "submit rejected")]
    assert [r["id"] for r in answers["request_page"]["items"]] == low[1:]
    assert answers["request_page"]["pagination"] == {
        "index": 1, "max_size": 2, "total_pages": 2, "total": 3, "next": None}
    assert [r["id"] for r in answers["request_page to the end"]["items"]] == low[1:]
    assert [r["id"] for r in answers["request_page after a page's end"]] == low[1:]
    assert answers["request_page past the end"]["items"] == []
    assert answers["request_page past the end"]["pagination"]["total"] == 3
    pruned = answers["prune"]
    assert pruned == {**answers["prune, a dry run"], "dry_run": False}
    assert pruned["requests"] >= 3 and pruned["events"] > pruned["requests"]
    assert (pruned["workloads"], pruned["operations"]) == (0, 0)  # all three of each live
    assert {r["status"] for r in answers["list_requests after the prune"]} <= {
        "queued", "allocated"}
    for what in ("workload", "operation"):  # three of each, made in the sequence's last lines
        rest = answers[f"{what}_page to the end"]
        assert rest["pagination"] == {"index": 1, "max_size": 3, "total_pages": 1, "total": 3,
                                      "next": None}
        assert answers[f"{what}_page"]["items"] == rest["items"][:2]
        assert answers[f"{what}_page after a page's end"] == rest["items"]  # from the second
        assert answers[f"{what}_page"]["pagination"]["total_pages"] == 2
        assert answers[f"{what}_page past the end"]["items"] == []
    assert [r["id"] for r in answers["pool_requests active"]] == [answers["submit"]["id"]]
    assert answers["get_pool"]["queue_length"] == 1
    assert [(c["name"], c["pools"], c["allocated"], c["queued"]) for c in answers["list_components"]] == [
        ("sdk-high", ["sdk"], 0, 0), ("sdk-low", ["sdk"], 1, 1)]
    assert answers["list_components of a type"] == []
    assert str(answers["list_components bad type"]).startswith("InvalidInput: component_type")
    assert str(answers["list_policies empty type"]).startswith("InvalidInput: component_type")
    assert [p["name"] for p in answers["list_pools"]] == ["sdk"]
    for odd in ODD_NAMES:
        assert answers[f"update_pool {odd}"]["name"] == odd
        assert answers[f"update_pool {odd}"]["capacity"] == {"gpu": 2}
        assert answers[f"delete_pool {odd}"] is None
    assert answers["get_pool after the odd names"]["capacity"] == {"gpu": 3, "step_run": 8}
    assert [p["component"] for p in answers["list_policies after the odd names"]] == [
        "sdk-high", "sdk-low"]
    assert str(answers["create_pool with a slash"]) == (
        'InvalidInput: name: must not contain "/": the API addresses it in URL paths'
        " (got 'sdk/2')")
    assert str(answers["create_pool .."]) == (
        'InvalidInput: name: must not be "." or "..": URLs drop such a path segment'
        " (got '..')")
    assert str(answers["attach_policy for a component ."]).startswith(
        'InvalidInput: component: must not be "." or ".."')
    assert answers["heartbeat"]["status"] == "allocated"
    assert answers["wait, still queued"]["status"] == "queued"
    assert answers["release"]["status"] == "released"
    assert answers["wait"]["status"] == "allocated"
    assert answers["delete_pool"] is None
    assert answers["cancel with a reason"]["status_reason"] == "cancelled: node drained"
    assert [(e["kind"], e["pool"]) for e in answers["events"]] == [
        ("created", None), ("allocated", "sdk"), ("reprioritized", "sdk"), ("released", None)]
    assert [e["kind"] for e in answers["events of a deleted request"]] == [
        "created", "allocated", "deleted"]
    assert str(answers["events unknown"]).startswith("NotFound: no request")
    assert answers["scheduling.preview_config"]["based_on"] == 0
    assert "+ queue ml_training: added" in answers["scheduling.preview_config"]["changes"]
    assert str(answers["scheduling.preview_config of a changed queue"]).startswith(
        "ConfigError: invalid scheduler config (1 problem): resource_queues[0].resource_groups: "
        "queue 'ml_training' differs from its spec in version 1")
    for label, _, needle in BAD_WORKLOADS:
        assert str(answers[f"scheduling.submit_workload {label}"]).startswith(needle), label
    for label, _, message in BAD_TREE_CALLS:
        assert answers[f"trees.{label}"] == f"InvalidInput: {message}", label
    for name, field in [("create_pool, capacity a list", "capacity"),
                        ("update_pool, capacity a list", "capacity"),
                        ("attach_policy, reserved a list", "reserved"),
                        ("update_policy, limit a list", "limit"),
                        ("submit, demand a list", "resources"), ("submit, labels a list", "labels")]:
        assert str(answers[name]).startswith(f"InvalidInput: {field}: must be a mapping"), name
    assert [c["version"] for c in answers["scheduling.list_configs"]] == [2, 1]
    assert [t["name"] for t in answers["trees.list_trees"]] == ["tpus"]
    assert answers["trees.create_pool, read-only options"]["config"] == {"resource_limits": {"gpu": 2}}


#: Tree calls given the wrong shape: Python's own ValueError for a list where a mapping goes,
#: and a string taken for a list of its characters (tags "abc" were tags a, b and c), embedded
#: and remote, before 2026-11-30. Some are fields the API names otherwise (``trees`` is
#: ``pool_trees``, ``options`` is ``config``), which the remote client checks itself.
BAD_TREE_CALLS: list[tuple[str, Callable[[Any], Any], str]] = [
    ("add_node, resources a list", lambda t: t.add_node("n", (), ["gpu"]),
     "resources: must be a mapping (got ['gpu'])"),
    ("add_node, tags a string", lambda t: t.add_node("n", "abc", {"gpu": 1}),
     "tags: must be a list (got 'abc')"),
    ("add_node, tags a number", lambda t: t.add_node("n", 5, {"gpu": 1}),
     "tags: must be a list (got 5)"),
    ("create_tree, options a list", lambda t: t.create_tree("t2", ["x"]),
     "options: must be a mapping (got ['x'])"),
    ("create_pool, options a list", lambda t: t.create_pool("tpus", "p", options=["x"]),
     "options: must be a mapping (got ['x'])"),
    ("start_operation, job_resources a list",
     lambda t: t.start_operation(user="u", job_resources=["gpu"], job_count=1),
     "job_resources: must be a mapping (got ['gpu'])"),
    ("start_operation, resource_limits a list",
     lambda t: t.start_operation(user="u", job_resources={"gpu": 1}, job_count=1,
                                 resource_limits=["gpu"]),
     "resource_limits: must be a mapping (got ['gpu'])"),
    ("start_operation, tree_options a list",
     lambda t: t.start_operation(user="u", job_resources={"gpu": 1}, job_count=1,
                                 trees=["tpus"], tree_options=["tpus"]),
     "tree_options: must be a mapping (got ['tpus'])"),
    # A number where a name goes: told so, under the API's name for the field, before the
    # tree is looked up (embedded said "tree: must match ..." or "no pool tree" before).
    ("create_tree, name a number", lambda t: t.create_tree(5), "name: must be a string (got 5)"),
    ("apply_tree, document a number", lambda t: t.apply_tree(5),
     "document: must be a string (got 5)"),
    ("apply_tree, name a number", lambda t: t.apply_tree("name: t3\n", 5),
     "name: must be a string (got 5)"),
    ("create_pool, name a number", lambda t: t.create_pool("no-such-tree", 5),
     "name: must be a string (got 5)"),
    ("create_pool, parent a number", lambda t: t.create_pool("tpus", "p9", parent=5),
     "parent: must be a string (got 5)"),
    ("add_node, name a number", lambda t: t.add_node(5, (), {"gpu": 1}),
     "name: must be a string (got 5)"),
    ("add_node, a tag a number", lambda t: t.add_node("n", ["a", 5], {"gpu": 1}),
     "tags.1: must be a string (got 5)"),
    ("start_operation, user a number",
     lambda t: t.start_operation(user=5, job_resources={"gpu": 1}, job_count=1),
     "user: must be a string (got 5)"),
    ("start_operation, trees a string",
     lambda t: t.start_operation(user="u", job_resources={"gpu": 1}, job_count=1, trees="tpus"),
     "trees: must be a list (got 'tpus')"),
]


# -- answers lost on the way back ----------------------------------------------------------------

class LosesOneAnswer(httpx.BaseTransport):
    """Carries requests to the server for real, but spoils the answer to the first one whose
    method and path end match, as ``how`` says: "drop" it, as when the server dies between
    its commit and its answer; "503 after", answer 503 once the server did it (its database
    failed at the commit, which may have taken effect); "503 before", answer 503 without
    sending it on (the database is away); "502 before", "504 after": a proxy's page, as while
    the server behind it restarts; "drop, then away": drop it, then refuse every connection
    after (the server died then)."""

    def __init__(self, method: str, path_end: str, how: str = "drop") -> None:
        self.real = httpx.HTTPTransport()
        self.method, self.path_end, self.how = method, path_end, how
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.lost and self.how == "drop, then away":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        spoil = not self.lost and request.method == self.method and request.url.path.endswith(self.path_end)
        status, _, when = self.how.partition(" ")
        if spoil and when == "before":
            self.lost += 1
            return away(int(status))
        response = self.real.handle_request(request)
        if spoil:
            response.read()
            response.close()
            self.lost += 1
            if when == "after":
                return away(int(status))
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return response

    def close(self) -> None:
        self.real.close()


def away(status: int) -> httpx.Response:
    """The server's 503 or 500, or a proxy's 502 or 504 page (nginx's words)."""
    if status == 503:
        return httpx.Response(503, json={"detail": "database busy or unreachable; retry later"})
    if status == 500:
        return httpx.Response(500, json={"detail": "internal error (KeyError)", "field": None})
    phrase = {502: "Bad Gateway", 504: "Gateway Time-out"}[status]
    return httpx.Response(status, html=f"<html><head><title>{status} {phrase}</title></head>"
                                       f"<body><center><h1>{status} {phrase}</h1></center>"
                                       "<hr><center>nginx</center></body></html>")


def unsendable_calls(client: Client) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("name", lambda: client.create_pool(b"gp", {"gpu": 1})),  # type: ignore[arg-type]
        ("capacity.gpu", lambda: client.create_pool("gp", {"gpu": b"1"})),  # type: ignore[dict-item]
        ("capacity.gpu", lambda: client.create_pool("gp", {"gpu": {1}})),  # type: ignore[dict-item]
        ("description", lambda: client.create_pool("gp", {"gpu": 1}, description=b"d")),  # type: ignore[arg-type]
        ("resources.gpu", lambda: client.submit({"gpu": b"1"}, component="x")),  # type: ignore[dict-item]
        ("component", lambda: client.submit({"gpu": 1}, component=b"x")),  # type: ignore[arg-type]
        ("labels.a", lambda: client.submit({"gpu": 1}, component="x", labels={"a": b"b"})),  # type: ignore[dict-item]
        ("component", lambda: client.attach_policy("p", b"x", reserved={"gpu": 1})),  # type: ignore[arg-type]
    ]


def test_a_value_json_cannot_carry_is_refused_naming_its_field_as_embedded(
    server: ApiServer, tmp_path: Path
) -> None:
    """Bytes or a set in a body: the JSON encoder's TypeError before 2026-11-30. The remote
    SDK refuses it naming the field the embedded service names (in words of its own: which
    type the field wants, only the server knows), and sends nothing."""
    with Client(home=str(tmp_path), url="") as embedded, Client(url=server.url) as remote:
        for (field, local), (_, over_http) in zip(
            unsendable_calls(embedded), unsendable_calls(remote), strict=True
        ):
            with pytest.raises(InvalidInput) as here:
                local()
            with pytest.raises(InvalidInput) as there:
                over_http()
            assert (here.value.field, there.value.field) == (field, field)
            value = there.value.value
            assert str(there.value) == (
                f"{field}: JSON cannot carry a {type(value).__name__} (got {value!r})")
        assert not [p for p in remote.list_pools() if p.name == "gp"]


@contextmanager
def losing(server: ApiServer, method: str, path_end: str, how: str = "drop") -> Iterator[RemoteService]:
    service = RemoteService(server.url)
    service.http.close()
    transport = LosesOneAnswer(method, path_end, how)
    service.http = httpx.Client(base_url=server.url + API, transport=transport)
    try:
        yield service
    finally:
        service.close()
    assert transport.lost == 1


def test_a_write_whose_answer_was_lost_before_the_server_went_away_may_stand(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error says the write may have been carried out (it was: the workload holds
    quota), so that it is looked for before it is sent again; a read, or a write no attempt
    of which was sent, says only that the server cannot be reached."""
    monkeypatch.setattr("fairpool.remote.jittered", lambda delay: 0.0)
    with losing(server, "POST", "/workloads", "drop, then away") as lost:
        with pytest.raises(Unreachable) as raised:
            RemoteScheduling(lost).submit_workload(labels={"lost": "answer"})
        with pytest.raises(Unreachable) as read:
            RemoteScheduling(lost).list_workloads()

    assert str(raised.value).endswith(
        "after 6 attempts: [Errno 111] Connection refused; an attempt reached the server and "
        "its answer was lost, so it may have been carried out: look before sending it again")
    assert str(read.value).endswith("after 6 attempts: [Errno 111] Connection refused")
    with losing(server, "POST", "/config/preview", "drop, then away") as lost:
        with pytest.raises(Unreachable) as previewed:  # a POST that only reads
            RemoteScheduling(lost).preview_config("resource_flavors: [{name: f}]\n")
    assert str(previewed.value).endswith("after 6 attempts: [Errno 111] Connection refused")
    with closing(RemoteService(server.url)) as plain:
        made = [w for w in RemoteScheduling(plain).list_workloads()
                if w["labels"].get("lost") == "answer"]
    assert [w["status"] for w in made] == ["admitted"]
    with closing(RemoteService("http://127.0.0.1:9")) as nowhere:  # never sent
        with pytest.raises(Unreachable) as refused:
            RemoteScheduling(nowhere).submit_workload()
    assert "may have been carried out" not in str(refused.value)


@pytest.mark.parametrize("how", ["503 before", "503 after", "502 before", "504 after"])
def test_a_503_is_retried_and_what_it_asked_is_done_once(server: ApiServer, how: str) -> None:
    """The server's "database busy or unreachable; retry later" is retried, backing off, as a
    transport failure is: each call does what it asks once. So are a proxy's 502 and 504
    while the server behind it restarts (before 2026-11-29 they ended `fairpool run`'s
    command, and left a waiter's request queued for nobody)."""
    pool = "busy-" + how.replace(" ", "-")
    setup_pool(server.url, pool, [f"{pool}-orch"], {"gpu": 2})
    with closing(RemoteService(server.url)) as plain:
        with losing(server, "POST", "/requests", how) as service:
            held = service.create_request(f"{pool}-orch", demand={"gpu": 2}, lease_ttl=60)
        assert [r.id for r in plain.list_requests(component=f"{pool}-orch")] == [held.id]
        queued = plain.create_request(f"{pool}-orch", demand={"gpu": 1})
        with losing(server, "POST", "/heartbeat", how) as service:
            assert service.heartbeat(held.id).status == "allocated"
        with losing(server, "GET", "/wait", how) as service:
            assert service.wait(queued.id, 0).status == "queued"
        with losing(server, "POST", "/release", how) as service:
            assert service.release_request(held.id).status == "released"
        with losing(server, "POST", "/cancel", how) as service:
            assert service.cancel_request(queued.id).status == "cancelled"


def test_a_holder_rides_out_a_heartbeat_answered_500(server: ApiServer) -> None:
    """Only a refusal (401, 403) loses a grant: a server's 500 on one heartbeat ended the
    block as lost, and left its units held until the lease ran out."""
    setup_pool(server.url, "five-gpus", ["five-orch"], {"gpu": 1})
    with losing(server, "POST", "/heartbeat", "500 before") as service:
        client = Client(server.url)
        client._service = service
        with client.acquire({"gpu": 1}, component="five-orch", lease_ttl=3) as grant:
            time.sleep(2.5)  # a heartbeat a second: the first answered 500
            grant.check()
        assert client.get(grant.id).status == "released"
        assert service.http._transport.lost == 1  # type: ignore[attr-defined]


def test_a_proxy_that_stays_away_is_unreachable_in_its_own_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the retries are spent, a proxy's 502 is an ``Unreachable`` (which `fairpool run`
    and the SDK ride out) and says its status, not the proxy's HTML."""
    monkeypatch.setattr("fairpool.remote.jittered", lambda delay: 0.0)
    sent: list[str] = []

    def proxy(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return away(502)

    with closing(RemoteService("http://127.0.0.1:9")) as service:
        service.http = httpx.Client(base_url="http://127.0.0.1:9" + API,
                                    transport=httpx.MockTransport(proxy))
        with pytest.raises(Unreachable) as raised:
            service.get_request("abcd")
    # Naming the server, as an unreachable one is named (helper-75: not with a 503).
    assert str(raised.value) == (
        "the fairpool server at http://127.0.0.1:9 answered HTTP 502 6 times: Bad Gateway")
    assert len(sent) == 6


def test_a_release_cancel_or_delete_whose_answer_was_lost_is_not_a_conflict(server: ApiServer) -> None:
    """RemoteService sends the call again; the first attempt did it, so the retry's 409 / 404
    only means done."""
    setup_pool(server.url, "lost-gpus", ["lost-orch"], {"gpu": 2})
    with closing(RemoteService(server.url)) as plain:
        held = plain.create_request("lost-orch", demand={"gpu": 2})
        queued = plain.create_request("lost-orch", demand={"gpu": 1})
        with losing(server, "POST", "/release") as service:
            assert service.release_request(held.id).status == "released"
        with losing(server, "POST", "/cancel") as service:
            assert service.cancel_request(queued.id).status == "cancelled"
        with losing(server, "DELETE", queued.id) as service:
            service.delete_request(queued.id)
        with pytest.raises(NotFound):
            plain.get_request(queued.id)
        # A conflict that is not ours still is one.
        with pytest.raises(Conflict, match="released, not allocated"):
            plain.release_request(held.id)


def test_a_create_whose_answer_was_lost_is_created_once(server: ApiServer) -> None:
    setup_pool(server.url, "twice-gpus", ["twice-orch"], {"gpu": 2})
    with losing(server, "POST", "/requests") as service:
        service.create_request("twice-orch", demand={"gpu": 1})
        assert len(service.list_requests(component="twice-orch")) == 1


@pytest.mark.parametrize("how", ["drop", "503 after"])
def test_workloads_and_operations_whose_answers_were_lost_are_made_and_ended_once(
    server: ApiServer, how: str
) -> None:
    """As requests: a submit or a start sent again made a second workload or operation
    (holding quota or nodes nobody knew of), and a release, cancel, completion or abort sent
    again failed with a conflict although it was done."""
    user = "lost-" + how.split()[0]
    with closing(RemoteService(server.url)) as plain:
        scheduling, trees = RemoteScheduling(plain), RemoteTrees(plain)
        trees.add_node(f"{user}-node", [user], {"cpu": 8})
        trees.create_tree(user, {"node_tag_filter": user})
        made = []
        for path, action in (("/workloads", "release"), ("/workloads", "cancel"),
                             ("/operations", "complete"), ("/operations", "abort")):
            with losing(server, "POST", path, how) as service:
                if path == "/workloads":
                    made.append(RemoteScheduling(service).submit_workload(
                        labels={"team": user}, demand={"cpu": 1}))
                else:
                    made.append(RemoteTrees(service).start_operation(
                        user=user, job_resources={"cpu": 1}, job_count=2, trees=[user]))
            with losing(server, "POST", f"/{action}", how) as service:
                ending = {"release": RemoteScheduling(service).release_workload,
                          "cancel": RemoteScheduling(service).cancel_workload,
                          "complete": RemoteTrees(service).complete_operation,
                          "abort": RemoteTrees(service).abort_operation}[action]
                assert ending(made[-1]["id"])["status"] in (
                    "finished", "cancelled", "completed", "aborted")
        mine = [w for w in scheduling.list_workloads() if w["labels"].get("team") == user]
        assert sorted(w["status"] for w in mine) == ["cancelled", "finished"]
        assert sorted(o["status"] for o in trees.list_operations(tree=user)) == [
            "aborted", "completed"]
        # A config change confirmed against the active version: its retry found its own
        # version active, was refused as stale ("nothing applied") or applied it again.
        def active() -> int:
            return max(v["version"] for v in scheduling.list_configs()) if (
                scheduling.list_configs()) else 0

        document = f"resource_queues: [{{name: {user}}}]\n"
        with losing(server, "POST", "/config", how) as service:
            applied = RemoteScheduling(service).apply_config(document, based_on=active())
        assert applied["version"]["version"] == active()
        assert applied["version"]["active"] and applied["version"]["queues"] == 1
        with losing(server, "POST", "/rollback", how) as service:
            rolled = RemoteScheduling(service).rollback_config(1, based_on=active())
        assert (rolled["version"]["version"], rolled["version"]["rolled_back_from"]) == (
            active(), 1)
        assert [v["version"] for v in scheduling.list_configs()][:2] == [active(), active() - 1]
        # A key another call made, asking otherwise: a conflict, not that call's answer.
        first = plain.http.post("/workloads", json={"idempotency_key": "k-" + user})
        again = plain.http.post("/workloads", json={"idempotency_key": "k-" + user,
                                                     "priority": 5})
        assert (first.status_code, again.status_code) == (201, 409), again.text
        assert "asked otherwise" in again.json()["detail"]


@pytest.mark.parametrize("how", ["drop", "503 after"])
def test_admin_calls_whose_answers_were_lost_are_done_once(server: ApiServer, how: str) -> None:
    """A pool, a policy, a node, a pool tree or a tree's pool made, a pool's key removed, or
    any of them deleted by an attempt whose answer was lost: the retry was refused (409
    "already exists", 422 "no key of the pool", 404) for what was done. It answers what the
    server holds if that is what was asked; one asking otherwise still is refused."""
    name = "admin-" + how.split()[0]
    orch, node, pool = f"{name}-orch", f"{name}-node", f"{name}-pool"
    with closing(RemoteService(server.url)) as plain:
        with losing(server, "POST", "/pools", how) as service:
            made = service.create_pool(name, {"gpu": 2, "cpu": 4}, description="lost")
        assert (made.name, made.capacity, made.description) == (name, {"gpu": 2, "cpu": 4}, "lost")
        with losing(server, "POST", "/policies", how) as service:
            policy = service.attach_policy(name, orch, priority=3, reserved={"gpu": 1},
                                           limit={"gpu": 2})
        assert (policy.component, policy.priority, policy.reserved, policy.limit) == (
            orch, 3, {"gpu": 1}, {"gpu": 2})
        with losing(server, "PATCH", f"/pools/{name}", how) as service:
            assert service.update_pool(name, {"cpu": 0, "gpu": 3}).capacity == {"gpu": 3}
        with losing(server, "DELETE", f"/policies/{orch}", how) as service:
            service.detach_policy(name, orch)
        with losing(server, "DELETE", f"/pools/{name}", how) as service:
            service.delete_pool(name)
        assert name not in [p.name for p in plain.list_pools()]

        with losing(server, "POST", "/nodes", how) as service:
            added = RemoteTrees(service).add_node(node, [name, name], {"cpu": 8, "memory": "1GiB"})
        assert (added["tags"], added["resources"]) == ([name], {"cpu": 8, "memory": 2**30})
        with losing(server, "POST", "/pool-trees", how) as service:
            tree = RemoteTrees(service).create_tree(name, {"node_tag_filter": name})
        assert (tree["config"], tree["nodes"]) == ({"node_tag_filter": name}, [node])
        # A tree made from a document (pool-tree create --config-file): refused when it
        # exists, as a create, so its retry is too.
        whole = f"{name}-doc"
        document = f"config: {{node_tag_filter: {whole}}}\npools:\n  q: {{pools: {{r: {{}}}}}}\n"
        with losing(server, "POST", "/pool-trees/apply", how) as service:
            applied = RemoteTrees(service).apply_tree(document, whole, create=True)
        assert applied["changes"] == [f"+ tree {whole}", "+ pool q", "+ pool r"]
        with losing(server, "POST", "/pools", how) as service:
            made_pool = RemoteTrees(service).create_pool(name, pool, None, {"weight": 10})
        assert (made_pool["parent"], made_pool["config"]) == (None, {"weight": 10})

        # Another's, asking otherwise: the name is taken, as the refusal says.
        theirs = f"{name}-theirs"
        plain.create_pool(theirs, {"gpu": 2})
        plain.attach_policy(theirs, orch)
        for path, again in (
            ("/pools", lambda s: s.create_pool(theirs, {"gpu": 1})),
            ("/policies", lambda s: s.attach_policy(theirs, orch, priority=1)),
            ("/nodes", lambda s: RemoteTrees(s).add_node(node, [name], {"cpu": 9})),
            ("/pool-trees", lambda s: RemoteTrees(s).create_tree(name, {"main_resource": "cpu"})),
            ("/pools", lambda s: RemoteTrees(s).create_pool(name, pool, None, {"weight": 2})),
            ("/pool-trees/apply",
             lambda s: RemoteTrees(s).apply_tree("pools: {q: {}}\n", whole, create=True)),
        ):
            with losing(server, "POST", path, how) as service, pytest.raises(
                Conflict, match="already"
            ):
                again(service)

        with losing(server, "DELETE", f"/pools/{pool}", how) as service:
            RemoteTrees(service).delete_pool(name, pool)
        with losing(server, "DELETE", f"/pool-trees/{name}", how) as service:
            RemoteTrees(service).delete_tree(name)
        RemoteTrees(plain).delete_tree(whole)
        with losing(server, "DELETE", f"/nodes/{node}", how) as service:
            RemoteTrees(service).remove_node(node)
        trees = RemoteTrees(plain)
        assert name not in [t["name"] for t in trees.list_trees()]
        assert node not in [n["name"] for n in trees.list_nodes()]


def test_the_light_vocabulary_agrees_with_the_stores_enums() -> None:
    """Remote mode and the CLI's options use ``views``' tuples, which must not load
    SQLAlchemy; the store and the API have their own spelling of the same values."""
    from typing import get_args

    from fairpool.api.models import ComponentType as ApiComponentType
    from fairpool.store.records import ComponentType, RequestStatus, WorkloadStatus
    from fairpool.store.tree_records import OperationStatus
    from fairpool.views import (
        COMPONENT_TYPES,
        OPERATION_STATUSES,
        REQUEST_STATUSES,
        WORKLOAD_STATUSES,
    )

    assert COMPONENT_TYPES == tuple(t.value for t in ComponentType) == get_args(ApiComponentType)
    assert REQUEST_STATUSES == tuple(s.value for s in RequestStatus)
    assert WORKLOAD_STATUSES == tuple(s.value for s in WorkloadStatus)
    assert OPERATION_STATUSES == tuple(s.value for s in OperationStatus)


def test_the_server_says_which_store_it_serves_the_password_hidden(
    tmp_path: Path, database_url: str
) -> None:
    given = database_url.replace("postgres@", "postgres:secret@")  # trust auth ignores it
    server = ApiServer(tmp_path / "server.log", database_url=given,
                       extra=("--log-level", "info"))
    with running(server):
        pass
    shown = given.replace(":secret@", ":***@")
    assert f"Store: {shown}\n" in server.log(), server.log()
    assert "secret" not in server.log()


# -- a Client made before a fork --------------------------------------------------------------


def forked_children_get_their_own_answers(client: Client, name: str) -> None:
    """Processes forked after ``client`` talked each ask for a pool of their own, all at once,
    as the parent does: each gets its own. They shared the parent's connection (remote: its
    keep-alive socket; PostgreSQL: its session), and got each other's answers, or the
    driver's errors (helper-94)."""
    pools = [f"{name}-{i}" for i in range(4)]
    for pool in pools:
        client.create_pool(pool, {"gpu": 1})
    assert client.get_pool(pools[0]).name == pools[0]  # the connection is made and kept

    def ask(pool: str) -> bool:
        return all(client.get_pool(pool).name == pool for _ in range(25))

    # A thread of the parent writes all along: forked mid-batch, a child's writes waited for
    # ever behind the leader thread it does not have (helper-97).
    writing = threading.Event()
    writing.set()

    def write() -> None:
        while writing.is_set():
            client.update_pool(pools[0], description=str(time.monotonic()))

    writer = threading.Thread(target=write)
    writer.start()
    children = []
    try:
        for pool in pools[1:]:
            pid = os.fork()
            if pid == 0:  # the child: its verdict as its exit status, nothing else run
                code = 1
                try:
                    client.update_pool(pool, description="child")  # a write, at once
                    code = 0 if ask(pool) else 3
                finally:
                    os._exit(code)
            children.append(pid)
            time.sleep(0.05)
    finally:
        writing.clear()
        writer.join()
    assert ask(pools[0])
    assert [_exit_code_within(pid, 60) for pid in children] == [0, 0, 0]
    assert ask(pools[0])  # and the parent's connection still works


def _exit_code_within(pid: int, seconds: float) -> int | None:
    """The child's exit code, or None (it is killed) if it has not ended within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_remote_client_made_before_a_fork_serves_each_process(server: ApiServer,
                                                               client: Client) -> None:
    forked_children_get_their_own_answers(client, f"fork-{uuid.uuid4().hex[:6]}")


def test_an_embedded_client_made_before_a_fork_serves_each_process(database_url: str) -> None:
    with Client(database_url=database_url, url="") as client:
        forked_children_get_their_own_answers(client, "fork")


def test_a_client_says_what_it_works_on_and_answers_after_close(server: ApiServer,
                                                                 tmp_path: Path) -> None:
    """``repr`` showed ``<fairpool.client.Client object at 0x…>``; a remote client used after
    ``close()`` raised httpx's RuntimeError, where an embedded one answers (helper-94)."""
    userinfo = server.url.replace("http://", "http://me:secret@")
    with Client(url=userinfo) as remote:
        assert repr(remote) == f"<fairpool.Client on server {server.url.replace('http://', 'http://me:***@')}>"
    embedded = Client(home=str(tmp_path))
    assert repr(embedded) == f"<fairpool.Client on database sqlite:///{tmp_path}/fairpool.db>"
    assert repr(AsyncClient(url=server.url)) == f"<fairpool.AsyncClient on server {server.url}>"
    name = f"closed-{uuid.uuid4().hex[:6]}"
    for client in (Client(url=server.url), embedded):
        client.create_pool(name, {"gpu": 1})
        client.attach_policy(name, name)
        client.close()
        assert client.get_pool(name).name == name
        with client.acquire({"gpu": 1}, component=name) as grant:
            assert repr(grant) == (f"<fairpool.Grant of request {grant.id} on pool {name}: "
                                   "{'gpu': 1, 'step_run': 1}>")
        client.close()


def test_refs_and_filters_longer_than_any_name_are_answered_as_embedded(
        server: ApiServer, client: Client, tmp_path: Path) -> None:
    """Past httpx's URL limit they raised its InvalidURL (a traceback in the CLI), where the
    embedded store says not found, or the filter's bound (helper-97)."""
    embedded = Client(home=str(tmp_path), url="")
    for each in (client, embedded):
        with pytest.raises(NotFound, match=r"^no resource pool 'ééé"):
            each.get_pool("é" * 20_000)
        with pytest.raises(NotFound, match=r"^no request"):
            each.get(" " * 70_000)
        with pytest.raises(InvalidInput, match=r"^component: must be at most 255 characters"):
            each.list_requests(component="x" * 70_000)
    embedded.close()
