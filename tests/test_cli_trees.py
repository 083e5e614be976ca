"""``fairpool node | pool-tree | pool | operation``, run for real in subprocesses on a SQLite
home: the issue's commands in order, JSON output, and one ``Error:`` line with nothing written
for bad input; and through a server with ``--url``, whose reconciler tick acts on starvation.
(Every command's output embedded vs remote is compared in ``tests/test_remote.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BACKENDS, Backend
from tests.servers import running, server_on
from tests.test_cli import Result, assert_one_error, db_dump, fairpool

SEED_TREE = """
name: physical
config: {node_tag_filter: gpu, main_resource: cpu}
pools:
  project-root:
    strong_guarantee_resources: {cpu: 100}
    pools:
      project-adhoc: {strong_guarantee_resources: {cpu: 80}}
      project-batch: {}
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's tour up to the first operation."""
    home = tmp_path_factory.mktemp("trees")
    fairpool(home, "node", "add", "gpu-01", "--tags", "gpu,a100", "--resources",
             '{"cpu": 64, "memory": "512GiB", "gpu": 8, "user_slots": 64}').ok()
    fairpool(home, "node", "add", "gpu-02", "--tags", "gpu", "--resources",
             '{"cpu": 36, "memory": "512GiB", "gpu": 8, "user_slots": 64}').ok()
    fairpool(home, "pool-tree", "create", "physical", "--node-tag-filter", "gpu",
             "--main-resource", "cpu").ok()
    fairpool(home, "pool", "create", "project-root", "--tree", "physical", "--strong-guarantee",
             '{"cpu": 100}', "--max-running-operation-count", "10").ok()
    fairpool(home, "pool", "create", "project-adhoc", "--tree", "physical", "--parent",
             "project-root", "--strong-guarantee", '{"cpu": 80}').ok()
    fairpool(home, "pool", "create", "project-batch", "--tree", "physical", "--parent",
             "project-root").ok()
    fairpool(home, "pool", "set", "project-batch", "--tree", "physical", "weight", "10").ok()
    return home


