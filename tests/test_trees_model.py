"""Pool-tree model (seed 003): validation with precise messages, inheritance, YAML, nodes."""

from __future__ import annotations

import re
from fractions import Fraction as F

import pytest
import yaml

from fairpool.engine.fairshare import (
    ROOT,
    FifoSortParameter,
    OperationSnapshot,
    SchedulingMode,
    compute_fair_share,
)
from fairpool.errors import InvalidInput
from fairpool.frontends.trees import (
    ClusterNode,
    Pool,
    PoolConfig,
    PoolTree,
    PoolTreeConfig,
    load_pool_tree,
    matches_tag_filter,
    parse_resources,
    tree_resources,
)

SEED_TREE = """
name: physical
config: {node_tag_filter: gpu, main_resource: cpu}
pools:
  project-root:
    strong_guarantee_resources: {cpu: 100}
    weight: 1
    max_running_operation_count: 10
    max_operation_count: 50
    pools:
      project-adhoc: {strong_guarantee_resources: {cpu: 80}, max_running_operation_count: 10, max_operation_count: 50}
      project-batch: {weight: 10, max_running_operation_count: 4, max_operation_count: 50}
      project-backup: {strong_guarantee_resources: {cpu: 20}, max_running_operation_count: 2, max_operation_count: 50}
"""


def pool(name: str, parent: str | None = None, **options: object) -> Pool:
    return Pool(name, parent, PoolConfig.from_mapping(options))


def build(*pools: Pool, **tree_options: object) -> PoolTree:
    return PoolTree.build("physical", PoolTreeConfig.from_mapping(tree_options), pools)


def test_seed_pool_example_loads_and_computes_the_seed_outcome() -> None:
    tree = load_pool_tree(SEED_TREE)
    assert tree.children(ROOT) == ["project-root"]
    assert tree.children("project-root") == ["project-adhoc", "project-backup", "project-batch"]
    assert tree.effective["project-batch"].effective_max_running_operation_count == 4
    operations = [
        OperationSnapshot(f"{p}-op", p, {"cpu": 1}, pending_job_count=1000)
        for p in ("project-adhoc", "project-batch", "project-backup")
    ]
    result = compute_fair_share(tree.fair_share_snapshot({"cpu": 100}, operations))
    assert {p: result.pools[p].fair_share.total["cpu"] for p in tree.children("project-root")} == {
        "project-adhoc": F("0.8"),
        "project-backup": F("0.2"),
        "project-batch": 0,
    }


@pytest.mark.parametrize("document", [
    SEED_TREE,
    # Options given in part: what is not given is not written back (an unset count is None,
    # which no count option takes).
    "name: t\npools:\n  p: {create_ephemeral_subpools: true, ephemeral_subpool_config: {mode: fifo}}\n",
    "name: t\npools:\n  p: {ephemeral_subpool_config: {}}\n",
    "name: t\npools:\n  p: {integral_guarantees: {guarantee_type: burst}}\n",
], ids=["seed", "ephemeral subpool config in part", "ephemeral subpool config empty",
        "integral guarantees in part"])
def test_loading_is_idempotent_and_round_trips(document: str) -> None:
    tree = load_pool_tree(document)
    assert load_pool_tree(document) == tree
    assert load_pool_tree(yaml.safe_dump(tree.to_mapping())) == tree


# -- defaults and inheritance --------------------------------------------------------------


def test_tree_defaults_are_ytsaurus_defaults() -> None:
    config = PoolTreeConfig()
    assert (config.main_resource, config.default_parent_pool) == ("cpu", ROOT)
    assert config.forbid_immediate_operations_in_root is True
    assert (config.max_operation_count, config.max_running_operation_count) == (50_000, 2_000)
    assert (config.max_operation_count_per_pool, config.max_running_operation_count_per_pool) == (
        50,
        50,
    )
    assert config.max_ephemeral_pool_per_user == 1
    assert config.infer_weight_from_guarantees_share_multiplier is None
    assert (config.fair_share_starvation_timeout, config.fair_share_starvation_tolerance) == (
        30_000,
        F("0.8"),
    )
    assert config.preemption_satisfaction_threshold == 1
    assert (config.preemptive_scheduling_backoff, config.allocation_preemption_timeout) == (
        5_000,
        10_000,
    )
    assert config.non_preemptible_resource_usage_threshold == {}


