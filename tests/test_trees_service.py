"""Pool trees as a service (seed 003) on a real database, SQLite and PostgreSQL: the seed's
examples end to end, operation-count admission, starvation preemption and interruption on an
injected clock, operations in several trees, and that a refused command writes nothing. The planner itself is tested pure in
``test_jobs.py``, the fair share in ``test_fairshare.py``."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, event, func, select, update
from sqlalchemy.exc import IntegrityError

from fairpool.errors import Conflict, InvalidInput, NotFound
from fairpool.frontends.trees import PoolConfig, load_pool_tree
from fairpool.service import Service
from fairpool.store import schema
from fairpool.store import trees as store
from fairpool.store.db import Database, read_generation
from fairpool.trees_service import OperationView, TreesService
from fairpool.views import OPERATION_STATUSES
from tests.conftest import walked_pages
from tests.test_service import Clock

GPU_NODE = {"cpu": 64, "memory": "512GiB", "gpu": 8, "user_slots": 64}
SEED_TREE = """
name: physical
config: {node_tag_filter: gpu, main_resource: cpu}
pools:
  project-root:
    strong_guarantee_resources: {cpu: 100}
    max_running_operation_count: 10
    max_operation_count: 50
    pools:
      project-adhoc: {strong_guarantee_resources: {cpu: 80}, max_running_operation_count: 10}
      project-batch: {weight: 10, max_running_operation_count: 4}
      project-backup: {strong_guarantee_resources: {cpu: 20}, max_running_operation_count: 2}
"""
CPU = {"cpu": 1}
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def trees(database_url: str, clock: Clock) -> Iterator[TreesService]:
    db = Database.open(database_url)
    yield TreesService(db, clock)
    db.close()


@pytest.fixture
def seed(trees: TreesService) -> TreesService:
    """The seed's project: 100 cpu on two gpu nodes, and its pool table."""
    trees.add_node("gpu-01", ["gpu", "a100"], {"cpu": 50, "user_slots": 64})
    trees.add_node("gpu-02", ["gpu"], {"cpu": 50, "user_slots": 64})
    trees.add_node("cpu-01", ["cpu"], {"cpu": 500})
    applied = trees.apply_tree(SEED_TREE)
    assert applied.changes[0] == "+ tree physical"
    return trees


def advance(clock: Clock, seconds: float) -> None:
    clock.now += timedelta(seconds=seconds)


def dump(trees: TreesService) -> dict[str, int]:
    with trees.db.read() as conn:
        return {
            name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for name, table in schema.metadata.tables.items()
        }


def shares(trees: TreesService) -> dict[str, tuple[float, float]]:
    return {row.name: (row.shares.fair_share, row.shares.usage_share)
            for row in trees.show_tree("physical").elements if row.kind == "pool"}


def test_the_seed_example_saturated_then_batch_takes_the_slack(
    seed: TreesService, clock: Clock
) -> None:
    tree = seed.show_tree()
    assert (tree.name, tree.default, tree.resources) == ("physical", True, {"cpu": 100, "user_slots": 128})
    assert tree.nodes == ("gpu-01", "gpu-02")  # cpu-01 is not selected by the filter
    # adhoc idle: batch takes the whole slack
    batch = seed.start_operation(trees=["physical"], pool="project-batch", user="alice",
                                 job_resources=CPU, job_count=200)
    assert (batch.status, batch.running_jobs, batch.pending_jobs) == ("running", 100, 100)
    assert batch.job_resources == {"cpu": 1, "user_slots": 1}
    assert batch.nodes == {"gpu-01": 50, "gpu-02": 50}
    assert "100 jobs pending: no node of tree physical has room" in (batch.reason or "")
    # everyone saturated: adhoc and backup get their guarantees once they starve
    advance(clock, 1)
    adhoc = seed.start_operation(pool="project-adhoc", user="bob", job_resources=CPU,
                                 job_count=100)
    backup = seed.start_operation(pool="project-backup", user="carol", job_resources=CPU,
                                  job_count=100)
    assert (adhoc.running_jobs, backup.running_jobs) == (0, 0)
    assert shares(seed)["project-adhoc"] == (0.8, 0.0)
    assert shares(seed)["project-backup"] == (0.2, 0.0)
    assert shares(seed)["project-batch"] == (0.0, 1.0)
    advance(clock, 31)  # fair_share_starvation_timeout: 30 s
    seed.reconcile("physical")
    assert shares(seed) == {
        "project-root": (1.0, 1.0),
        "project-adhoc": (0.8, 0.8),
        "project-backup": (0.2, 0.2),
        "project-batch": (0.0, 0.0),
    }
    batch = seed.describe_operation(batch.id[:8])
    assert (batch.running_jobs, len(batch.preempted)) == (0, 100)
    assert {p.preempted_by for p in batch.preempted} == {adhoc.id, backup.id}
    assert "above its fair share 0 * preemption_satisfaction_threshold 1" in (batch.preempted[0].reason or "")
    # adhoc ends: its 80 cpu go to the most under-served first -- batch 8/11, backup 3/11
    # (weights 10:1 on top of backup's guarantee), no preemption needed
    seed.complete_operation(adhoc.id)
    assert shares(seed)["project-batch"] == (0.727273, 0.73)
    assert shares(seed)["project-backup"] == (0.272727, 0.27)
    assert seed.describe_operation(batch.id).running_jobs == 73


def test_operation_count_limits_at_every_level(seed: TreesService) -> None:
    seed.set_pool("physical", "project-backup", "max_operation_count", "3")
    started = [
        seed.start_operation(pool="project-backup", user="u", job_resources=CPU, job_count=1)
        for _ in range(3)
    ]
    # max_running_operation_count 2: the third waits, FIFO
    assert [op.status for op in started] == ["running", "running", "pending"]
    assert started[2].reason == (
        "pending: pool project-backup runs 2 operations, its max_running_operation_count is 2"
    )
    before = dump(seed)
    with pytest.raises(InvalidInput, match=re.escape(
            "pool: has 3 started operations in tree physical, its max_operation_count is 3 (got "
            "'project-backup')"
    )):
        seed.start_operation(pool="project-backup", user="u", job_resources=CPU, job_count=1)
    assert dump(seed) == before
    # a slot frees: the pending one is promoted
    seed.abort_operation(started[0].id)
    assert seed.describe_operation(started[2].id).status == "running"
    # an ancestor's limit binds too
    seed.set_pool("physical", "project-root", "max_running_operation_count", "3")
    seed.set_pool("physical", "project-root", "max_operation_count", "3")
    seed.start_operation(pool="project-batch", user="u", job_resources=CPU, job_count=1)
    with pytest.raises(InvalidInput, match=re.escape(
            "has 3 started operations in tree physical, its max_operation_count is 3 (got "
            "'project-root')"
    )):
        seed.start_operation(pool="project-batch", user="u", job_resources=CPU, job_count=1)
    assert len(seed.list_operations(status="running")) == 3


def test_gangs_are_granted_all_or_nothing(seed: TreesService) -> None:
    big = seed.start_operation(pool="project-batch", user="u", job_resources={"cpu": 30},
                               job_count=4, gang=True)
    assert (big.running_jobs, big.reason) == (
        0, "4 jobs pending: gang of 4 jobs: only 2 fit on the nodes of tree physical even "
        "with nothing else running; it waits for nodes to be added (all or nothing)"
    )
    small = seed.start_operation(pool="project-batch", user="u", job_resources={"cpu": 25},
                                 job_count=4, gang=True)
    assert small.running_jobs == 4


def test_ephemeral_pools(seed: TreesService) -> None:
    seed.set_tree("physical", "max_ephemeral_pool_per_user", "1")
    op = seed.start_operation(user="dave", job_resources=CPU, job_count=1)
    assert op.pool == "dave"
    assert seed.describe_pool("physical", "dave").ephemeral
    # A declared child would keep it past its last operation, counted against dave's max.
    under_it = "parent: is user dave's ephemeral pool, gone with its last operation"
    with pytest.raises(InvalidInput, match=under_it):
        seed.create_pool("physical", "sub", parent="dave")
    with pytest.raises(InvalidInput, match=under_it):
        seed.set_pool("physical", "project-batch", "parent", "dave")
    with pytest.raises(InvalidInput, match="user dave already has 1 ephemeral pool there"):
        seed.start_operation(pool="scratch", user="dave", job_resources=CPU, job_count=1)
    seed.complete_operation(op.id)
    with pytest.raises(NotFound):
        seed.describe_pool("physical", "dave")
    seed.set_pool("physical", "project-adhoc", "create_ephemeral_subpools", "true")
    sub = seed.start_operation(pool="project-adhoc", user="erin", job_resources=CPU,
                               job_count=1)
    assert sub.pool == "project-adhoc$erin"
    seed.set_pool("physical", "project-root", "forbid_immediate_operations", "true")
    with pytest.raises(InvalidInput, match="forbid_immediate_operations"):
        seed.start_operation(pool="project-root", user="erin", job_resources=CPU, job_count=1)
    with pytest.raises(InvalidInput, match="forbid_immediate_operations_in_root"):
        seed.start_operation(pool="<Root>", user="erin", job_resources=CPU, job_count=1)