def test_the_issues_tour(home: Path) -> None:
    started = fairpool(home, "operation", "start", "--tree", "physical", "--pool",
                       "project-batch", "--user", "alice", "--job-resources",
                       '{"cpu": 1, "memory": "4GiB"}', "--job-count", "200", "--weight", "2",
                       "-o", "json").ok().json
    assert (started["status"], started["running_jobs"], started["pending_jobs"]) == (
        "running", 100, 100)
    assert started["job_resources"] == {"cpu": 1, "memory": 4 * 2**30, "user_slots": 1}
    shown = fairpool(home, "pool-tree", "show", "physical").ok().out
    assert "project-batch" in shown and "FAIR SHARE" in shown and "DOMINANT RESOURCE" in shown
    tree = fairpool(home, "pool-tree", "show", "physical", "-o", "json").ok().json
    batch = next(e for e in tree["elements"] if e["name"] == "project-batch")
    assert (batch["fair_share"], batch["usage_share"], batch["dominant_resource"]) == (
        1.0, 1.0, "cpu")
    pool = fairpool(home, "pool", "describe", "project-batch", "--tree", "physical", "-o",
                    "json").ok().json
    assert pool["config"] == {"weight": 10}
    assert pool["effective"]["effective_max_running_operation_count"] == 50
    assert (pool["running_operation_count"], pool["operation_count"]) == (1, 1)
    # The table has the per-resource shares too (only JSON had them; found by helper-71).
    table = fairpool(home, "pool", "describe", "project-batch", "--tree", "physical").ok().out
    assert "Detailed fair share" in table
    assert [line.split("│")[2].strip() for line in table.splitlines()
            if line.startswith("│ FAIR SHARE ") and "cpu" in line] == [", ".join(
        f"{key} {value}" for key, value in pool["detailed"]["fair_share"].items())]
    described = fairpool(home, "operation", "describe", started["id"][:8]).ok().out
    assert "no node of tree physical has room" in described
    # Memory as it was written, not 4294967296 (helper-89); bytes in JSON.
    assert "memory 4GiB" in described
    assert "memory 512GiB" in fairpool(home, "node", "list").ok().out
    fairpool(home, "pool-tree", "set", "physical", "fair_share_starvation_timeout", "1000").ok()
    config = fairpool(home, "pool-tree", "list", "-o", "json").ok().json["items"][0]["config"]
    assert config["fair_share_starvation_timeout"] == 1000
    ended = fairpool(home, "operation", "complete", started["id"], "-o", "json").ok().json
    assert (ended["status"], ended["running_jobs"]) == ("completed", 0)
    nodes = fairpool(home, "node", "list", "-o", "json").ok().json["items"]
    assert [(n["name"], n["tree"], n["running_jobs"]) for n in nodes] == [
        ("gpu-01", "physical", 0), ("gpu-02", "physical", 0)]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("pool", "set", "project-batch", "--tree", "physical", "wieght", "10"),
         ("wieght: unknown pool option; did you mean 'weight'?",)),
        (("pool", "create", "x", "--tree", "physical", "--parent", "project-adhoc",
          "--strong-guarantee", '{"cpu": 81}'), ("strong_guarantee_resources.cpu", "81")),
        (("pool-tree", "set", "physical", "fair_share_starvation_tolerance", "2"),
         ("fair_share_starvation_tolerance: must be between 0 and 1",)),
        (("operation", "start", "--tree", "physical", "--pool", "project-batch", "--user", "u",
          "--job-resources", '{"cpu": 65}', "--job-count", "1"),
         ("job_resources.cpu", "largest: 64")),
        (("operation", "start", "--tree", "physical", "--pool", "project-batch", "--user", "u",
          "--job-resources", '{"cpu": 1, "memory": "600GiB"}', "--job-count", "1"),
         ("job_resources.memory: no node of tree physical has that much (largest: 512GiB) "
          "(got '600GiB')",)),
        (("node", "add", "bad name", "--resources", '{"cpu": 1}'), ("name", "bad name")),
        # A number given by a flag is shown as a number, as in YAML or JSON.
        (("pool", "create", "x", "--tree", "physical", "--weight", "0"),
         ("weight: must be positive (got 0)",)),
        (("operation", "start", "--tree", "physical", "--pool", "project-batch", "--user", "u",
          "--job-resources", '{"cpu": 1}', "--job-count", "1", "--weight", "-0.5"),
         ("weight: must be positive (got -0.5)",)),
        # A negative VALUE is the value, not an option.
        (("pool", "set", "project-batch", "--tree", "physical", "weight", "-1"),
         ("weight: must be positive (got -1)",)),
        (("pool-tree", "set", "physical", "fair_share_starvation_tolerance", "-0.5"),
         ("fair_share_starvation_tolerance: must be between 0 and 1 (got -0.5)",)),
        (("pool", "describe", "nope", "--tree", "physical"), ("no pool 'nope'",)),
        # No --pool: the user's name is the pool's, and the error says so (it blamed `pool`).
        (("operation", "start", "--tree", "physical", "--user", "bad user", "--job-resources",
          '{"cpu": 1}', "--job-count", "1"),
         ("user: used as the pool name (no --pool), must match [-_a-zA-Z0-9:]+ "
          "(got 'bad user')",)),
        (("pool", "set", "project-batch", "--tree", "physical", "integral_guarantees",
          "{guarantee_type: bursty}"),
         ("integral_guarantees.guarantee_type: must be none, burst or relaxed", "bursty")),
        (("pool", "set", "project-batch", "--tree", "physical", "integral_guarantees",
          "{guarantee_type: relaxed, relaxed_share_multiplier_limit: 11}"),
         ("integral_guarantees.relaxed_share_multiplier_limit: must be between 1 and 10",)),
        # A child's flow must fit in its parent's (YTsaurus's master checks it).
        (("pool", "set", "project-adhoc", "--tree", "physical", "integral_guarantees",
          "{guarantee_type: burst, resource_flow: {cpu: 10}}"),
         ("pool project-root: integral_guarantees.resource_flow.cpu: is less than its "
          "children's sum 10 (got 0)",)),
        # A key given twice in an option's mapping, as in a tree document (the last was kept).
        (("pool", "create", "x", "--tree", "physical", "--config", "{weight: 1, weight: 2}"),
         ("config.weight: duplicate key 'weight' on line 1 (first on line 1)",)),
        (("pool", "create", "x", "--tree", "physical", "--config", '{"weight": 1, "weight": 2}'),
         ("config.weight: duplicate key 'weight' on line 1 (first on line 1)",)),
        (("pool-tree", "create", "t2", "--config", "{main_resource: cpu, main_resource: gpu}"),
         ("config.main_resource: duplicate key 'main_resource' on line 1 (first on line 1)",)),
        (("pool", "set", "project-batch", "--tree", "physical", "integral_guarantees",
          "{guarantee_type: burst,\n guarantee_type: relaxed}"),
         ("integral_guarantees.guarantee_type: duplicate key 'guarantee_type' on line 2 "
          "(first on line 1)",)),
        # As a pool's own: every operation started there failed, naming no real pool.
        (("pool", "create", "x", "--tree", "physical", "--config",
          '{"create_ephemeral_subpools": true, "ephemeral_subpool_config": '
          '{"max_running_operation_count": 5, "max_operation_count": 2}}'),
         ("pool x: ephemeral_subpool_config.max_running_operation_count: must not exceed "
          "max_operation_count 2 (got 5)",)),
        # Past a float's range, as written (it said "must be positive (got 0.0)"): as a
        # value, in a JSON mapping, and in a YAML one.
        (("pool", "set", "project-batch", "--tree", "physical", "weight", "1e-400"),
         ("weight: 1e-400 is out of a number's range: it reads as 0.0",)),
        (("pool", "create", "x", "--tree", "physical", "--config", '{"weight": 1e400}'),
         ("config.weight: 1e400 is out of a number's range: it reads as inf",)),
        (("pool", "create", "x", "--tree", "physical", "--config", "{weight: -1.5e-999}"),
         ("config.weight: -1.5e-999 is out of a number's range: it reads as -0.0",)),
        # YAML 1.1's octal and base 60 (JSON refuses them, YAML 1.2 reads 10 and text).
        (("pool", "set", "project-batch", "--tree", "physical", "weight", "010"),
         ("weight: 010 is octal in YAML 1.1 (8): write 8, 10 for decimal, or '010' for text",)),
        # A tree's option is config.X in each of its errors (this one said X, helper-100).
        (("pool-tree", "set", "physical", "max_operation_count", "0100"),
         ("config.max_operation_count: 0100 is octal in YAML 1.1 (64)",)),
        (("pool", "create", "x", "--tree", "physical", "--config",
          "{strong_guarantee_resources: {cpu: 1:30}}"),
         ("config.strong_guarantee_resources.cpu: 1:30 is base 60 in YAML 1.1 (90): write 90, "
          "or '1:30' for text",)),
        # So are keys, as written: it named a key `90` nobody wrote (helper-85).
        (("pool", "create", "x", "--tree", "physical", "--config",
          "{resource_limits: {1:30: 5}}"),
         ("config.resource_limits[\"1:30\"]: 1:30 is base 60 in YAML 1.1 (90): write 90, or "
          "'1:30' for text",)),
        (("operation", "start", "--tree", "physical", "--user", "u", "--job-resources",
          '{"cpu": 1}', "--job-count", "1", "--tree-options", "{010: {weight: 2}}"),
         ("tree_options[\"010\"]: 010 is octal in YAML 1.1 (8): write 8, 10 for decimal, or "
          "'010' for text",)),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(
    home: Path, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    before = db_dump(home)
    assert_one_error(fairpool(home, *args), *needles)
    assert db_dump(home) == before


def test_a_whole_tree_from_yaml_is_applied_idempotently(tmp_path: Path) -> None:
    fairpool(tmp_path, "node", "add", "n1", "--tags", "gpu", "--resources", '{"cpu": 100}').ok()
    path = tmp_path / "tree.yaml"
    path.write_text(SEED_TREE)
    created = fairpool(tmp_path, "pool-tree", "create", "physical", "--config-file",
                       str(path), "-o", "json").ok().json
    assert created["pools"] == 3 and created["default"]
    again = fairpool(tmp_path, "pool-tree", "apply", "-f", str(path)).ok()
    assert again.out.strip() == "Pool tree 'physical' is unchanged."
    # A file without a name: `create NAME` names it; `apply` has no name to take.
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("config: {node_tag_filter: cpu}\npools:\n  a: {weight: 2}\n")
    named = fairpool(tmp_path, "pool-tree", "create", "cpus", "--config-file", str(unnamed),
                     "-o", "json").ok().json
    assert (named["name"], named["pools"]) == ("cpus", 1)
    assert_one_error(fairpool(tmp_path, "pool-tree", "apply", "-f", str(unnamed)),
                     "name: a tree needs a name")
    unnamed.write_text("name: [x]\n")  # blamed on `tree` before (helper-100)
    assert_one_error(fairpool(tmp_path, "pool-tree", "apply", "-f", str(unnamed)),
                     "name: must be a string (got ['x'])")
    # Exported, edited, applied: the tree's next version (helper-79: no command printed a
    # tree as a document apply takes).
    exported = fairpool(tmp_path, "pool-tree", "export", "physical").ok().out
    assert yaml.safe_load(exported) == yaml.safe_load(SEED_TREE)
    document = yaml.safe_load(exported)
    document["pools"]["project-root"]["pools"]["project-batch"]["weight"] = 5
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(document))
    applied = fairpool(tmp_path, "pool-tree", "apply", "-f", str(edited)).ok()
    assert applied.out.splitlines() == ["~ pool project-batch"]
    assert_one_error(fairpool(tmp_path, "pool-tree", "export", "nope"),
                     "no pool tree 'nope'")