def test_pool_defaults() -> None:
    effective = build(pool("p")).effective["p"]
    assert effective.mode is SchedulingMode.FAIR_SHARE
    assert effective.fifo_sort_parameters == (
        FifoSortParameter.WEIGHT,
        FifoSortParameter.START_TIME,
    )
    assert effective.config.weight is None  # 1, or inferred, at fair-share time
    assert (
        effective.effective_max_operation_count,
        effective.effective_max_running_operation_count,
    ) == (50, 50)
    assert not effective.forbid_immediate_operations and not effective.create_ephemeral_subpools


def test_inheritance_pool_then_parent_then_tree() -> None:
    tree = build(
        pool(
            "a",
            fair_share_starvation_tolerance=0.5,
            non_preemptible_resource_usage_threshold={"cpu": 2},
        ),
        pool("b", "a", fair_share_starvation_timeout=1000),
        pool("c", "b", fair_share_starvation_tolerance=0.9),
        fair_share_starvation_timeout=60_000,
        max_operation_count_per_pool=20,
        max_running_operation_count_per_pool=5,
    )
    c = tree.effective["c"]
    assert c.effective_fair_share_starvation_tolerance == F("0.9")  # own
    assert c.effective_fair_share_starvation_timeout == 1000  # parent's
    assert c.effective_non_preemptible_resource_usage_threshold == {"cpu": 2}  # grandparent's
    assert tree.effective["a"].effective_fair_share_starvation_timeout == 60_000  # tree's
    assert (c.effective_max_operation_count, c.effective_max_running_operation_count) == (20, 5)
    assert c.path == ("a", "b", "c") and tree.ancestors("c") == ["c", "b", "a"]
    snapshot = tree.fair_share_snapshot({"cpu": 10})
    assert {p.name: p.starvation.timeout_ms for p in snapshot.pools} == {
        "a": 60_000,
        "b": 1000,
        "c": 1000,
    }


def test_config_presets_apply_in_order_and_explicit_options_win() -> None:
    tree = build(
        pool("p", config_presets=["small", "fifo"], max_running_operation_count=1),
        pool_config_presets={
            "small": {"max_running_operation_count": 3, "max_operation_count": 5, "weight": 2},
            "fifo": {"mode": "fifo", "weight": 3},
        },
    )
    effective = tree.effective["p"]
    assert effective.mode is SchedulingMode.FIFO
    assert effective.config.weight == 3
    assert (
        effective.effective_max_operation_count,
        effective.effective_max_running_operation_count,
    ) == (5, 1)


def test_ephemeral_subpool_takes_its_parents_template() -> None:
    tree = build(
        pool(
            "research",
            create_ephemeral_subpools=True,
            ephemeral_subpool_config={
                "mode": "fifo",
                "max_operation_count": 3,
                "resource_limits": {"gpu": 2},
            },
        )
    )
    subpool = tree.ephemeral_subpool("research", "alice")
    assert (subpool.name, subpool.parent, subpool.is_ephemeral) == (
        "research$alice",
        "research",
        True,
    )
    grown = tree.with_pool(subpool)
    effective = grown.effective["research$alice"]
    assert effective.mode is SchedulingMode.FIFO
    assert effective.effective_max_operation_count == 3
    # The running limit stays the tree's per-pool default; the lower total limit binds first.
    assert effective.effective_max_running_operation_count == 50
    assert effective.config.resource_limits == {"gpu": 2}


def test_aliases_and_units() -> None:
    config = PoolTreeConfig.from_mapping({"nodes_filter": "gpu", "max_ephemeral_pools_per_user": 2})
    assert (config.node_tag_filter, config.max_ephemeral_pool_per_user) == ("gpu", 2)
    assert PoolConfig.from_mapping(
        {"min_share_resources": {"cpu": 1}}
    ).strong_guarantee_resources == {"cpu": 1}
    assert parse_resources("resources", {"memory": "512GiB", "cpu": 64}) == {
        "memory": 512 * 2**30,
        "cpu": 64,
    }
    assert parse_resources("resources", {"memory": "4G"}) == {"memory": 4 * 10**9}
    assert PoolConfig.from_mapping(
        {"fifo_sort_parameters": ["pending_allocation_count"]}
    ).fifo_sort_parameters == (FifoSortParameter.PENDING_JOB_COUNT,)