def test_a_tree_option_set_by_its_alias_is_changed_by_its_name(seed: TreesService) -> None:
    seed.set_tree("physical", "job_interrupt_timeout", "7000")  # YTsaurus's alias
    assert seed.set_tree("physical", "allocation_preemption_timeout", "8000").config[
        "allocation_preemption_timeout"] == 8000
    view = seed.set_tree("physical", "max_ephemeral_pools_per_user", "2")
    view = seed.set_tree("physical", "max_ephemeral_pool_per_user", "3")
    assert {k: view.config[k] for k in view.config if "preemption" in k or "ephemeral" in k} == {
        "allocation_preemption_timeout": 8000, "max_ephemeral_pool_per_user": 3}


def test_pool_and_tree_validation_writes_nothing(seed: TreesService) -> None:
    before = dump(seed)
    cases = [
        (lambda: seed.create_pool("physical", "x", "project-adhoc",
                                  {"strong_guarantee_resources": {"cpu": 81}}),
         "strong_guarantee_resources.cpu: is less than its children's sum 81"),
        (lambda: seed.set_pool("physical", "project-batch", "weight", "0"),
         "weight: must be positive (got 0)"),
        (lambda: seed.set_pool("physical", "project-root", "parent", "project-adhoc"),
         "pool project-root: parent: makes a cycle (got 'project-adhoc')"),
        (lambda: seed.set_tree("physical", "fair_share_starvation_tolerance", "2"),
         "fair_share_starvation_tolerance: must be between 0 and 1"),
        (lambda: seed.create_tree("other"), "node would belong to trees other and physical"),
        (lambda: seed.start_operation(pool="project-batch", user="u",
                                      job_resources={"cpu": 51}, job_count=1),
         "job_resources.cpu: no node of tree physical has that much (largest: 50)"),
        (lambda: seed.start_operation(pool="project-batch", user="u", job_resources=CPU,
                                      job_count=0),
         "job_count: must be a positive integer"),
        (lambda: seed.start_operation(pool="project-batch", user="u", job_resources=CPU,
                                      job_count=10_001),
         "job_count: must be at most 10000 (got 10001)"),
        (lambda: seed.add_node("gpu-01", [], {"cpu": 1}), "node gpu-01 already exists"),
        # A pool an operation makes is named as one creates: "a$b" would read as pool a's
        # ephemeral subpool for user b; "" is no name, not "none given" (then: the user).
        (lambda: seed.start_operation(user="a$b", job_resources=CPU, job_count=1),
         "user: used as the pool name (no --pool), must match [-_a-zA-Z0-9:]+ (got 'a$b')"),
        (lambda: seed.start_operation(user="bad user", job_resources=CPU, job_count=1),
         "user: used as the pool name (no --pool), must match [-_a-zA-Z0-9:]+ (got 'bad user')"),
        (lambda: seed.start_operation(pool="project-adhoc$b", user="b", job_resources=CPU,
                                      job_count=1),
         "pool: must match [-_a-zA-Z0-9:]+ (got 'project-adhoc$b')"),
        (lambda: seed.start_operation(pool="", user="u", job_resources=CPU, job_count=1),
         "pool: must match [-_a-zA-Z0-9:]+ (got '')"),
        (lambda: seed.start_operation(user="u", job_resources=CPU, job_count=1,
                                      tree_options={"physical": {"pool": "x$y"}}),
         "pool: must match [-_a-zA-Z0-9:]+ (got 'x$y')"),
        # PyYAML composes recursively: nesting past Python's recursion limit is invalid YAML.
        (lambda: seed.apply_tree("name: t\npools: " + "{p: {pools: " * 300 + "{}" + "}}" * 300),
         "tree: is not valid YAML: nested too deeply"),
        (lambda: seed.set_pool("physical", "project-batch", "weight", "[" * 2000),
         "weight: is not valid YAML: nested too deeply"),
        (lambda: seed.set_pool("physical", "project-batch", "weight", "[" * 5000),
         "value: must be at most 4096 characters (got '[[[[[[[[[[[[[[[[[[[[...')"),
        (lambda: seed.apply_tree("#" * 60_001),
         "tree: must be at most 60000 characters (got '####################...')"),
        (lambda: seed.set_pool("physical", "project-batch", "weight", "[1"),
         "weight: is not valid YAML: while parsing a flow sequence"),
        # Scalars PyYAML's constructors cannot build raise ValueError, not YAMLError.
        (lambda: seed.apply_tree("name: t\nconfig: {max_operation_count: " + "1" * 5000 + "}"),
         "tree: is not valid YAML: Exceeds the limit (4300 digits) for integer "
         "string conversion: value has 5000 digits (got '<yaml>')"),
        # Nothing is a date (it was, and 2024-13-45 a ValueError): text, refused as text.
        (lambda: seed.set_tree("physical", "max_operation_count", "2024-13-45"),
         "config.max_operation_count: must be an integer (got '2024-13-45')"),
        (lambda: seed.apply_tree("name: t\nconfig: {max_operation_count: 2024-13-45}"),
         "config.max_operation_count: must be an integer (got '2024-13-45')"),
    ]
    for call, message in cases:
        with pytest.raises((InvalidInput, Conflict), match=re.escape(message)):
            call()
    assert dump(seed) == before


POOL_OPTIONS = {
    "weight": "3",
    "strong_guarantee_resources": "{cpu: 1}",
    "resource_limits": "{cpu: 1}",
    "mode": "fifo",
    "max_running_operation_count": "1",
    "max_operation_count": "2",
    "fifo_sort_parameters": "[start_time]",
    "forbid_immediate_operations": "true",
    "create_ephemeral_subpools": "true",
    "ephemeral_subpool_config": "{mode: fifo}",
    "offloading_settings": "{other: {pool: p}}",
    "config_presets": "[preset]",
    "fair_share_starvation_timeout": "5",
    "fair_share_starvation_tolerance": "0.5",
    "non_preemptible_resource_usage_threshold": "{cpu: 1}",
    "integral_guarantees": "{guarantee_type: relaxed, resource_flow: {cpu: 1}}",
}
TREE_OPTIONS = {
    "infer_weight_from_guarantees_share_multiplier": "2",
    "default_parent_pool": "a",
    "max_operation_count_per_pool": "60",
    "fair_share_starvation_timeout": "5",
    "non_preemptible_resource_usage_threshold": "{cpu: 1}",
    "pool_config_presets": "{preset: {weight: 2}}",
}


def test_null_unsets_a_pool_or_tree_option(trees: TreesService) -> None:
    """``pool set`` / ``pool-tree set OPTION null`` (or ``~``, or empty, or by an alias):
    the option is no longer set (inherited or default again). Before 2026-11-29 every
    option refused null (``weight: must be a number (got None)``)."""
    from fairpool.frontends.trees import _POOL_PARSERS, _TREE_PARSERS

    assert set(POOL_OPTIONS) == set(_POOL_PARSERS)  # every pool option is optional
    assert set(TREE_OPTIONS) <= set(_TREE_PARSERS)
    trees.create_tree("t", {"pool_config_presets": {"preset": {"weight": 2}}})
    trees.create_pool("t", "a")
    for option, value in POOL_OPTIONS.items():
        assert option in trees.set_pool("t", "a", option, value).config, option
        unset = trees.set_pool("t", "a", option, "null")
        assert unset.config == {}, option
    trees.set_pool("t", "a", "weight", "3")
    assert trees.set_pool("t", "a", "weight", "~").effective["weight"] == 1
    trees.set_pool("t", "a", "strong_guarantee_resources", "{cpu: 1}")
    assert trees.set_pool("t", "a", "min_share_resources", "").config == {}  # by its alias
    for option, value in TREE_OPTIONS.items():
        trees.set_tree("t", option, value)
        assert option not in trees.set_tree("t", option, "null").config, option
    trees.set_tree("t", "fair_share_preemption_timeout", "7")  # an alias, unset by its name
    assert trees.set_tree("t", "fair_share_starvation_timeout", "null").config == {}
    with pytest.raises(InvalidInput, match=re.escape(
            "wieght: unknown pool option; did you mean 'weight'? (got null)")):
        trees.set_pool("t", "a", "wieght", "null")
    with pytest.raises(InvalidInput, match=r"config\.nope: unknown pool tree option"):
        trees.set_tree("t", "nope", "null")