def test_a_tree_is_deleted_when_nothing_runs_in_it(tmp_path: Path) -> None:
    fairpool(tmp_path, "node", "add", "n1", "--tags", "gpu", "--resources", '{"cpu": 100}').ok()
    path = tmp_path / "tree.yaml"
    path.write_text(SEED_TREE)
    fairpool(tmp_path, "pool-tree", "create", "physical", "--config-file", str(path)).ok()
    op = fairpool(tmp_path, "operation", "start", "--pool", "project-batch", "--user", "u",
                  "--job-resources", '{"cpu": 1}', "--job-count", "2", "-o", "json").ok().json
    before = db_dump(tmp_path)
    assert_one_error(fairpool(tmp_path, "pool-tree", "delete", "physical"),
                     "pool tree physical has 1 started operation", op["id"],
                     "complete or abort them first")
    assert db_dump(tmp_path) == before
    fairpool(tmp_path, "operation", "complete", op["id"]).ok()
    deleted = fairpool(tmp_path, "pool-tree", "delete", "physical").ok()
    assert deleted.err.strip() == "Pool tree 'physical' deleted."
    assert fairpool(tmp_path, "pool-tree", "list").ok().out.strip() == "No pool trees found."
    assert_one_error(fairpool(tmp_path, "pool-tree", "delete", "physical"),
                     "no pool tree 'physical'")