# -- nodes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "tags", "selected"),
    [
        ("", set(), True),
        ("gpu", {"gpu", "a100"}, True),
        ("gpu & !a100", {"gpu", "a100"}, False),
        ("gpu & (a100 | h100)", {"gpu", "h100"}, True),
        ("!" * 63 + "(gpu)", {"gpu"}, False),  # as deep as a formula may nest
        ("cpu | gpu", {"ssd"}, False),
    ],
)
def test_node_tag_filter(expression: str, tags: set[str], selected: bool) -> None:
    assert matches_tag_filter(expression, tags) is selected


def test_tree_capacity_sums_the_selected_nodes() -> None:
    nodes = [
        ClusterNode.create(
            "gpu-01", ["gpu", "a100"], {"cpu": 64, "memory": "512GiB", "gpu": 8, "user_slots": 64}
        ),
        ClusterNode.create("gpu-02", ["gpu"], {"cpu": 32, "gpu": 4}),
        ClusterNode.create("cpu-01", ["cpu"], {"cpu": 128}),
    ]
    assert tree_resources(PoolTreeConfig(node_tag_filter="gpu"), nodes) == {
        "cpu": 96,
        "memory": 512 * 2**30,
        "gpu": 12,
        "user_slots": 64,
    }



@pytest.mark.parametrize("resources", [{}, {"cpu": 0, "gpu": 0}])
def test_a_node_with_no_resource_above_0_is_refused(resources: dict[str, int]) -> None:
    """No job could ever be placed there (``node add --resources '{}'`` was taken)."""
    with pytest.raises(InvalidInput) as raised:
        ClusterNode.create("n1", [], resources)
    assert str(raised.value) == (
        f"resources: must give the node some resource above 0 (got {resources})"
    )