def test_an_exported_tree_applies_as_itself(seed: TreesService) -> None:
    """``pool-tree export``: every pool option and tree option given, nested pools, a
    decimal weight, an ephemeral pool (left out: an apply keeps it). Applied, the document
    changes nothing; loaded, it is the tree; edited, it is the next version."""
    seed.set_tree("physical", "pool_config_presets", "{preset: {weight: 2}}")
    for option, value in TREE_OPTIONS.items():
        if option != "default_parent_pool":
            seed.set_tree("physical", option, value)
    for option, value in POOL_OPTIONS.items():
        name = f"with-{option.replace('_', '-')}"
        seed.create_pool("physical", name)
        seed.set_pool("physical", name, option, value)
    seed.set_pool("physical", "project-adhoc", "weight", "0.1")
    seed.set_pool("physical", "project-adhoc", "create_ephemeral_subpools", "true")
    seed.start_operation(pool="project-adhoc", user="erin", job_resources=CPU, job_count=1)
    document = seed.export_tree("physical")
    assert "project-adhoc$erin" not in yaml.safe_dump(document)
    text = yaml.safe_dump(document, sort_keys=False)
    assert seed.apply_tree(text).changes == ()
    assert seed.export_tree() == document  # the default tree's
    with seed.db.read() as conn:
        stored = store.list_pools(conn, "physical")
    loaded = load_pool_tree(text)
    assert {p.name: (p.parent, p.config) for p in loaded.pools.values()} == {
        p.name: (p.parent, PoolConfig.from_mapping(p.config)) for p in stored
        if p.name != "project-adhoc$erin"}
    document["pools"]["with-weight"]["weight"] = 4  # type: ignore[index]
    assert seed.apply_tree(yaml.safe_dump(document)).changes == ("~ pool with-weight",)


def test_apply_is_idempotent_and_removes_missing_pools(seed: TreesService) -> None:
    assert seed.apply_tree(SEED_TREE).changes == ()
    smaller = SEED_TREE.replace(
        "      project-backup: {strong_guarantee_resources: {cpu: 20}, max_running_operation_count: 2}\n", ""
    ).replace("{weight: 10,", "{weight: 5,")
    assert seed.apply_tree(smaller).changes == ("- pool project-backup", "~ pool project-batch")
    assert seed.describe_pool("physical", "project-batch").config["weight"] == 5


@pytest.mark.parametrize(("before", "after", "changes", "parents"), [
    # The kept child moves under another parent; its old parent goes.
    ({"A": {"B": {}}, "C": {}}, {"C": {"B": {}}},
     ("- pool A", "~ pool B"), {"B": "C", "C": None}),
    # ... under a pool the same file creates.
    ({"A": {"B": {}}}, {"N": {"B": {}}},
     ("- pool A", "+ pool N", "~ pool B"), {"B": "N", "N": None}),
    # A chain of moves: C under D, B under C, their old root removed.
    ({"A": {"B": {"C": {}}}, "D": {}}, {"D": {"C": {"B": {}}}},
     ("- pool A", "~ pool C", "~ pool B"), {"B": "C", "C": "D", "D": None}),
    # The kept grandchild of two removed pools moves to the root.
    ({"A": {"B": {"C": {}}}}, {"C": {}},
     ("- pool B", "- pool A", "~ pool C"), {"C": None}),
])
def test_apply_moves_kept_pools_out_of_removed_ones(
    trees: TreesService, before: dict[str, object], after: dict[str, object],
    changes: tuple[str, ...], parents: dict[str, str | None],
) -> None:
    """Before 2026-11-29 a removed pool was deleted while a kept child still named it: an
    IntegrityError (a traceback, an HTTP 500). The kept child has an operation running."""
    def document(pools: dict[str, object]) -> str:
        def nested(level: dict[str, object]) -> dict[str, object]:
            return {name: {"pools": nested(inner)} if inner else {}  # type: ignore[arg-type]
                    for name, inner in level.items()}
        return yaml.safe_dump({"name": "t", "pools": nested(pools)})

    trees.add_node("n", [], {"cpu": 4})
    trees.apply_tree(document(before))
    kept = "B" if "B" in parents else "C"  # a kept pool that moves
    op = trees.start_operation(trees=["t"], pool=kept, user="u", job_resources=CPU, job_count=1)
    assert op.status == "running"
    assert trees.apply_tree(document(after)).changes == changes
    assert {name: trees.describe_pool("t", name).parent for name in parents} == parents
    assert trees.apply_tree(document(after)).changes == ()
    assert trees.describe_operation(op.id).running_jobs == 1


@pytest.mark.parametrize(("document", "message"), [
    # The first `a`, with its child, was dropped without a word, and `child` deleted.
    ("name: physical\npools:\n  a:\n    weight: 1\n    pools:\n      child: {}\n"
     "  a: {weight: 2}\n", "pools.a: duplicate key 'a' on line 7 (first on line 3)"),
    ("name: physical\nname: other\n", "name: duplicate key 'name' on line 2 (first on line 1)"),
    ("name: physical\npools:\n  a: {weight: 1, weight: 2}\n",
     "pools.a.weight: duplicate key 'weight' on line 3 (first on line 3)"),
    # JSON is YAML: a document sent as JSON text, as over HTTP.
    ('{"name": "physical", "pools": {"a": {}, "a": {}}}',
     "pools.a: duplicate key 'a' on line 1 (first on line 1)"),
])
def test_a_key_given_twice_in_a_document_is_refused(
    seed: TreesService, document: str, message: str
) -> None:
    before = dump(seed)
    with pytest.raises(InvalidInput, match=f"^{re.escape(message)}$"):
        seed.apply_tree(document)
    assert dump(seed) == before


def test_a_tree_created_from_a_document_is_refused_when_it_exists(seed: TreesService) -> None:
    """Before 2026-11-29 ``pool-tree create NAME --config-file`` applied the file to an
    existing tree: its pools missing from the file were deleted."""
    before = dump(seed)
    with pytest.raises(Conflict, match=r"^pool tree physical already exists$"):
        seed.apply_tree("pools: {q: {}}\n", "physical", create=True)
    assert dump(seed) == before
    made = seed.apply_tree("config: {node_tag_filter: none}\npools: {q: {}}\n", "new",
                           create=True)
    assert made.changes == ("+ tree new", "+ pool q")


def test_tree_yaml_is_read_as_the_scheduler_config_reads_it(seed: TreesService) -> None:
    """JSON's ``8e-1`` is a number (it was kept as the text '8e-1', and served so), and
    nothing is a date (a pool named 2024-01-01 was refused as one)."""
    seed.apply_tree("name: t\nconfig: {node_tag_filter: cpu, fair_share_starvation_tolerance: "
                    "8e-1}\npools:\n  2024-01-01: {weight: 1e1}\n")
    tolerance = {"node_tag_filter": "cpu", "fair_share_starvation_tolerance": 0.8}
    assert seed.show_tree("t").config == tolerance
    assert seed.describe_pool("t", "2024-01-01").config == {"weight": 10}
    seed.set_tree("t", "fair_share_starvation_tolerance", "5E-1")
    assert seed.show_tree("t").config == {**tolerance, "fair_share_starvation_tolerance": 0.5}


@pytest.mark.parametrize(("call", "message"), [
    (lambda trees: trees.apply_tree("name: physical\nconfig: {max_operation_count: 0100}\n"),
     "config.max_operation_count: 0100 is octal in YAML 1.1 (64): write 64, 100 for decimal, "
     "or '0100' for text"),
    (lambda trees: trees.apply_tree("name: physical\npools:\n  a: {weight: 1:30}\n"),
     "pools.a.weight: 1:30 is base 60 in YAML 1.1 (90): write 90, or '1:30' for text"),
    (lambda trees: trees.set_tree("physical", "max_operation_count", "0_100"),
     "config.max_operation_count: 0_100 is octal in YAML 1.1 (64): write 64, 100 for decimal, "
     "or '0_100' for text"),
    # A name too: the pool was moved under one named 90.
    (lambda trees: trees.set_pool("physical", "project-batch", "parent", "1:30"),
     "parent: 1:30 is base 60 in YAML 1.1 (90): write 90, or '1:30' for text"),
    (lambda trees: trees.set_pool("physical", "project-batch", "integral_guarantees",
                                  "{guarantee_type: burst, guarantee_type: relaxed}"),
     "integral_guarantees.guarantee_type: duplicate key 'guarantee_type' on line 1 "
     "(first on line 1)"),
])
def test_yaml_11_numbers_and_keys_given_twice_are_refused(
    seed: TreesService, call: Callable[[TreesService], object], message: str
) -> None:
    """010 is 8 in YAML 1.1 and 1:30 is 90, while JSON refuses them and YAML 1.2 reads 10
    and text: one line says which was meant, and nothing is written."""
    before = dump(seed)
    with pytest.raises(InvalidInput, match=f"^{re.escape(message)}$"):
        call(seed)
    assert dump(seed) == before
    assert seed.describe_pool("physical", "project-batch").parent == "project-root"