@pytest.mark.parametrize("backend", BACKENDS)
def test_remote_mode_goes_through_the_server_whose_tick_ends_starvation(
    request: pytest.FixtureRequest, tmp_path: Path, backend: Backend
) -> None:
    """With ``--url`` the commands go through the server (no local store is opened), and the
    server's reconciler tick runs the trees' passes: a starving operation gets its jobs by
    preemption without any further command. On each backend's store."""
    unused = tmp_path / "unused"
    tree = tmp_path / "tree.yaml"
    tree.write_text(SEED_TREE)
    with running(server_on(request, backend, tmp_path / "served", tick=0.2)) as (server,):
        def remote(*args: str) -> Result:
            return fairpool(unused, "--url", server.url, *args)

        # No tree at all: how to make one, embedded and remote alike (it said to set a
        # default tree, where there was none to set: helper-79).
        none_yet = ("tree: there is no pool tree yet (`fairpool pool-tree create NAME` makes "
                    "one; resource pools are `fairpool resource-pool`)")
        assert_one_error(remote("pool", "describe", "gpus"), none_yet)
        assert_one_error(fairpool(tmp_path / "embedded", "pool", "describe", "gpus"), none_yet)
        remote("node", "add", "n1", "--tags", "gpu", "--resources", '{"cpu": 100}').ok()
        assert remote("pool-tree", "apply", "-f", str(tree)).ok().out.startswith("+ tree")
        remote("pool-tree", "set", "physical", "fair_share_starvation_timeout", "500").ok()
        batch = remote("operation", "start", "--pool", "project-batch", "--user", "a",
                       "--job-resources", '{"cpu": 1}', "--job-count", "100", "-o",
                       "json").ok().json
        adhoc = remote("operation", "start", "--pool", "project-adhoc", "--user", "b",
                       "--job-resources", '{"cpu": 1}', "--job-count", "10", "-o",
                       "json").ok().json
        assert (batch["running_jobs"], adhoc["running_jobs"]) == (100, 0)
        deadline = time.monotonic() + 20
        while True:
            seen = remote("operation", "describe", adhoc["id"], "-o", "json").ok().json
            if seen["running_jobs"] == 10:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.3)
        batch = remote("operation", "describe", batch["id"], "-o", "json").ok().json
        assert (batch["running_jobs"], batch["preempted_jobs"]) == (90, 10)
        assert {job["preempted_by"] for job in batch["preempted"]} == {adhoc["id"]}
        assert_one_error(remote("pool", "describe", "nope", "--tree", "physical"),
                         "no pool 'nope' in tree physical")
        # A third operation over its pool's running cap: pending, and counted so.
        remote("pool", "set", "project-adhoc", "--tree", "physical",
               "max_running_operation_count", "1").ok()
        remote("operation", "start", "--pool", "project-adhoc", "--user", "c",
               "--job-resources", '{"cpu": 1}', "--job-count", "1").ok()
        metrics = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                   for family in text_string_to_metric_families(
                       httpx.get(server.url + "/metrics").text)
                   for sample in family.samples if sample.name.startswith("fairpool_tree_")}
        tree = ("tree", "physical")
        assert metrics == {("fairpool_tree_running_operations", (tree,)): 2,
                           ("fairpool_tree_pending_operations", (tree,)): 1,
                           ("fairpool_tree_resource_units", (("resource", "cpu"), tree)): 100}
    assert not unused.exists()
    assert "Traceback" not in server.log()