# -- validation: one failing example per rule, with its message ---------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: build(
                pool("p", strong_guarantee_resources={"cpu": 10}),
                pool("c", "p", strong_guarantee_resources={"cpu": 11}),
            ),
            "pool p: strong_guarantee_resources.cpu: is less than its children's sum 11 (got 10)",
        ),
        (
            lambda: build(pool("p"), pool("c", "p", strong_guarantee_resources={"cpu": 1})),
            "pool p: strong_guarantee_resources.cpu: is less than its children's sum 1 (got 0)",
        ),
        (
            lambda: build(pool("p", strong_guarantee_resources={"memory": 10})),
            "pool p: strong_guarantee_resources: must contain the tree's main_resource 'cpu' (got {'memory': 10})",
        ),
        (
            lambda: build(pool("p", max_running_operation_count=10, max_operation_count=5)),
            "pool p: max_running_operation_count: must not exceed max_operation_count 5 (got 10)",
        ),
        (
            lambda: build(
                pool("p", config_presets=["few"], max_running_operation_count=6),
                pool_config_presets={"few": {"max_operation_count": 5}},
            ),
            "pool p: max_running_operation_count: must not exceed max_operation_count 5 (got 6)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping(
                {"max_running_operation_count": 10, "max_operation_count": 5}
            ),
            "config.max_running_operation_count: must not exceed max_operation_count 5 (got 10)",
        ),
        (
            # The option set is at fault, not the default it conflicts with (it was blamed).
            lambda: PoolTreeConfig.from_mapping({"max_operation_count_per_pool": 0}),
            "config.max_operation_count_per_pool: must be at least "
            "max_running_operation_count_per_pool 50 (got 0)",
        ),
        (
            lambda: pool("p", ephemeral_subpool_config=5),
            "ephemeral_subpool_config: must be a mapping (got 5)",
        ),
        (lambda: pool("p", weight=0), "weight: must be positive (got 0)"),
        # A weight's bounds do not offer 0, which it refuses.
        (
            lambda: pool("p", weight=float("inf")),
            "weight: must be a finite number between 1e-30 and 1e30 in magnitude (got inf)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping({"fair_share_starvation_tolerance": 1e-31}),
            "config.fair_share_starvation_tolerance: must be a finite number between 1e-30 and "
            "1e30 in magnitude (or 0) (got 1e-31)",
        ),
        (lambda: pool("p", weight=-2.5), "weight: must be positive (got -2.5)"),
        (
            lambda: build(Pool("p", None, PoolConfig(weight=F(0)))),
            "pool p: weight: must be positive (got 0)",
        ),
        (
            lambda: build(pool("p"), pool("p")),
            "pool: pool names must be unique in tree 'physical' (got 'p')",
        ),
        (lambda: build(pool("a", "b"), pool("b", "a")), "pool a: parent: makes a cycle (got 'b')"),
        (
            lambda: build(pool("a", "ghost")),
            "pool a: parent: no such pool in the tree (got 'ghost')",
        ),
        (
            lambda: pool("p", wieght=2),
            "wieght: unknown pool option; did you mean 'weight'? (got 2)",
        ),
        (
            lambda: pool("p", ephemeral_subpool_config={"zzz": 3}),
            "ephemeral_subpool_config.zzz: unknown ephemeral_subpool_config option; one of mode, "
            "max_running_operation_count, max_operation_count, resource_limits (got 3)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping({"main_resorce": "gpu"}),
            "config.main_resorce: unknown pool tree option; did you mean 'main_resource'? (got 'gpu')",
        ),
        (lambda: build(pool("a$b")), "pool: must match [-_a-zA-Z0-9:]+ (got 'a$b')"),
        (lambda: build(pool(ROOT)), "pool: is the root's reserved name (got '<Root>')"),
        (
            lambda: build(pool("f", mode="fifo", create_ephemeral_subpools=True)),
            "pool f: create_ephemeral_subpools: a fifo pool holds operations only, not "
            "subpools (got true)",
        ),
        (
            lambda: build(pool("f", mode="fifo"), pool("c", "f")),
            "pool c: parent: is a fifo pool, which holds operations only (got 'f')",
        ),
        (lambda: pool("p", mode="lifo"), "mode: must be fair_share or fifo (got 'lifo')"),
        (
            lambda: pool("p", fifo_sort_parameters=["weight", "weight"]),
            "fifo_sort_parameters: must not repeat a parameter (got ['weight', 'weight'])",
        ),
        (
            lambda: pool("p", fifo_sort_parameters=["size"]),
            "fifo_sort_parameters: entries must be start_time, weight or pending_job_count (got ['size'])",
        ),
        (
            lambda: pool("p", resource_limits={"cpu": -1}),
            "resource_limits.cpu: must be between 0 and 1000000000000000000 (got -1)",
        ),
        (
            lambda: pool("p", resource_limits={"memory": "lots"}),
            "resource_limits.memory: must be bytes or a size such as 512GiB (got 'lots')",
        ),
        (  # the fair-share pass recurses per level: ~975 levels were an HTTP 500
            lambda: build(*(pool(f"p{i}", f"p{i - 1}" if i else None) for i in range(33))),
            "pool p32: parent: nests the pool deeper than 32 levels below the root (got 'p31')",
        ),
        (  # an alias repeats a subtree (and its names) without its text: refused at once,
            # before a walk that doubles with each line (here 2**40 pools)
            lambda: load_pool_tree("name: t\npools:\n  a0: &n0 {}\n" + "".join(
                f"  a{k}: &n{k} {{pools: {{x{k}: *n{k - 1}, y{k}: *n{k - 1}}}}}\n"
                for k in range(1, 41))),
            "pools.a2.pools.x2.pools.x1: pool names must be unique in tree 't' (got 'x1')",
        ),
        (
            lambda: load_pool_tree("name: t\npools: " + "".join(
                f"{{p{i}: {{pools: " for i in range(32)) + "{q: {}}" + "}}" * 32),
            "pools.p0.pools.p1.pools.p2.pools.p3.pools.p4.pools.p5.pools.p6.pools.p7.pools.p8."
            "pools.p9.pools.p10.pools.p11.pools.p12.pools.p13.pools.p14.pools.p15.pools.p16."
            "pools.p17.pools.p18.pools.p19.pools.p20.pools.p21.pools.p22.pools.p23.pools.p24."
            "pools.p25.pools.p26.pools.p27.pools.p28.pools.p29.pools.p30.pools.p31.pools.q: "
            "nests the pool deeper than 32 levels below the root (got 'q')",
        ),
        (  # int() reads at most 4,300 digits: a nameless ValueError, an HTTP 500 (a node's
            # resources; text in a pool's options is at most 4,096 characters)
            lambda: parse_resources("resources", {"memory": "9" * 5000 + "GiB"}),
            "resources.memory: must be between 0 and 1000000000000000000 "
            "(got '99999999999999999999...')",
        ),
        (
            lambda: pool("p", resource_limits={"memory": "9" * 5000 + "GiB"}),
            "resource_limits.memory: must be at most 4096 characters "
            "(got '99999999999999999999...')",
        ),
        (
            lambda: pool("p", fair_share_starvation_tolerance=1.5),
            "fair_share_starvation_tolerance: must be between 0 and 1 (got 1.5)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping(
                {"infer_weight_from_guarantees_share_multiplier": 0.5}
            ),
            "config.infer_weight_from_guarantees_share_multiplier: must be at least 1 (got 0.5)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping({"preemption_satisfaction_threshold": 0}),
            "config.preemption_satisfaction_threshold: must be positive (got 0)",
        ),
        (
            lambda: PoolTreeConfig.from_mapping({"node_tag_filter": "gpu &"}),
            "config.node_tag_filter: ends too early (got 'gpu &')",
        ),
        (  # the parser recurses: deeper, 1,024 characters would exhaust the stack
            lambda: PoolTreeConfig.from_mapping({"node_tag_filter": "!" * 64 + "(" * 1 + "a)"}),
            "config.node_tag_filter: nests ! and ( deeper than 64 (got '!!!!!!!!!!!!!!!!!!!!...')",
        ),
        (
            lambda: build(pool("p", config_presets=["missing"])),
            "pool p: config_presets: no such preset in the tree (got 'missing')",
        ),
        (
            lambda: PoolConfig.from_mapping(
                {"min_share_resources": {"cpu": 1}, "strong_guarantee_resources": {"cpu": 2}}
            ),
            "strong_guarantee_resources: strong_guarantee_resources is given twice (through an alias) (got {'cpu': 2})",
        ),
        (
            lambda: build(pool("p")).ephemeral_subpool("p", "alice"),
            "pool: does not have create_ephemeral_subpools (got 'p')",
        ),
        (
            lambda: load_pool_tree("name: t\nroots: {}"),
            "roots: unknown tree key (expected name, config, pools) (got {})",
        ),
        (
            lambda: load_pool_tree("name: t\npools:\n  a:\n    pools:\n      b: {weight: x}"),
            "pools.a.pools.b.weight: must be a number (got 'x')",
        ),
        (  # a key too, as written: it named a pool `90` (helper-85)
            lambda: load_pool_tree("name: t\npools:\n  1:30: {}"),
            "pools[\"1:30\"]: 1:30 is base 60 in YAML 1.1 (90): write 90, or '1:30' for text",
        ),
        (  # text, quoted: it was read as the number 100 (helper-85)
            lambda: load_pool_tree("name: t\npools:\n  a: {weight: '0100'}"),
            "pools.a.weight: must be a number (got '0100')",
        ),
        (  # and an option kept and served it as text
            lambda: load_pool_tree("name: t\nconfig: {fair_share_starvation_tolerance: '0.5'}"),
            "config.fair_share_starvation_tolerance: must be a number (got '0.5')",
        ),
    ],
)
def test_validation_messages(make: object, message: str) -> None:
    assert callable(make)
    with pytest.raises(InvalidInput) as raised:
        make()
    assert str(raised.value) == message