def test_apply_declares_an_ephemeral_pool_its_file_names(seed: TreesService) -> None:
    op = seed.start_operation(pool="scratch", user="dave", job_resources=CPU, job_count=1)
    assert seed.describe_pool("physical", "scratch").ephemeral
    with_scratch = SEED_TREE + "  scratch: {weight: 2}\n"
    assert seed.apply_tree(with_scratch).changes == ("~ pool scratch",)
    assert seed.apply_tree(with_scratch).changes == ()
    assert not seed.describe_pool("physical", "scratch").ephemeral
    seed.complete_operation(op.id)
    assert seed.describe_pool("physical", "scratch").config["weight"] == 2  # still there
    # Not dave's ephemeral pool any more: he may have another.
    seed.start_operation(pool="scratch2", user="dave", job_resources=CPU, job_count=1)


def test_a_filter_that_lets_go_of_a_node_running_the_trees_jobs_is_refused(
    trees: TreesService,
) -> None:
    """ta let go of n1 with 5 jobs on it; tb took n1 and placed 10 more: 15 cpu on 10."""
    trees.add_node("n1", ["a"], {"cpu": 10})
    trees.add_node("n2", ["b"], {"cpu": 10})
    trees.create_tree("ta", {"node_tag_filter": "a"})
    trees.create_tree("tb", {"node_tag_filter": "b"})
    op = trees.start_operation(trees=["ta"], pool="x", user="u", job_resources={"cpu": 1},
                               job_count=5)
    with pytest.raises(Conflict, match="node n1 runs 5 jobs of tree ta, whose node_tag_filter "
                                       "would no longer select it"):
        trees.set_tree("ta", "node_tag_filter", "zz")
    assert trees.show_tree("ta").config["node_tag_filter"] == "a"
    trees.complete_operation(op.id)
    trees.set_tree("ta", "node_tag_filter", "zz")  # nothing runs there now


def test_usage_above_a_lowered_limit_or_a_new_parents_is_preempted_at_once(
    trees: TreesService,
) -> None:
    """YTsaurus ResourceLimitsViolated: the write that lowers a limit (or moves a pool under
    a tighter parent) preempts the newest jobs above it; the room goes to others at once."""
    trees.add_node("n1", [], {"cpu": 8})
    trees.create_tree("t")
    trees.create_pool("t", "a", options={"resource_limits": {"cpu": 8}})
    trees.create_pool("t", "b")
    trees.create_pool("t", "small", options={"resource_limits": {"cpu": 1}})
    hog = trees.start_operation(pool="a", user="u", job_resources=CPU, job_count=8)
    other = trees.start_operation(pool="b", user="v", job_resources=CPU, job_count=2)
    assert (hog.running_jobs, other.running_jobs) == (8, 0)
    trees.set_pool("t", "a", "resource_limits", "{cpu: 6}")
    seen = trees.describe_operation(hog.id)
    assert (seen.running_jobs, seen.pending_jobs, len(seen.preempted)) == (6, 2, 2)
    assert {(j.preempted_by, j.reason) for j in seen.preempted} == {
        (None, "preempted to bring pool a within its resource_limits.cpu (usage 8 > limit 6)"),
        (None, "preempted to bring pool a within its resource_limits.cpu (usage 7 > limit 6)"),
    }
    assert seen.reason == "2 jobs pending: pool a resource_limits.cpu: usage 6 + 1 > limit 6"
    assert trees.describe_operation(other.id).running_jobs == 2
    trees.set_pool("t", "a", "parent", "small")
    assert trees.describe_operation(hog.id).running_jobs == 1


def test_an_operations_weight_is_shown_as_the_decimal_it_was_given(trees: TreesService) -> None:
    trees.add_node("n1", [], {"cpu": 10})
    trees.create_tree("t")
    op = trees.start_operation(user="u", job_resources={"cpu": 1}, job_count=1, weight="0.1",
                               tree_options={"t": {"weight": 2.5}})
    assert op.as_dict()["weight"] == "2.5"  # was "5/2"
    plain = trees.start_operation(user="v", job_resources={"cpu": 1}, job_count=1,
                                  weight="1e-30")
    assert plain.as_dict()["weight"] == "0." + "0" * 29 + "1"  # was "1/10...0"


def test_operations_in_the_root_when_the_tree_allows_them(trees: TreesService) -> None:
    """A KeyError in the starvation settings (a 500 remotely)."""
    trees.add_node("n1", [], {"cpu": 10})
    trees.create_tree("t", {"forbid_immediate_operations_in_root": False})
    op = trees.start_operation(pool="<Root>", user="z", job_resources={"cpu": 1}, job_count=1)
    assert (op.pool, op.running_jobs) == ("<Root>", 1)


def test_ephemeral_pool_rules_as_ytsaurus(trees: TreesService) -> None:
    trees.add_node("n1", [], {"cpu": 10})
    trees.create_tree("t", {"default_parent_pool": "gone"})
    trees.create_pool("t", "E", options={"create_ephemeral_subpools": True})
    trees.create_pool("t", "R")
    # A default_parent_pool naming no pool is the root (every new pool failed on it).
    first = trees.start_operation(pool="E", user="u", job_resources={"cpu": 1}, job_count=1)
    assert first.pool == "E$u"
    # A pool$user subpool is not one of the user's ephemeral pools (it took the only one).
    second = trees.start_operation(pool="mine", user="u", job_resources={"cpu": 1}, job_count=1)
    assert trees.describe_pool("t", "mine").parent is None
    # Neither moves: pool$user out of E would escape E's config.
    for ephemeral in (first.pool, second.pool):
        with pytest.raises(InvalidInput, match=r"parent: pool .* is ephemeral"):
            trees.set_pool("t", ephemeral, "parent", "R")
    # offloading_settings loads again as it was written (it was flattened to {tree: pool}).
    trees.set_pool("t", "R", "offloading_settings", "{t: {pool: E}}")
    assert trees.describe_pool("t", "R").config["offloading_settings"] == {"t": {"pool": "E"}}
    trees.create_pool("t", "S", options={"offloading_settings": {"t": {"pool": "R"}}})


EPHEMERAL = "gone with its last operation; name it in the tree's document (pool-tree apply) to keep it"
FIFO = "is a fifo pool, which holds operations only"


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.set_tree("t", "default_parent_pool", "carol"),
     f"config.default_parent_pool: is an ephemeral pool, {EPHEMERAL} (got 'carol')"),
    (lambda t: t.apply_tree("name: t\nconfig: {default_parent_pool: carol}\n"
                            "pools: {d: {}, f: {mode: fifo}}\n"),
     f"config.default_parent_pool: is an ephemeral pool, {EPHEMERAL} (got 'carol')"),
    (lambda t: t.set_pool("t", "carol", "create_ephemeral_subpools", "true"),
     f"pool carol: create_ephemeral_subpools: pool carol is ephemeral, {EPHEMERAL} (got true)"),
    (lambda t: t.set_pool("t", "carol", "config_presets", "[sub]"),  # through a preset
     f"pool carol: create_ephemeral_subpools: pool carol is ephemeral, {EPHEMERAL} (got true)"),
    (lambda t: t.set_tree("t", "default_parent_pool", "f"),
     f"config.default_parent_pool: {FIFO} (got 'f')"),
    # The default parent switched to fifo, by its mode, a preset or a document.
    (lambda t: t.set_pool("t", "d", "mode", "fifo"),
     f"config.default_parent_pool: {FIFO} (got 'd')"),
    (lambda t: t.set_pool("t", "d", "config_presets", "[fifo]"),
     f"config.default_parent_pool: {FIFO} (got 'd')"),
    (lambda t: t.apply_tree("name: u\nconfig: {default_parent_pool: e, node_tag_filter: x}\n"
                            "pools: {e: {mode: fifo}}\n"),
     f"config.default_parent_pool: {FIFO} (got 'e')"),
])
def test_no_setting_makes_ephemeral_pools_under_an_ephemeral_or_fifo_pool(
    trees: TreesService, change: Callable[[TreesService], object], message: str
) -> None:
    """Before 2026-11-29 these were taken: operations then made ephemeral pools under
    carol (which lived on after its last operation, counted against carol) or failed under
    the fifo pool, naming a pool the user never gave."""
    trees.add_node("n0", [], {"cpu": 4})
    trees.create_tree("t", {"pool_config_presets": {
        "sub": {"create_ephemeral_subpools": True}, "fifo": {"mode": "fifo"}}})
    trees.create_pool("t", "d")
    trees.create_pool("t", "f", None, {"mode": "fifo"})
    trees.start_operation(user="carol", job_resources=CPU, job_count=1)
    trees.set_tree("t", "default_parent_pool", "d")
    before = dump(trees)
    with pytest.raises(InvalidInput, match=f"^{re.escape(message)}$"):
        change(trees)
    assert dump(trees) == before


