"""``fairpool node | pool-tree | pool | operation``, run for real in subprocesses on a SQLite
home: the issue's commands in order, JSON output, and one ``Error:`` line with nothing written
for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import assert_one_error, db_dump, fairpool

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
    described = fairpool(home, "operation", "describe", started["id"][:8]).ok().out
    assert "no node of tree physical has room" in described
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
        (("node", "add", "bad name", "--resources", '{"cpu": 1}'), ("name", "bad name")),
        (("pool", "describe", "nope", "--tree", "physical"), ("no pool 'nope'",)),
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


def test_remote_mode_is_refused_clearly(tmp_path: Path) -> None:
    result = fairpool(tmp_path, "--url", "http://127.0.0.1:9", "pool-tree", "list")
    assert_one_error(result, "not available over --url yet")