def test_interruptible_operations_show_their_interrupting_jobs(tmp_path: Path) -> None:
    fairpool(tmp_path, "node", "add", "n1", "--resources", '{"cpu": 4}').ok()
    fairpool(tmp_path, "pool-tree", "create", "physical", "--config",
             '{"fair_share_starvation_timeout": 0, "allocation_preemption_timeout": 600000}').ok()
    for name in ("a", "b"):
        fairpool(tmp_path, "pool", "create", name, "--tree", "physical").ok()
    soft = fairpool(tmp_path, "operation", "start", "--pool", "a", "--user", "u",
                    "--job-resources", '{"cpu": 1}', "--job-count", "4", "--interruptible",
                    "-o", "json").ok().json
    assert soft["interruptible"] and soft["running_jobs"] == 4
    hungry = fairpool(tmp_path, "operation", "start", "--pool", "b", "--user", "v",
                      "--job-resources", '{"cpu": 1}', "--job-count", "2", "-o", "json").ok().json
    fairpool(tmp_path, "pool-tree", "reconcile").ok()  # starving now: 2 jobs interrupted
    shown = fairpool(tmp_path, "operation", "describe", soft["id"], "-o", "json").ok().json
    assert (shown["running_jobs"], shown["interrupting_jobs"], shown["pending_jobs"]) == (2, 2, 0)
    assert {job["preempted_by"] for job in shown["interrupting"]} == {hungry["id"]}
    assert all(job["deadline"] for job in shown["interrupting"])
    table = fairpool(tmp_path, "operation", "describe", soft["id"][:8]).ok().out
    assert "Interrupting jobs" in table and "allocation_preemption_timeout 600000 ms" in table
    waiting = fairpool(tmp_path, "operation", "describe", hungry["id"], "-o", "json").ok().json
    assert waiting["running_jobs"] == 0
    assert "2 wait for interrupted jobs to leave n1" in waiting["reason"]