def test_an_ephemeral_default_parent_stored_before_means_the_root(trees: TreesService) -> None:
    """As stored before 2026-11-29 (or an operation's pool named as default_parent_pool):
    a new ephemeral pool goes to the root; one already under an ephemeral pool goes with its
    last operation, and its ephemeral parent, if unused, too."""
    trees.add_node("n0", [], {"cpu": 4})
    trees.create_tree("t", {"default_parent_pool": "carol"})  # names no pool yet
    carol = trees.start_operation(user="carol", job_resources=CPU, job_count=1)
    dave = trees.start_operation(user="dave", job_resources=CPU, job_count=1)
    assert trees.describe_pool("t", "dave").parent is None
    with trees.db.write() as conn:  # dave under carol, as before 2026-11-29
        conn.execute(update(schema.tree_pool).where(schema.tree_pool.c.name == "dave")
                     .values(parent="carol"))
    trees.complete_operation(carol.id)
    assert trees.describe_pool("t", "carol").children == ("dave",)  # dave's keeps it
    trees.complete_operation(dave.id)
    assert {row.name for row in trees.show_tree("t").elements} == {"<Root>"}


def test_a_child_guarantees_no_resource_its_parent_guarantees_none_of(
    trees: TreesService,
) -> None:
    """YTsaurus refuses it; here the parent's inferred share of the resource scaled the
    child's whole guarantee down, cpu too (5 of 10 showed as 2; found by helper-71). A tree
    stored so before 2026-11-30 still loads and takes other changes."""
    trees.add_node("n1", [], {"cpu": 100, "gpu": 8})
    trees.create_tree("t", {})
    trees.create_pool("t", "P", None, {"strong_guarantee_resources": {"cpu": 10}})
    refused = r"^pool c: strong_guarantee_resources\.gpu: its parent P guarantees no gpu: "
    with pytest.raises(InvalidInput, match=refused + r"give it one \(got 2\)$"):
        trees.create_pool("t", "c", "P", {"strong_guarantee_resources": {"cpu": 5, "gpu": 2}})
    trees.create_pool("t", "c", "P", {"strong_guarantee_resources": {"cpu": 5}})
    with pytest.raises(InvalidInput, match=refused):
        trees.set_pool("t", "c", "strong_guarantee_resources", "{cpu: 5, gpu: 1}")
    with trees.db.write() as conn:  # as a change before 2026-11-30 could store it
        conn.execute(update(schema.tree_pool).where(schema.tree_pool.c.name == "c").values(
            config={"strong_guarantee_resources": {"cpu": 5, "gpu": 2}}))
    trees.set_pool("t", "c", "weight", "2")
    assert trees.describe_pool("t", "c").config["weight"] == 2


def test_quoted_numbers_are_text_now_but_a_tree_stored_with_one_still_loads(
    trees: TreesService,
) -> None:
    """'0.5' quoted was taken for the number and kept, and served, as the text (helper-85):
    it is refused now, naming the option; one an older version stored still loads, as its
    number."""
    from fairpool.store import trees as store

    trees.add_node("n1", [], {"cpu": 10})
    trees.create_tree("t", {})
    with pytest.raises(InvalidInput, match=r"^config\.fair_share_starvation_tolerance: must "
                       r"be a number \(got '0\.5'\)$"):
        trees.set_tree("t", "fair_share_starvation_tolerance", "'0.5'")
    with pytest.raises(InvalidInput, match=r"^weight: must be a number \(got '8'\)$"):
        trees.create_pool("t", "q", None, {"weight": "8"})
    with trees.db.write() as conn:  # as a version before 2026-12-01 left it
        store.set_tree_config(conn, "t", {"fair_share_starvation_tolerance": "0.5"},
                              datetime.now(UTC))
    assert trees.export_tree("t")["config"] == {"fair_share_starvation_tolerance": "0.5"}
    trees.create_pool("t", "q", None, {"weight": 8})
    assert [row.name.strip() for row in trees.show_tree("t").elements] == ["<Root>", "q"]


def test_a_tiny_weight_shows_as_itself(trees: TreesService) -> None:
    """Rounded to 6 decimals as a share is, a weight of 1e-12 showed as 0.0, which no weight
    may be (found by helper-71)."""
    trees.add_node("n1", [], {"cpu": 100})
    trees.create_tree("t", {})
    trees.create_pool("t", "tiny", None, {"weight": 1e-12})
    trees.create_pool("t", "big", None, {"weight": 123456789})
    assert trees.describe_pool("t", "tiny").as_dict()["weight"] == 1e-12
    assert {row.name.strip(): row.shares.weight for row in trees.show_tree("t").elements
            if row.name.strip() in ("tiny", "big")} == {"tiny": 1e-12, "big": 123456789.0}


def test_operations_of_an_unknown_tree_are_not_an_empty_list(seed: TreesService) -> None:
    with pytest.raises(NotFound, match="no pool tree 'nope'"):
        seed.list_operations(tree="nope")
    assert seed.list_operations(tree="physical") == []


def test_a_page_of_operations_is_its_slice_of_every_operation_the_filters_match(
    two_trees: TreesService,
) -> None:
    """``operation_page`` filters, counts and pages in the database: against the whole list,
    filtered as its reader would (a tree it is placed in, a status, a token's own), for pages
    within, across and past the end."""
    token, _ = Service(two_trees.db, Clock()).create_token("submitter", ["a"])
    rng = random.Random(3)
    placements: list[dict[str, Any]] = [
        {"trees": ["physical"], "pool": "project-batch"},
        {"trees": ["cpus"], "pool": "other"},
        {"trees": ["physical", "cpus"], "pool": "project-batch",
         "tree_options": {"cpus": {"pool": "other"}}},
    ]
    made = []
    for _ in range(16):
        op = two_trees.start_operation(
            **rng.choice(placements), user="u", job_resources=CPU, job_count=1,
            created_by=rng.choice([token.id, None]),
        )
        made.append(op.id)
        roll = rng.random()
        if roll < 0.2:
            two_trees.complete_operation(op.id)
        elif roll < 0.35:
            two_trees.abort_operation(op.id)
    every = two_trees.list_operations()
    assert [op.id for op in every] == made  # start order
    with two_trees.db.read() as conn:
        own = set(conn.scalars(select(schema.tree_operation.c.id).where(
            schema.tree_operation.c.created_by_token_id == token.id)))
    assert 0 < len(own) < len(every)
    assert {op.status for op in every} == set(OPERATION_STATUSES)
    for tree, status, created_by in itertools.product(
        (None, "physical", "cpus"), (None, *OPERATION_STATUSES), (None, token.id)
    ):
        expected = [op.id for op in every
                    if tree in (None, *(t.tree for t in op.trees)) and status in (None, op.status)
                    and (created_by is None or op.id in own)]
        for limit, offset in ((None, 0), (3, 2), (None, 5), (4, 40)):
            page = two_trees.operation_page(tree, status, limit=limit, offset=offset,
                                            created_by=created_by)
            end = None if limit is None else offset + limit
            assert ([op.id for op in page.items], page.total) == (
                expected[offset:end], len(expected)), (tree, status, created_by, limit, offset)
        assert [op.id for op in walked_pages(partial(
            two_trees.operation_page, tree, status, limit=3, created_by=created_by
        ), len(expected))] == expected
    with pytest.raises(InvalidInput, match=r"^limit: must be a positive integer \(got 0\)$"):
        two_trees.operation_page(limit=0)