def test_changes_return_new_validated_trees() -> None:
    tree = build(pool("p", strong_guarantee_resources={"cpu": 10}))
    grown = tree.with_pool(pool("c", "p", strong_guarantee_resources={"cpu": 5}))
    assert grown.children("p") == ["c"] and tree.children("p") == []
    with pytest.raises(InvalidInput, match="has child pools"):
        grown.without_pool("p")
    assert grown.without_pool("c") == tree
    with pytest.raises(InvalidInput, match="main_resource 'gpu'"):
        grown.with_config(PoolTreeConfig(main_resource="gpu"))


@pytest.mark.parametrize(("pools", "moved", "parent"), [
    # The pool set sorts first or last, in a cycle of two or of three.
    ((("p", None), ("c", "p")), "p", "c"),
    ((("x", None), ("y", "x")), "x", "y"),
    ((("a", None), ("b", "a"), ("c", "b")), "a", "c"),
    ((("z", None), ("b", "z"), ("a", "b")), "z", "a"),
])
def test_a_cycle_names_the_pool_being_moved_and_its_new_parent(
    pools: tuple[tuple[str, str | None], ...], moved: str, parent: str
) -> None:
    """Before 2026-11-29 the walk started at the first name of the cycle: ``pool set p parent
    c`` was reported as ``pool c: parent: makes a cycle (got 'p')``."""
    tree = build(*(pool(name, up) for name, up in pools))
    with pytest.raises(InvalidInput, match=re.escape(
            f"pool {moved}: parent: makes a cycle (got {parent!r})")):
        tree.with_pool(pool(moved, parent))