def test_an_operation_in_two_trees(tmp_path: Path) -> None:
    fairpool(tmp_path, "node", "add", "g1", "--tags", "gpu", "--resources", '{"cpu": 2}').ok()
    fairpool(tmp_path, "node", "add", "c1", "--tags", "cpu", "--resources", '{"cpu": 4}').ok()
    fairpool(tmp_path, "pool-tree", "create", "physical", "--node-tag-filter", "gpu").ok()
    fairpool(tmp_path, "pool-tree", "create", "cpus", "--node-tag-filter", "cpu").ok()
    fairpool(tmp_path, "pool", "create", "batch", "--tree", "physical").ok()
    fairpool(tmp_path, "pool", "create", "research", "--tree", "cpus").ok()
    started = fairpool(tmp_path, "operation", "start", "--tree", "physical", "--tree", "cpus",
                       "--pool", "batch", "--user", "u", "--job-resources", '{"cpu": 1}',
                       "--job-count", "5", "--tree-options",
                       "{cpus: {pool: research, weight: 2, resource_limits: {cpu: 3}}}",
                       "-o", "json").ok().json
    assert (started["tree"], started["pool"], started["running_jobs"]) == (
        "physical,cpus", "batch,research", 5)
    assert [(t["tree"], t["pool"], t["weight"], t["running_jobs"]) for t in started["trees"]] == [
        ("physical", "batch", "1", 2), ("cpus", "research", "2", 3)]
    table = fairpool(tmp_path, "operation", "describe", started["id"]).ok().out
    assert "Pool trees" in table
    assert "│ cpus     │ research │ 2      │ cpu 3           │ running │ 3 " in table, table
    before = db_dump(tmp_path)
    assert_one_error(
        fairpool(tmp_path, "operation", "start", "--tree", "physical", "--user", "u",
                 "--job-resources", '{"cpu": 1}', "--job-count", "1", "--tree-options",
                 '{"cpus": {"pool": "research"}}'),
        "tree_options.cpus: is not one of the operation's trees (physical)",
    )
    assert db_dump(tmp_path) == before


def test_integral_guarantees_are_set_and_shown(tmp_path: Path) -> None:
    """``pool set ... integral_guarantees`` and a YAML apply take the option; ``pool
    describe`` and ``pool-tree show`` show the integral share and the Orchid fields."""
    fairpool(tmp_path, "node", "add", "n1", "--resources", '{"cpu": 100}').ok()
    path = tmp_path / "tree.yaml"
    path.write_text(
        "name: t\npools:\n  B: {integral_guarantees: {guarantee_type: relaxed, "
        "resource_flow: {cpu: 10}}}\n  W: {weight: 3}\n"
    )
    fairpool(tmp_path, "pool-tree", "apply", "-f", str(path)).ok()
    pool = fairpool(tmp_path, "pool", "set", "B", "--tree", "t", "integral_guarantees",
                    "{guarantee_type: burst, burst_guarantee_resources: {cpu: 50}, "
                    "resource_flow: {cpu: 10}}", "-o", "json").ok().json
    assert pool["config"]["integral_guarantees"] == {
        "guarantee_type": "burst", "burst_guarantee_resources": {"cpu": 50},
        "resource_flow": {"cpu": 10}}
    assert pool["effective"]["integral_guarantees"]["relaxed_share_multiplier_limit"] == 3
    integral = pool["integral"]
    assert (integral["integral_guarantee_type"], integral["specified_burst_ratio"],
            integral["specified_resource_flow_ratio"], integral["integral_pool_capacity"]) == (
        "burst", 0.5, 0.1, 8640.0)
    assert pool["detailed"]["integral_guarantee"] == {"cpu": 0.0}
    shown = fairpool(tmp_path, "pool", "describe", "B", "--tree", "t").ok().out
    assert "Integral guarantees" in shown and "ACCUMULATED RESOURCE RATIO VOLUME" in shown
    tree = fairpool(tmp_path, "pool-tree", "show", "t", "-o", "json").ok().json
    b = next(e for e in tree["elements"] if e["name"] == "B")
    assert b["integral"]["integral_guarantee_type"] == "burst"
    assert next(e for e in tree["elements"] if e["name"] == "W")["integral"] is None