def test_a_page_of_operations_reads_their_jobs_at_once(seed: TreesService) -> None:
    """As many statements for 30 operations as for 3: their jobs in one query (a page of
    100 read its jobs in 100)."""
    for _ in range(30):
        seed.start_operation(pool="project-batch", user="u", job_resources=CPU, job_count=2)
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    def counted(limit: int) -> tuple[int, list[int]]:
        statements.clear()
        event.listen(Engine, "before_cursor_execute", record)
        try:
            page = seed.operation_page(limit=limit)
        finally:
            event.remove(Engine, "before_cursor_execute", record)
        return len(statements), [jobs(op) for op in page.items]

    def jobs(op: OperationView) -> Any:
        return op.running_jobs, op.pending_jobs, op.nodes, op.interrupting

    counted(1)  # a first read may set its connection up
    few, many = counted(3), counted(30)
    assert few[0] == many[0]
    assert many[1] == [jobs(seed.describe_operation(op.id)) for op in seed.list_operations()]
    assert {running for running, *_ in many[1]} == {0, 2}  # some run, some wait


def test_an_error_line_cuts_a_long_value(trees: TreesService) -> None:
    """A misspelt option echoed its whole value: one line of 100 kB for 700 presets
    (found by helper-65). Any value is cut as a string is, at 80 characters."""
    presets = {f"preset_{i:04d}": {"weight": 1.5} for i in range(700)}
    with pytest.raises(InvalidInput) as refused:
        trees.create_tree("big", {"config_presets": presets})
    assert str(refused.value) == (
        "config.config_presets: unknown pool tree option; did you mean 'pool_config_presets'? "
        "(got " + repr(presets)[:77] + "...)"
    )


def test_nodes_and_pools_in_use_cannot_be_removed(seed: TreesService) -> None:
    op = seed.start_operation(pool="project-batch", user="u", job_resources=CPU, job_count=1)
    with pytest.raises(Conflict, match="node gpu-01 runs 1 job;"):
        seed.remove_node("gpu-01")
    with pytest.raises(Conflict, match=re.escape(
            f"pool project-batch has 1 started operation ({op.id}): complete or abort them "
            "first")):  # it named none (helper-79)
        seed.delete_pool("physical", "project-batch")
    seed.complete_operation(op.id)
    with pytest.raises(Conflict, match="already completed"):
        seed.abort_operation(op.id)
    seed.remove_node("gpu-01")
    assert [n.name for n in seed.list_nodes()] == ["cpu-01", "gpu-02"]
    seed.delete_pool("physical", "project-batch")


def test_starvation_timeline_and_backoff(seed: TreesService, clock: Clock) -> None:
    seed.set_tree("physical", "fair_share_starvation_timeout", "1000")
    batch = seed.start_operation(pool="project-batch", user="a", job_resources=CPU,
                                 job_count=100)
    adhoc = seed.start_operation(pool="project-adhoc", user="b", job_resources=CPU,
                                 job_count=10)
    below = seed.describe_operation(adhoc.id).shares
    assert below is not None and below.below_fair_share_since is not None and not below.starving
    advance(clock, 0.5)
    seed.reconcile()
    assert seed.describe_operation(adhoc.id).running_jobs == 0
    advance(clock, 0.6)  # 1.1 s > 1000 ms: starving, it preempts
    seed.reconcile()
    assert seed.describe_operation(adhoc.id).running_jobs == 10
    assert seed.describe_operation(batch.id).running_jobs == 90
    with seed.db.read() as conn:
        stamped = conn.execute(select(schema.cluster_node.c.name)
                               .where(schema.cluster_node.c.last_preemption_at.is_not(None))
                               ).scalars().all()
    assert stamped  # preemptive_scheduling_backoff starts on the nodes that preempted


def test_an_operation_its_preemptions_brought_within_tolerance_is_not_called_starving(
    trees: TreesService, clock: Clock
) -> None:
    """x preempts one job of b's and then finds nothing more to take: its reason said
    "starving, but ..." beside `starving: no`, as the shares after the plan say (0.375 >=
    0.4375 * 0.8); and that c's one job was "within its operation's fair share" when c uses
    0.5 of a 0.1875 share (losing it would take c below; helper-89)."""
    for name in ("n1", "n2"):
        trees.add_node(name, ["gpu"], {"cpu": 8, "gpu": 2})
    trees.create_tree("t", {"node_tag_filter": "gpu", "main_resource": "cpu",
                            "fair_share_starvation_timeout": 1000})
    trees.create_pool("t", "a", options={"strong_guarantee_resources": {"cpu": 8}})
    for pool, user, resources, count in [("a", "u1", {"cpu": 1}, 4),
                                         ("c", "u5", {"cpu": 4, "gpu": 2}, 4),
                                         ("b", "u3", {"cpu": 1}, 2)]:
        trees.start_operation(trees=["t"], pool=pool, user=user, job_resources=resources,
                              job_count=count)
    x = trees.start_operation(trees=["t"], pool="a", user="u6", job_resources={"cpu": 1},
                              job_count=8)
    advance(clock, 1.5)
    trees.reconcile("t")
    described = trees.describe_operation(x.id)
    assert described.shares is not None and not described.shares.starving
    assert described.reason == (
        "2 jobs pending: below its fair share, but no job of another operation in tree t may "
        "be preempted: losing any would take its operation below its fair share * "
        "preemption_satisfaction_threshold, or non_preemptible_resource_usage_threshold keeps it")


def test_interruptible_victims_keep_their_units_until_allocation_preemption_timeout(
    seed: TreesService, clock: Clock
) -> None:
    seed.set_tree("physical", "fair_share_starvation_timeout", "1000")
    seed.set_tree("physical", "job_interrupt_timeout", "5000")  # the YTsaurus alias
    batch = seed.start_operation(pool="project-batch", user="a", job_resources=CPU,
                                 job_count=100, interruptible=True)
    assert batch.interruptible and batch.as_dict()["interrupting"] == []
    adhoc = seed.start_operation(pool="project-adhoc", user="b", job_resources=CPU,
                                 job_count=10)
    advance(clock, 1.1)
    seed.reconcile()  # starving: 10 of batch's jobs are interrupted, not preempted
    interrupted_at = clock.now  # (the clock ticks 1 ms per read)
    seen = seed.describe_operation(batch.id)
    assert (seen.running_jobs, len(seen.interrupting), seen.pending_jobs) == (90, 10, 0)
    deadline = seen.interrupting[0].deadline
    assert {j.deadline for j in seen.interrupting} == {deadline}
    assert deadline is not None
    assert timedelta(seconds=4.99) < deadline - interrupted_at <= timedelta(seconds=5)
    assert {j.preempted_by for j in seen.interrupting} == {adhoc.id}
    assert seen.as_dict()["interrupting"][0]["deadline"] == deadline.isoformat()
    assert "allocation_preemption_timeout 5000 ms" in (seen.interrupting[0].reason or "")
    waiting = seed.describe_operation(adhoc.id)
    # The newest jobs go first: all started at once, so the last made (ids sort by time),
    # which were placed last, on gpu-02.
    assert (waiting.running_jobs, waiting.reason) == (0, (
        "10 jobs pending: 10 wait for interrupted jobs to leave gpu-02 "
        "(allocation_preemption_timeout)"
    ))
    with seed.db.read() as conn:
        used = conn.execute(select(func.count()).select_from(schema.tree_job).where(
            schema.tree_job.c.status.in_(["running", "interrupting"]))).scalar_one()
    assert used == 100  # the units are still taken: nothing over-committed
    advance(clock, 4.9)
    seed.reconcile()  # before the deadline: nothing changes, nothing more is preempted
    assert seed.describe_operation(adhoc.id).running_jobs == 0
    assert len(seed.describe_operation(batch.id).interrupting) == 10
    advance(clock, 0.1)
    seed.reconcile()  # at the deadline: the units are taken and go to adhoc
    assert seed.describe_operation(adhoc.id).running_jobs == 10
    seen = seed.describe_operation(batch.id)
    assert (seen.running_jobs, len(seen.interrupting), len(seen.preempted)) == (90, 0, 10)
    assert seen.pending_jobs == 10
    assert {j.preempted_by for j in seen.preempted} == {adhoc.id}