def test_yaml_output_writes_each_mapping_in_full(tmp_path: Path) -> None:
    """An operation's first tree shares its detailed shares with the operation: YAML without
    aliases (&id001 / *id001), as the remote CLI prints it from JSON."""
    fairpool(tmp_path, "node", "add", "n", "--resources", '{"cpu": 8}').ok()
    fairpool(tmp_path, "pool-tree", "create", "t").ok()
    op = fairpool(tmp_path, "operation", "start", "--user", "u", "--job-resources",
                  '{"cpu": 1}', "--job-count", "2", "-o", "yaml").ok()
    assert "&id" not in op.out and "*id" not in op.out
    started = yaml.safe_load(op.out)
    assert started["trees"][0]["detailed"] == started["detailed"]


def test_create_from_a_file_refuses_an_existing_tree(tmp_path: Path) -> None:
    """Before 2026-11-29 the second create applied its file: pool q was deleted."""
    first, second = tmp_path / "q.yaml", tmp_path / "r.yaml"
    first.write_text("pools:\n  q: {}\n")
    second.write_text("pools:\n  r: {}\n")
    fairpool(tmp_path, "pool-tree", "create", "nn", "--config-file", str(first)).ok()
    before = db_dump(tmp_path)
    assert_one_error(fairpool(tmp_path, "pool-tree", "create", "nn", "--config-file",
                              str(second)), "pool tree nn already exists")
    assert db_dump(tmp_path) == before
    assert fairpool(tmp_path, "pool", "describe", "q", "--tree", "nn", "-o",
                    "json").ok().json["tree"] == "nn"


def test_the_preempted_jobs_table_shows_the_newest_and_says_what_it_leaves_out(
    tmp_path: Path,
) -> None:
    """The table showed the first ten in start order (the oldest preemptions), without a
    time, and did not say it left 8 out."""
    fairpool(tmp_path, "node", "add", "n0", "--resources", '{"cpu": 20}').ok()
    fairpool(tmp_path, "pool-tree", "create", "t", "--config",
             '{"fair_share_starvation_timeout": 0, "preemptive_scheduling_backoff": 0}').ok()
    for name, weight in (("x", "1"), ("y", "1"), ("z", "8")):
        fairpool(tmp_path, "pool", "create", name, "--tree", "t", "--weight", weight).ok()
    started = {}
    for name in ("x", "y", "z"):
        started[name] = fairpool(tmp_path, "operation", "start", "--pool", name, "--user", "u",
                                 "--job-resources", '{"cpu": 1}', "--job-count", "20", "-o",
                                 "json").ok().json["id"]
        fairpool(tmp_path, "pool-tree", "reconcile", "t").ok()
    shown = fairpool(tmp_path, "operation", "describe", started["x"], "-o", "json").ok().json
    by = [job["preempted_by"] for job in shown["preempted"]]
    assert by == [started["y"]] * 10 + [started["z"]] * 8
    table = fairpool(tmp_path, "operation", "describe", started["x"]).ok().out
    assert "Preempted jobs (the newest 10; 8 earlier not shown)" in table
    rows = [line for line in table.splitlines() if started["z"] in line or started["y"] in line]
    assert sum(started["z"] in row for row in rows) == 8, table


def test_null_unsets_an_option(tmp_path: Path) -> None:
    fairpool(tmp_path, "pool-tree", "create", "t").ok()
    fairpool(tmp_path, "pool", "create", "a", "--tree", "t", "--weight", "3").ok()
    unset = fairpool(tmp_path, "pool", "set", "a", "--tree", "t", "weight", "null", "-o",
                     "json").ok().json
    assert (unset["config"], unset["effective"]["weight"]) == ({}, 1)
    fairpool(tmp_path, "pool-tree", "set", "t", "infer_weight_from_guarantees_share_multiplier",
             "2").ok()
    tree = fairpool(tmp_path, "pool-tree", "set", "t",
                    "infer_weight_from_guarantees_share_multiplier", "null", "-o", "json").ok()
    assert tree.json["config"] == {}