def test_the_servers_tick_passes_only_where_time_can_change_a_decision(
    seed: TreesService, clock: Clock
) -> None:
    """A pass each second over a tree where nothing waits changes nothing but took the
    writer's lock (seconds of it for a large tree: helper-79): the tick skips it, without a
    write. Where an operation waits, or a job is being interrupted, it passes: starvation
    preemption and interruption deadlines act by the tick alone."""
    def generation() -> int:
        with seed.db.read() as conn:
            return read_generation(conn)

    seed.set_tree("physical", "fair_share_starvation_timeout", "1000")
    seed.set_tree("physical", "allocation_preemption_timeout", "5000")
    batch = seed.start_operation(pool="project-batch", user="a", job_resources=CPU,
                                 job_count=100, interruptible=True)
    assert seed.describe_operation(batch.id).running_jobs == 100
    before = generation()
    assert seed.tick("physical") is False
    assert generation() == before
    adhoc = seed.start_operation(pool="project-adhoc", user="b", job_resources=CPU,
                                 job_count=10)
    assert seed.tick("physical") is True  # it waits; not yet starving long enough
    advance(clock, 1.1)
    assert seed.tick("physical") is True
    assert len(seed.describe_operation(batch.id).interrupting) == 10
    advance(clock, 5)
    assert seed.tick("physical") is True
    assert seed.describe_operation(adhoc.id).running_jobs == 10
    assert seed.tick("physical") is True  # batch's 10 preempted jobs wait now
    seed.complete_operation(adhoc.id)  # the write's own pass gives them back
    assert seed.describe_operation(batch.id).running_jobs == 100
    before = generation()
    assert seed.tick("physical") is False
    assert generation() == before


def test_preempted_jobs_are_listed_in_preemption_order(trees: TreesService, clock: Clock) -> None:
    """Before 2026-11-29 they came in start order (ties by id), so their times went back and
    the table's last ten were not the newest."""
    trees.add_node("n0", [], {"cpu": 20})
    trees.create_tree("t", {"fair_share_starvation_timeout": 0,
                            "preemptive_scheduling_backoff": 0})
    for name, weight in (("x", 1), ("y", 1), ("z", 8)):
        trees.create_pool("t", name, None, {"weight": weight})
    x = trees.start_operation(pool="x", user="u", job_resources=CPU, job_count=20)
    advance(clock, 1)
    y = trees.start_operation(pool="y", user="u", job_resources=CPU, job_count=20)
    trees.reconcile("t")
    advance(clock, 1)
    z = trees.start_operation(pool="z", user="u", job_resources=CPU, job_count=20)
    trees.reconcile("t")
    preempted = trees.describe_operation(x.id).preempted
    by = [job.preempted_by for job in preempted]
    assert (by.count(y.id), by.count(z.id)) == (10, 8)
    assert by == [y.id] * 10 + [z.id] * 8
    times = [job.at for job in preempted]
    assert times == sorted(times, key=lambda at: at or NOW)
    # Within a pass, as chosen: the newest job first (they came in start order; helper-71).
    with trees.db.read() as conn:
        started = {job.id: (job.started_at, job.id) for job in store.jobs_of(conn, [x.id])}
    for preemptor in (y.id, z.id):
        mine = [started[job.job] for job in preempted if job.preempted_by == preemptor]
        assert mine == sorted(mine, reverse=True)


def test_an_interrupting_job_ends_with_its_operation(seed: TreesService, clock: Clock) -> None:
    seed.set_tree("physical", "fair_share_starvation_timeout", "0")
    batch = seed.start_operation(pool="project-batch", user="a", job_resources=CPU,
                                 job_count=100, interruptible=True)
    adhoc = seed.start_operation(pool="project-adhoc", user="b", job_resources=CPU,
                                 job_count=10)
    advance(clock, 1)
    seed.reconcile()
    assert len(seed.describe_operation(batch.id).interrupting) == 10
    seed.complete_operation(batch.id)  # the units return at once: adhoc gets them
    assert seed.describe_operation(adhoc.id).running_jobs == 10


@pytest.mark.parametrize(("values", "constraint"), [
    ({"status": "interrupting"}, "interrupting_has_deadline"),
    ({"interrupt_deadline": NOW}, "running_not_interrupted"),
    ({"status": "interrupting", "interrupt_deadline": NOW, "finished_at": NOW},
     "finished_iff_not_live"),
])
def test_the_store_refuses_inconsistent_interruptions(
    seed: TreesService, values: dict[str, object], constraint: str
) -> None:
    seed.start_operation(pool="project-batch", user="a", job_resources=CPU, job_count=1)
    with pytest.raises(IntegrityError, match=constraint), seed.db.write() as conn:
        conn.execute(update(schema.tree_job).values(**values))


# -- operations in several trees (YTsaurus pool_trees) -------------------------------------

CPU_TREE = """
name: cpus
config: {node_tag_filter: cpu, max_running_operation_count: 2}
pools:
  research: {max_operation_count: 1}
  other: {}
"""


@pytest.fixture
def two_trees(seed: TreesService) -> TreesService:
    """The seed's tree on the gpu nodes (100 cpu) and ``cpus`` on cpu-01 (500 cpu)."""
    seed.apply_tree(CPU_TREE)
    return seed


def test_an_operation_runs_its_jobs_in_any_of_its_trees(two_trees: TreesService) -> None:
    op = two_trees.start_operation(
        trees=["physical", "cpus"], pool="project-batch", user="alice", job_resources=CPU,
        job_count=300, tree_options={"cpus": {"pool": "research", "weight": 3}},
    )
    assert (op.tree, op.pool, op.status) == ("physical,cpus", "project-batch,research", "running")
    # one pending count for both trees: 100 jobs on the gpu nodes, the other 200 on cpu-01
    assert (op.running_jobs, op.pending_jobs) == (300, 0)
    assert op.reason is None  # the gpu tree's pass ran again once cpu-01 took the rest
    assert op.nodes == {"cpu-01": 200, "gpu-01": 50, "gpu-02": 50}
    physical, cpus = op.trees
    assert (physical.tree, physical.pool, physical.weight, physical.running_jobs) == (
        "physical", "project-batch", "1", 100)
    assert (cpus.tree, cpus.pool, cpus.weight, cpus.running_jobs) == ("cpus", "research", "3", 200)
    assert physical.shares is not None and cpus.shares is not None and op.shares is None
    assert (physical.shares.usage_share, cpus.shares.usage_share) == (1.0, 0.4)
    data = op.as_dict()
    assert [t["tree"] for t in data["trees"]] == ["physical", "cpus"] and "fair_share" not in data
    # each tree's fair share sees it with that tree's weight
    other = two_trees.start_operation(trees=["cpus"], pool="other", user="bob",
                                      job_resources=CPU, job_count=500)
    assert other.pending_jobs == 200
    shown = two_trees.show_tree("cpus").elements
    fair = {row.name: row.shares.fair_share for row in shown if row.kind == "pool"}
    assert fair == {"research": 0.4, "other": 0.6}  # research's demand is its usage: 200 cpu
    assert two_trees.describe_operation(op.id).trees[1].reason is None
    # ending it frees its jobs in both trees
    two_trees.complete_operation(op.id)
    assert two_trees.describe_operation(other.id).running_jobs == 500
    assert {n.name: n.running_jobs for n in two_trees.list_nodes()} == {
        "cpu-01": 500, "gpu-01": 0, "gpu-02": 0}


def test_a_tree_is_deleted_once_no_operation_is_started_in_it(two_trees: TreesService) -> None:
    both = two_trees.start_operation(
        trees=["physical", "cpus"], pool="project-batch", user="alice", job_resources=CPU,
        job_count=150, tree_options={"cpus": {"pool": "research"}},
    )
    here = two_trees.start_operation(trees=["physical"], pool="project-adhoc", user="bob",
                                     job_resources=CPU, job_count=1)
    two_trees.default_tree("physical")
    before = dump(two_trees)
    with pytest.raises(Conflict, match=(
        f"pool tree physical has 2 started operations \\({both.id}, {here.id}\\): "
        "complete or abort them first"
    )):
        two_trees.delete_tree("physical")
    assert dump(two_trees) == before  # nothing written
    two_trees.complete_operation(both.id)
    two_trees.abort_operation(here.id)
    two_trees.delete_tree("physical")
    assert [t.name for t in two_trees.list_trees()] == ["cpus"]
    assert two_trees.default_tree() is None
    # the operation that ran only there is gone; the other keeps its history in cpus
    with pytest.raises(NotFound):
        two_trees.describe_operation(here.id)
    kept = two_trees.describe_operation(both.id)
    assert (kept.tree, kept.pool, kept.status) == ("cpus", "research", "completed")
    counts = dump(two_trees)
    assert counts["tree_pool"] == 2 and counts["pool_tree_default"] == 0
    assert counts["tree_job"] == 50  # the 50 jobs it ran on cpu-01
    assert counts["cluster_node"] == 3  # nodes belong to no tree
    # the name is free again, and an unknown tree is an error
    two_trees.apply_tree(SEED_TREE)
    assert {row.name for row in two_trees.show_tree("physical").elements} >= {"project-batch"}
    with pytest.raises(NotFound, match="no pool tree 'nope'"):
        two_trees.delete_tree("nope")


def test_a_tree_limit_pends_the_operation_in_that_tree_only(two_trees: TreesService) -> None:
    for _ in range(2):  # cpus runs at most 2 operations
        two_trees.start_operation(trees=["cpus"], pool="other", user="bob", job_resources=CPU,
                                  job_count=1)
    op = two_trees.start_operation(trees=["physical", "cpus"], pool="project-batch", user="a",
                                   job_resources=CPU, job_count=150,
                                   tree_options={"cpus": {"pool": "research"}})
    assert (op.status, op.running_jobs, op.pending_jobs) == ("running", 100, 50)
    assert [(t.tree, t.status) for t in op.trees] == [("physical", "running"), ("cpus", "pending")]
    assert op.reason == (
        "tree physical: 50 jobs pending: no node of tree physical has room for a job "
        "(cpu 1, user_slots 1) now; tree cpus: pending: tree cpus runs 2 operations, its "
        "max_running_operation_count is 2"
    )
    rows = {row.name: row.status for row in two_trees.show_tree("cpus").elements
            if row.kind == "operation"}
    assert rows[op.id] == "pending"


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"trees": ["physical", "nope"]}, NotFound, "no pool tree 'nope'"),
    ({"trees": ["physical", "physical"]}, InvalidInput, "tree: given twice (got 'physical')"),
    ({"trees": ["physical"], "tree_options": {"cpus": {"pool": "research"}}}, InvalidInput,
     "tree_options.cpus: is not one of the operation's trees (physical) (got 'cpus')"),
    ({"trees": ["physical", "cpus"], "tree_options": {"cpus": {"pol": "research"}}},
     InvalidInput, "tree_options.cpus.pol: unknown option; one of pool, weight, "
     "resource_limits (got 'research')"),
    ({"trees": ["physical", "cpus"], "tree_options": {"cpus": {"weight": 0}}}, InvalidInput,
     "tree_options.cpus.weight: must be positive (got 0)"),
    ({"trees": ["physical", "cpus"], "tree_options": {"cpus": {"resource_limits": {"cpu": -1}}}},
     InvalidInput, "tree_options.cpus.resource_limits.cpu"),
    # admission is checked in every tree: research holds 1 started operation at most
    ({"trees": ["physical", "cpus"], "tree_options": {"cpus": {"pool": "research"}}},
     InvalidInput, "pool: has 1 started operation in tree cpus, its max_operation_count is 1 "
     "(got 'research')"),
])
def test_a_refused_multi_tree_operation_writes_nothing(
    two_trees: TreesService, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    two_trees.start_operation(trees=["cpus"], pool="research", user="u", job_resources=CPU,
                              job_count=1)
    before = dump(two_trees)
    with pytest.raises(error, match=re.escape(message)):
        two_trees.start_operation(pool="project-batch", user="u", job_resources=CPU,
                                  job_count=1, **kwargs)  # type: ignore[arg-type]
    assert dump(two_trees) == before


# -- integral guarantees ---------------------------------------------------------------------------

INTEGRAL_TREE = """
name: burst
pools:
  B: {integral_guarantees: {guarantee_type: burst, burst_guarantee_resources: {cpu: 50},
      resource_flow: {cpu: 10}}}
  W: {weight: 3}
"""


@pytest.fixture
def still() -> Clock:
    """A clock that moves only by hand, so that the time between passes is exact."""
    return Clock(NOW, step=timedelta(0))


@pytest.fixture
def integral_trees(database_url: str, still: Clock) -> Iterator[TreesService]:
    db = Database.open(database_url)
    service = TreesService(db, still)
    service.add_node("n1", [], {"cpu": 100})
    service.apply_tree(INTEGRAL_TREE)
    yield service
    db.close()


def stored_integral(trees: TreesService, pool: str) -> tuple[object, object, object]:
    table = schema.tree_pool
    with trees.db.read() as conn:
        row = conn.execute(
            select(table.c.integral_volume, table.c.integral_share_ratio,
                   table.c.integral_updated_at).where(table.c.name == pool)
        ).one()
    return row[0], row[1], row[2]


def test_a_burst_pool_spends_its_volume_pass_by_pass(
    integral_trees: TreesService, still: Clock
) -> None:
    """B (burst 50 cpu, flow 10) against W (weight 3) on 100 cpu, both demanding everything.
    Each pass refills and consumes B's volume over the time since the previous one (exactly
    once per command), in the same transaction."""
    trees = integral_trees
    assert stored_integral(trees, "B") == ({"cpu": "0"}, "0", NOW)
    still.now += timedelta(seconds=600)  # idle: 100 cpu * 600 s * 1/10 = 6000 cpu-s
    for user, pool in (("u1", "B"), ("u2", "W")):
        trees.start_operation(user=user, job_resources={"cpu": 1}, job_count=1000,
                              trees=["burst"], pool=pool)
    b = trees.describe_pool("burst", "B").as_dict()
    # 6000 cpu-s pay for a share of 1 over smooth_period: B is guaranteed its burst 1/2,
    # then weights split the rest: 1/2 + f + 3f = 1.
    assert (b["fair_share"], trees.describe_pool("burst", "W").as_dict()["fair_share"]) == (
        0.625, 0.375
    )
    assert b["detailed"]["integral_guarantee"] == {"cpu": 0.5}
    integral = b["integral"]
    assert integral["integral_guarantee_type"] == "burst"
    assert integral["accumulated_resource_volume"] == {"cpu": 6000.0}
    assert integral["accumulated_resource_ratio_volume"] == 60.0
    assert integral["integral_pool_capacity"] == 8640.0
    assert integral["estimated_burst_usage_duration_seconds"] == 150.0  # 60 / (1/2 - 1/10)
    assert stored_integral(trees, "B") == ({"cpu": "6000"}, "1/2", still.now)

    still.now += timedelta(seconds=100)  # 6000 + 100 * 100 * (1/10 - 1/2) = 2000: a share 1/3
    trees.reconcile("burst")
    assert shares_of(trees) == {"B": 0.5, "W": 0.5}
    assert stored_integral(trees, "B") == ({"cpu": "2000"}, "1/3", still.now)

    still.now += timedelta(seconds=150)  # 2000 - 150 * 100 * (1/3 - 1/10) < 0: empty
    trees.reconcile("burst")
    assert shares_of(trees) == {"B": 0.25, "W": 0.75}
    assert stored_integral(trees, "B") == ({"cpu": "0"}, "0", still.now)


def shares_of(trees: TreesService) -> dict[str, float]:
    return {row.name: row.shares.fair_share
            for row in trees.show_tree("burst").elements if row.kind == "pool"}


@pytest.mark.parametrize(
    ("waits", "volume"),
    [
        ((3600,), "36000"),  # 100 cpu * 3600 s * 1/10
        ((3600, 3600), "72000"),  # two passes add up
        ((86_400 * 10,), "864000"),  # capped at flow * pool_capacity_saturation_period (1 day)
    ],
)
def test_an_idle_integral_pool_accrues_at_its_flow_up_to_its_capacity(
    integral_trees: TreesService, still: Clock, waits: tuple[int, ...], volume: str
) -> None:
    for wait in waits:
        still.now += timedelta(seconds=wait)
        integral_trees.reconcile("burst")
    assert stored_integral(integral_trees, "B") == ({"cpu": volume}, "0", still.now)
    # Reading recomputes nothing: the volume is the last pass's.
    still.now += timedelta(seconds=60)
    view = integral_trees.describe_pool("burst", "B").as_dict()
    assert view["integral"]["accumulated_resource_volume"] == {"cpu": float(volume)}


def test_the_servers_tick_passes_a_tree_with_an_integral_pool(
    integral_trees: TreesService, still: Clock
) -> None:
    """Nothing waits, but B's volume moves with time at a share that depends on it: one pass
    after a long gap drained what a pass each second kept (helper-82), so the tick passes."""
    integral_trees.start_operation(user="u", job_resources={"cpu": 1}, job_count=100,
                                   trees=["burst"], pool="B")
    still.now += timedelta(seconds=1)
    assert integral_trees.tick("burst") is True
    assert stored_integral(integral_trees, "B")[2] == still.now


def test_a_pool_that_stops_being_integral_forgets_its_volume(
    integral_trees: TreesService, still: Clock
) -> None:
    still.now += timedelta(seconds=60)
    integral_trees.set_pool("burst", "B", "integral_guarantees", "{guarantee_type: none}")
    assert stored_integral(integral_trees, "B") == (None, None, None)
    assert integral_trees.describe_pool("burst", "B").as_dict()["integral"] is None
