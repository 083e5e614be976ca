"""Pool trees (seed 003) as a service: nodes, trees, pools, operations and their jobs.

Like ``fairpool.scheduling``, each command is one write transaction: the change, then a pass
over every tree it touches (operation admission, fair share, the job plan; see
``fairpool.engine.jobs``), then the plan is stored -- so a command answers with the decision
already made. Reads compute the dynamic characteristics (fair / usage / demand share, dominant
resource, starvation) from the stored state; they never write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import yaml
from sqlalchemy import Connection

from fairpool.engine.fairshare import (
    ROOT,
    ElementKind,
    ElementShares,
    FairShareResult,
    compute_fair_share,
)
from fairpool.engine.jobs import (
    JobPlan,
    NodeState,
    OperationAdmission,
    OperationState,
    RunningJob,
    admit_operations,
    format_resources,
    plan_jobs,
)
from fairpool.errors import Conflict, InvalidInput, NotFound
from fairpool.frontends.trees import (
    ClusterNode,
    Pool,
    PoolConfig,
    PoolTree,
    PoolTreeConfig,
    load_pool_tree,
    matches_tag_filter,
    number,
    parse_resources,
    tree_resources,
)
from fairpool.store import trees as store
from fairpool.store.db import Database
from fairpool.store.tree_records import (
    JobStatus,
    NodeRecord,
    OperationRecord,
    OperationStatus,
    PoolTreeRecord,
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _moment(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _share(value: Fraction) -> float:
    return round(float(value), 6)


def _shares(values: Mapping[str, Fraction]) -> dict[str, float]:
    return {key: _share(value) for key, value in values.items()}


# -- views -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharesView:
    """An element's dynamic characteristics, as YTsaurus's Orchid shows them."""

    dominant_resource: str
    #: Dominant-resource values (a single number, as the UI shows it).
    fair_share: float
    usage_share: float
    demand_share: float
    #: usage / fair share on the dominant resource; None without a fair share.
    satisfaction: float | None
    weight: float
    starving: bool
    below_fair_share_since: str | None
    #: Per resource: strong_guarantee / weight_proportional / total fair share, usage, demand.
    detailed: dict[str, dict[str, float]]

    @classmethod
    def of(cls, element: ElementShares) -> SharesView:
        fair = element.dominant_fair_share
        starvation = element.starvation
        return cls(
            dominant_resource=element.dominant_resource,
            fair_share=_share(fair),
            usage_share=_share(element.dominant_usage_share),
            demand_share=_share(element.dominant_demand_share),
            satisfaction=_share(element.dominant_usage_share / fair) if fair else None,
            weight=_share(element.weight),
            starving=starvation is not None and starvation.status.value == "starving",
            below_fair_share_since=None
            if starvation is None
            else _iso(_moment(starvation.below_fair_share_since)),
            detailed={
                "strong_guarantee": _shares(element.fair_share.strong_guarantee),
                "weight_proportional": _shares(element.fair_share.weight_proportional),
                "fair_share": _shares(element.fair_share.total),
                "usage_share": _shares(element.usage_share),
                "demand_share": _shares(element.demand_share),
            },
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "dominant_resource": self.dominant_resource,
            "fair_share": self.fair_share,
            "usage_share": self.usage_share,
            "demand_share": self.demand_share,
            "satisfaction": self.satisfaction,
            "weight": self.weight,
            "starving": self.starving,
            "below_fair_share_since": self.below_fair_share_since,
            "detailed": self.detailed,
        }


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    tags: tuple[str, ...]
    resources: dict[str, int]
    #: The tree whose node_tag_filter selects it (a node belongs to at most one).
    tree: str | None
    running_jobs: int
    used: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tags": list(self.tags),
            "resources": self.resources,
            "tree": self.tree,
            "running_jobs": self.running_jobs,
            "used": self.used,
        }


@dataclass(frozen=True, slots=True)
class ElementRow:
    """One line of ``pool-tree show``: the root, a pool or an operation."""

    name: str
    kind: str
    depth: int
    shares: SharesView
    #: Pools: running / started operations in the subtree; operations: their status.
    running_operations: int | None
    operations: int | None
    status: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "depth": self.depth,
            **self.shares.as_dict(),
            "running_operations": self.running_operations,
            "operations": self.operations,
            "status": self.status,
        }


@dataclass(frozen=True, slots=True)
class TreeView:
    name: str
    default: bool
    #: The explicit options (YTsaurus's ``config`` attribute).
    config: dict[str, Any]
    resources: dict[str, int]
    nodes: tuple[str, ...]
    pools: int
    running_operations: int
    pending_operations: int
    #: ``pool-tree show``: the elements depth first; empty in lists.
    elements: tuple[ElementRow, ...] = ()
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "default": self.default,
            "config": self.config,
            "resources": self.resources,
            "nodes": list(self.nodes),
            "pools": self.pools,
            "running_operations": self.running_operations,
            "pending_operations": self.pending_operations,
            "elements": [row.as_dict() for row in self.elements],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    tree: str
    parent: str | None
    ephemeral: bool
    #: Options set on the pool itself.
    config: dict[str, Any]
    #: Resolved values: presets applied, inherited pool -> parent -> tree.
    effective: dict[str, Any]
    children: tuple[str, ...]
    running_operation_count: int
    operation_count: int
    shares: SharesView

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tree": self.tree,
            "parent": self.parent,
            "ephemeral": self.ephemeral,
            "config": self.config,
            "effective": self.effective,
            "children": list(self.children),
            "running_operation_count": self.running_operation_count,
            "operation_count": self.operation_count,
            **self.shares.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class PreemptedJobView:
    job: str
    node: str
    preempted_by: str | None
    reason: str | None
    at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "node": self.node,
            "preempted_by": self.preempted_by,
            "reason": self.reason,
            "at": _iso(self.at),
        }


@dataclass(frozen=True, slots=True)
class OperationView:
    id: str
    tree: str
    pool: str
    user: str
    status: str
    #: Why jobs (or the operation) are pending; None when nothing waits.
    reason: str | None
    job_resources: dict[str, int]
    job_count: int
    gang: bool
    weight: str
    resource_limits: dict[str, int]
    running_jobs: int
    pending_jobs: int
    #: Jobs per node.
    nodes: dict[str, int]
    preempted: tuple[PreemptedJobView, ...]
    shares: SharesView | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tree": self.tree,
            "pool": self.pool,
            "user": self.user,
            "status": self.status,
            "reason": self.reason,
            "job_resources": self.job_resources,
            "job_count": self.job_count,
            "gang": self.gang,
            "weight": self.weight,
            "resource_limits": self.resource_limits,
            "running_jobs": self.running_jobs,
            "pending_jobs": self.pending_jobs,
            "nodes": self.nodes,
            "preempted_jobs": len(self.preempted),
            "preempted": [job.as_dict() for job in self.preempted],
            # The operation's weight above is its own; the shares' copy would repeat it.
            **({} if self.shares is None else {
                key: value for key, value in self.shares.as_dict().items() if key != "weight"
            }),
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


@dataclass(frozen=True, slots=True)
class AppliedTree:
    """What ``pool-tree apply`` changed (nothing, when applied twice)."""

    tree: str
    changes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"tree": self.tree, "changes": list(self.changes)}


# -- one tree's stored state -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _State:
    """What a pass (or a read) of one tree loads."""

    record: PoolTreeRecord
    tree: PoolTree
    ephemeral_users: dict[str, str]
    pool_since: dict[str, float]
    nodes: tuple[NodeRecord, ...]
    operations: tuple[OperationRecord, ...]
    #: Running jobs per live operation.
    jobs: dict[str, tuple[RunningJob, ...]]

    @classmethod
    def load(cls, conn: Connection, name: str) -> _State:
        record = store.find_tree(conn, name)
        if record is None:
            raise NotFound(f"no pool tree {name!r}")
        pools = store.list_pools(conn, name)
        tree = PoolTree.build(
            name,
            PoolTreeConfig.from_mapping(record.config),
            [
                Pool(p.name, p.parent, PoolConfig.from_mapping(p.config),
                     p.ephemeral_user is not None)
                for p in pools
            ],
        )
        operations = tuple(store.list_operations(conn, name, store.LIVE))
        jobs: dict[str, list[RunningJob]] = {op.id: [] for op in operations}
        for job in store.jobs_of(conn, list(jobs), JobStatus.RUNNING):
            jobs[job.operation_id].append(RunningJob(job.id, job.node, job.started_at.timestamp()))
        return cls(
            record,
            tree,
            {p.name: p.ephemeral_user for p in pools if p.ephemeral_user is not None},
            {p.name: p.below_fair_share_since.timestamp() for p in pools
             if p.below_fair_share_since is not None},
            tuple(store.list_nodes(conn)),
            operations,
            {op_id: tuple(found) for op_id, found in jobs.items()},
        )

    @property
    def cluster_nodes(self) -> list[ClusterNode]:
        return [_cluster_node(n) for n in self.nodes
                if matches_tag_filter(self.tree.config.node_tag_filter, n.tags)]

    @property
    def total(self) -> dict[str, int]:
        return tree_resources(self.tree.config, self.cluster_nodes)

    def states(self, running: frozenset[str] | None = None) -> list[OperationState]:
        return [
            OperationState(
                id=op.id,
                pool=op.pool,
                job_resources=op.job_resources,
                job_count=op.job_count,
                gang=op.gang,
                running=op.status is OperationStatus.RUNNING if running is None
                else op.id in running,
                start_time=op.created_at.timestamp(),
                weight=Fraction(op.weight),
                resource_limits=op.resource_limits,
                jobs=self.jobs[op.id],
            )
            for op in self.operations
        ]

    def since(self) -> dict[tuple[ElementKind, str], float]:
        since = {(ElementKind.POOL, name): at for name, at in self.pool_since.items()}
        for op in self.operations:
            if op.below_fair_share_since is not None:
                since[(ElementKind.OPERATION, op.id)] = op.below_fair_share_since.timestamp()
        return since

    def fair_share(
        self, states: Sequence[OperationState], now: datetime
    ) -> FairShareResult:
        snapshot = self.tree.fair_share_snapshot(
            self.total, [state.fair_share_input() for state in states]
        )
        return compute_fair_share(
            snapshot, now=now.timestamp(), below_fair_share_since=self.since()
        )


@dataclass(frozen=True, slots=True)
class _Pass:
    admission: OperationAdmission
    plan: JobPlan
    #: After the plan: what views show and the next pass's starvation clock starts from.
    shares: FairShareResult


def _cluster_node(record: NodeRecord) -> ClusterNode:
    return ClusterNode(record.name, frozenset(record.tags), record.resources)


def _parse_value(field: str, text: str) -> object:
    """A value from the command line: YAML scalars and flow mappings (``10``, ``fifo``,
    ``{cpu: 100}``, ``true``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise InvalidInput(field, text, "not a valid value") from None


# -- the service -------------------------------------------------------------------------------


class TreesService:
    def __init__(self, db: Database, clock: Callable[[], datetime] = _utcnow) -> None:
        self.db = db
        self.clock = clock

    # -- nodes -------------------------------------------------------------------------------

    def add_node(
        self, name: str, tags: Sequence[str], resources: Mapping[str, object]
    ) -> NodeView:
        node = ClusterNode.create(name, tags, dict(resources))
        with self.db.write() as conn:
            if store.find_node(conn, node.name) is not None:
                raise Conflict(f"node {node.name} already exists")
            store.insert_node(conn, node.name, node.tags, node.resources, self.clock())
            self._check_node_membership(conn)
            self._pass_all(conn)
            return self._node_views(conn, node.name)[0]

    def list_nodes(self) -> list[NodeView]:
        with self.db.read() as conn:
            return self._node_views(conn)

    def remove_node(self, name: str) -> None:
        with self.db.write() as conn:
            running = store.running_jobs_on(conn, name)
            if running:
                raise Conflict(
                    f"node {name} runs {running} jobs; complete or abort their operations first"
                )
            store.delete_node(conn, name)
            self._pass_all(conn)

    def _node_views(self, conn: Connection, only: str | None = None) -> list[NodeView]:
        trees = [(t.name, PoolTreeConfig.from_mapping(t.config)) for t in store.list_trees(conn)]
        live = store.list_operations(conn, statuses=store.LIVE)
        resources = {op.id: op.job_resources for op in live}
        used: dict[str, dict[str, int]] = {}
        counts: dict[str, int] = {}
        for job in store.jobs_of(conn, list(resources), JobStatus.RUNNING):
            counts[job.node] = counts.get(job.node, 0) + 1
            target = used.setdefault(job.node, {})
            for key, amount in resources[job.operation_id].items():
                target[key] = target.get(key, 0) + amount
        views = []
        for node in store.list_nodes(conn):
            if only is not None and node.name != only:
                continue
            member = [name for name, config in trees
                      if matches_tag_filter(config.node_tag_filter, node.tags)]
            views.append(NodeView(node.name, node.tags, node.resources,
                                  member[0] if member else None, counts.get(node.name, 0),
                                  used.get(node.name, {})))
        return views

    def _check_node_membership(self, conn: Connection) -> None:
        """A node belongs to at most one tree (YTsaurus keeps trees' nodes disjoint)."""
        trees = [(t.name, PoolTreeConfig.from_mapping(t.config)) for t in store.list_trees(conn)]
        for node in store.list_nodes(conn):
            member = [name for name, config in trees
                      if matches_tag_filter(config.node_tag_filter, node.tags)]
            if len(member) > 1:
                raise InvalidInput(
                    "node_tag_filter", node.name,
                    f"node would belong to trees {' and '.join(member)}; make the trees' "
                    "filters select disjoint nodes",
                )

    # -- trees -------------------------------------------------------------------------------

    def create_tree(self, name: str, options: Mapping[str, object] | None = None) -> TreeView:
        """A new tree with ``options`` (tree config). The first tree becomes ``default_tree``."""
        config = dict(options or {})
        PoolTree.build(name, PoolTreeConfig.from_mapping(config), ())
        with self.db.write() as conn:
            self._insert_tree(conn, name, config)
            self._check_node_membership(conn)
            return self._tree_view(conn, name)

    def apply_tree(self, document: str, name: str | None = None) -> AppliedTree:
        """Create or update a whole tree from YAML (``name``, ``config``, nested ``pools``):
        pools not in the document are deleted (ephemeral pools stay). Applying the same
        document twice changes nothing the second time."""
        wanted = load_pool_tree(document)
        if name is not None and wanted.name != name:
            raise InvalidInput(
                "name", wanted.name, f"the file describes another tree than {name!r}"
            )
        raw = yaml.safe_load(document)
        config = dict(raw.get("config") or {})
        changes: list[str] = []
        with self.db.write() as conn:
            now = self.clock()
            record = store.find_tree(conn, wanted.name)
            if record is None:
                self._insert_tree(conn, wanted.name, config)
                changes.append(f"+ tree {wanted.name}")
            elif record.config != config:
                store.set_tree_config(conn, wanted.name, config, now)
                changes.append(f"~ tree {wanted.name}: config")
            current = PoolTree.build(wanted.name, wanted.config, ())
            ephemeral: dict[str, str] = {}
            if record is not None:
                state = _State.load(conn, wanted.name)
                current, ephemeral = state.tree, state.ephemeral_users
            merged = [*wanted.pools.values(),
                      *(current.pools[p] for p in ephemeral if p not in wanted.pools)]
            PoolTree.build(wanted.name, wanted.config, merged)
            live = store.count_live_operations(conn, wanted.name)
            for pool_name in sorted(set(current.pools) - set(wanted.pools) - set(ephemeral),
                                    key=lambda p: -len(current.ancestors(p))):
                if live.get(pool_name):
                    raise Conflict(f"pool {pool_name} has {live[pool_name]} started operations; "
                                   "it cannot be removed")
                store.delete_pool(conn, wanted.name, pool_name)
                changes.append(f"- pool {pool_name}")
            for pool_name in _parents_first(wanted):
                pool = wanted.pools[pool_name]
                before = current.pools.get(pool_name)
                if before == pool:
                    continue
                store.save_pool(conn, wanted.name, pool_name, pool.parent,
                                pool.config.to_mapping(), now)
                changes.append(f"{'~' if before else '+'} pool {pool_name}")
            self._check_node_membership(conn)
            self._pass(conn, wanted.name)
        return AppliedTree(wanted.name, tuple(changes))

    def _insert_tree(self, conn: Connection, name: str, config: Mapping[str, Any]) -> None:
        if store.find_tree(conn, name) is not None:
            raise Conflict(f"pool tree {name} already exists")
        store.insert_tree(conn, name, config, self.clock())
        if store.default_tree(conn) is None:
            store.set_default_tree(conn, name)

    def set_tree(self, name: str, option: str, value: str) -> TreeView:
        """Set one tree option (YTsaurus units: milliseconds), validated with every pool."""
        with self.db.write() as conn:
            state = _State.load(conn, name)
            config = {**state.record.config, option: _parse_value(option, value)}
            state.tree.with_config(PoolTreeConfig.from_mapping(config))
            store.set_tree_config(conn, name, config, self.clock())
            self._check_node_membership(conn)
            self._pass(conn, name)
            return self._tree_view(conn, name)

    def show_tree(self, name: str | None = None) -> TreeView:
        with self.db.read() as conn:
            return self._tree_view(conn, self._tree_name(conn, name), detailed=True)

    def list_trees(self) -> list[TreeView]:
        with self.db.read() as conn:
            return [self._tree_view(conn, t.name) for t in store.list_trees(conn)]

    def default_tree(self, name: str | None = None) -> str | None:
        """``//sys/pool_trees/@default_tree``: set it when ``name`` is given; the current one."""
        if name is None:
            with self.db.read() as conn:
                return store.default_tree(conn)
        with self.db.write() as conn:
            if store.find_tree(conn, name) is None:
                raise NotFound(f"no pool tree {name!r}")
            store.set_default_tree(conn, name)
            return name

    def reconcile(self, name: str | None = None) -> TreeView:
        """One pass by hand: promotions, grants and starvation preemption as of now."""
        with self.db.write() as conn:
            tree = self._tree_name(conn, name)
            self._pass(conn, tree)
            return self._tree_view(conn, tree, detailed=True)

    def _tree_name(self, conn: Connection, name: str | None) -> str:
        if name is not None:
            return name
        default = store.default_tree(conn)
        if default is None:
            raise InvalidInput("tree", None, "no tree given and no default_tree set")
        return default

    def _tree_view(self, conn: Connection, name: str, detailed: bool = False) -> TreeView:
        state = _State.load(conn, name)
        statuses = [op.status for op in state.operations]
        elements: tuple[ElementRow, ...] = ()
        warnings: tuple[str, ...] = ()
        if detailed:
            shares = state.fair_share(state.states(), self.clock())
            elements = tuple(_element_rows(state, shares))
            warnings = shares.warnings
        return TreeView(
            name=name,
            default=store.default_tree(conn) == name,
            config=state.record.config,
            resources=state.total,
            nodes=tuple(n.name for n in state.cluster_nodes),
            pools=len(state.tree.pools),
            running_operations=statuses.count(OperationStatus.RUNNING),
            pending_operations=statuses.count(OperationStatus.PENDING),
            elements=elements,
            warnings=warnings,
        )

    # -- pools -------------------------------------------------------------------------------

    def create_pool(
        self, tree: str, name: str, parent: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> PoolView:
        config = PoolConfig.from_mapping(dict(options or {}))
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            if name in state.tree.pools:
                raise Conflict(f"pool {name} already exists in tree {tree}")
            state.tree.with_pool(Pool(name, parent, config))
            store.save_pool(conn, tree, name, parent, config.to_mapping(), self.clock())
            self._pass(conn, tree)
            return self._pool_view(conn, tree, name)

    def set_pool(self, tree: str, name: str, option: str, value: str) -> PoolView:
        """Set one pool option (``parent`` moves it), validated with the whole tree."""
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            pool = self._own_pool(state, name)
            parsed = _parse_value(option, value)
            if option == "parent":
                parent = None if parsed in (None, ROOT) else str(parsed)
                changed = replace(pool, parent=parent)
            else:
                given = PoolConfig.from_mapping({option: parsed})
                changed = replace(pool, config=pool.config.updated(given))
            state.tree.with_pool(changed)
            store.save_pool(conn, tree, name, changed.parent, changed.config.to_mapping(),
                            self.clock())
            self._pass(conn, tree)
            return self._pool_view(conn, tree, name)

    def describe_pool(self, tree: str | None, name: str) -> PoolView:
        with self.db.read() as conn:
            return self._pool_view(conn, self._tree_name(conn, tree), name)

    def delete_pool(self, tree: str, name: str) -> None:
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            self._own_pool(state, name)
            started = store.count_live_operations(conn, tree).get(name, 0)
            if started:
                raise Conflict(f"pool {name} has {started} started operations; "
                               "complete or abort them first")
            state.tree.without_pool(name)
            store.delete_pool(conn, tree, name)
            self._pass(conn, tree)

    @staticmethod
    def _own_pool(state: _State, name: str) -> Pool:
        pool = state.tree.pools.get(name)
        if pool is None:
            raise NotFound(f"no pool {name!r} in tree {state.tree.name}")
        return pool

    def _pool_view(self, conn: Connection, tree: str, name: str) -> PoolView:
        state = _State.load(conn, tree)
        pool = self._own_pool(state, name)
        resolved = state.tree.effective[name]
        shares = state.fair_share(state.states(), self.clock())
        running, started = _operation_counts(state, name)
        return PoolView(
            name=name,
            tree=tree,
            parent=pool.parent,
            ephemeral=pool.is_ephemeral,
            config=pool.config.to_mapping(),
            effective={
                "mode": resolved.mode.value,
                "weight": _share(shares.pools[name].weight),
                "fifo_sort_parameters": [p.value for p in resolved.fifo_sort_parameters],
                "strong_guarantee_resources": dict(
                    resolved.config.strong_guarantee_resources
                ),
                "resource_limits": dict(resolved.config.resource_limits),
                "forbid_immediate_operations": resolved.forbid_immediate_operations,
                "create_ephemeral_subpools": resolved.create_ephemeral_subpools,
                "effective_max_operation_count": resolved.effective_max_operation_count,
                "effective_max_running_operation_count":
                    resolved.effective_max_running_operation_count,
                "effective_fair_share_starvation_timeout":
                    resolved.effective_fair_share_starvation_timeout,
                "effective_fair_share_starvation_tolerance": _share(
                    resolved.effective_fair_share_starvation_tolerance
                ),
                "effective_non_preemptible_resource_usage_threshold": dict(
                    resolved.effective_non_preemptible_resource_usage_threshold
                ),
            },
            children=tuple(state.tree.children(name)),
            running_operation_count=running,
            operation_count=started,
            shares=SharesView.of(shares.pools[name]),
        )

    # -- operations --------------------------------------------------------------------------

    def start_operation(
        self,
        *,
        user: str,
        job_resources: Mapping[str, object],
        job_count: int,
        tree: str | None = None,
        pool: str | None = None,
        weight: str | int | float = 1,
        gang: bool = False,
        resource_limits: Mapping[str, object] | None = None,
    ) -> OperationView:
        """Start an operation of ``job_count`` jobs: rejected (nothing written) when a
        ``max_operation_count`` is reached anywhere up to the root; else pending or running,
        with the jobs that fit granted at once."""
        weight_value = _weight(weight)
        if isinstance(job_count, bool) or not isinstance(job_count, int) or job_count < 1:
            raise InvalidInput("job_count", job_count, "must be a positive integer")
        job = parse_resources("job_resources", dict(job_resources))
        limits = parse_resources("resource_limits", dict(resource_limits or {}))
        with self.db.write() as conn:
            now = self.clock()
            state = _State.load(conn, self._tree_name(conn, tree))
            leaf, state = self._operation_pool(conn, state, pool or user, user, now)
            total = state.total
            if total.get("user_slots") and "user_slots" not in job:
                # YTsaurus counts a job's slot; only in trees whose nodes declare slots.
                job["user_slots"] = 1
            if not any(job.values()):
                raise InvalidInput("job_resources", dict(job_resources), "must ask for something")
            _check_some_node_fits(state, job)
            _check_operation_count(conn, state, leaf)
            operation_id = store.insert_operation(
                conn, tree=state.tree.name, pool=leaf, user=user, job_resources=job,
                job_count=job_count, gang=gang, weight=str(weight_value),
                resource_limits=limits, now=now,
            )
            result = self._pass(conn, state.tree.name)
            return self._operation_view(conn, store.get_operation(conn, operation_id), result)

    def _operation_pool(
        self, conn: Connection, state: _State, pool: str, user: str, now: datetime
    ) -> tuple[str, _State]:
        """The pool an operation runs in (YTsaurus's rules), made when it is ephemeral; and
        the state with it."""
        tree, config = state.tree, state.tree.config
        if pool == ROOT:
            if config.forbid_immediate_operations_in_root:
                raise InvalidInput("pool", pool, f"tree {tree.name} forbids operations in its "
                                   "root (forbid_immediate_operations_in_root)")
            return ROOT, state
        if pool in tree.pools:
            resolved = tree.effective[pool]
            if resolved.create_ephemeral_subpools:
                subpool = tree.ephemeral_subpool(pool, user)
                if subpool.name not in tree.pools:
                    state = self._add_ephemeral(conn, state, subpool, user, now)
                return subpool.name, state
            if resolved.forbid_immediate_operations:
                raise InvalidInput("pool", pool, "forbids operations directly in it "
                                   "(forbid_immediate_operations); use one of its subpools")
            return pool, state
        parent = None if config.default_parent_pool == ROOT else config.default_parent_pool
        if parent is not None and parent not in tree.pools:
            raise InvalidInput("default_parent_pool", parent, f"no such pool in tree {tree.name}")
        owned = sum(1 for owner in state.ephemeral_users.values() if owner == user)
        if owned >= config.max_ephemeral_pool_per_user:
            raise InvalidInput("pool", pool, f"no such pool, and user {user} already has {owned} "
                               "ephemeral pools (max_ephemeral_pool_per_user "
                               f"{config.max_ephemeral_pool_per_user})")
        return pool, self._add_ephemeral(conn, state, Pool(pool, parent, PoolConfig(), True),
                                         user, now)

    @staticmethod
    def _add_ephemeral(
        conn: Connection, state: _State, pool: Pool, user: str, now: datetime
    ) -> _State:
        """The state with ``pool`` made for ``user``."""
        tree = state.tree.with_pool(pool)
        store.save_pool(conn, state.tree.name, pool.name, pool.parent,
                        pool.config.to_mapping(), now, ephemeral_user=user)
        return replace(state, tree=tree,
                       ephemeral_users={**state.ephemeral_users, pool.name: user})

    def describe_operation(self, ref: str) -> OperationView:
        with self.db.read() as conn:
            return self._operation_view(conn, store.get_operation(conn, ref), None)

    def list_operations(
        self, tree: str | None = None, status: str | None = None
    ) -> list[OperationView]:
        statuses = None
        if status is not None:
            try:
                statuses = [OperationStatus(status)]
            except ValueError:
                raise InvalidInput("status", status, "must be one of "
                                   + ", ".join(s.value for s in OperationStatus)) from None
        with self.db.read() as conn:
            found = store.list_operations(conn, tree, statuses)
            return [self._operation_view(conn, op, None, shares=False) for op in found]

    def complete_operation(self, ref: str) -> OperationView:
        return self._end(ref, OperationStatus.COMPLETED, JobStatus.COMPLETED, "completed")

    def abort_operation(self, ref: str) -> OperationView:
        return self._end(ref, OperationStatus.ABORTED, JobStatus.ABORTED, "aborted by user")

    def _end(
        self, ref: str, status: OperationStatus, jobs: JobStatus, why: str
    ) -> OperationView:
        with self.db.write() as conn:
            now = self.clock()
            operation = store.get_operation(conn, ref)
            if operation.status.is_final:
                raise Conflict(f"operation {operation.id} is already {operation.status.value}")
            store.end_jobs(conn, operation.id, jobs, now)
            store.update_operation(conn, operation.id, now, status=status, status_reason=why,
                                   below_fair_share_since=None)
            self._drop_unused_ephemeral(conn, operation.tree, operation.pool)
            result = self._pass(conn, operation.tree)
            return self._operation_view(conn, store.get_operation(conn, operation.id), result)

    @staticmethod
    def _drop_unused_ephemeral(conn: Connection, tree: str, pool: str) -> None:
        """An ephemeral pool goes with its last started operation, as in YTsaurus."""
        records = {p.name: p for p in store.list_pools(conn, tree)}
        record = records.get(pool)
        if record is None or record.ephemeral_user is None:
            return
        if store.count_live_operations(conn, tree).get(pool):
            return
        if any(p.parent == pool for p in records.values()):
            return
        store.delete_pool(conn, tree, pool)

    def _operation_view(
        self,
        conn: Connection,
        operation: OperationRecord,
        result: _Pass | None,
        shares: bool = True,
    ) -> OperationView:
        jobs = store.jobs_of(conn, [operation.id])
        running = [j for j in jobs if j.status is JobStatus.RUNNING]
        nodes: dict[str, int] = {}
        for job in sorted(running, key=lambda j: j.node):  # by node name, whatever the row order
            nodes[job.node] = nodes.get(job.node, 0) + 1
        element = None
        if shares and not operation.status.is_final:
            if result is None:
                state = _State.load(conn, operation.tree)
                fair = state.fair_share(state.states(), self.clock())
            else:
                fair = result.shares
            element = SharesView.of(fair.operations[operation.id])
        return OperationView(
            id=operation.id,
            tree=operation.tree,
            pool=operation.pool,
            user=operation.user,
            status=operation.status.value,
            reason=operation.status_reason,
            job_resources=operation.job_resources,
            job_count=operation.job_count,
            gang=operation.gang,
            weight=operation.weight,
            resource_limits=operation.resource_limits,
            running_jobs=len(running),
            pending_jobs=0 if operation.status.is_final else operation.job_count - len(running),
            nodes=nodes,
            preempted=tuple(
                PreemptedJobView(j.id, j.node, j.preempted_by, j.reason, j.finished_at)
                for j in jobs if j.status is JobStatus.PREEMPTED
            ),
            shares=element,
            created_at=operation.created_at,
            started_at=operation.started_at,
            finished_at=operation.finished_at,
        )

    # -- the pass ----------------------------------------------------------------------------

    def _pass_all(self, conn: Connection) -> None:
        for record in store.list_trees(conn):
            self._pass(conn, record.name)

    def _pass(self, conn: Connection, name: str) -> _Pass:
        """Admission, fair share, job plan; store the plan and the starvation clocks."""
        now = self.clock()
        state = _State.load(conn, name)
        admission = admit_operations(state.tree, state.states())
        states = state.states(admission.running)
        before = state.fair_share(states, now)
        nodes = [
            NodeState(_cluster_node(n), _seconds(n.last_preemption_at)) for n in state.nodes
        ]
        plan = plan_jobs(state.tree, nodes, states, before, now.timestamp())
        for op_id in admission.promoted:
            store.update_operation(conn, op_id, now, status=OperationStatus.RUNNING,
                                   started_at=now)
        for preemption in plan.preemptions:
            store.preempt_job(conn, preemption.job, preemption.preemptor, preemption.reason, now)
        store.insert_jobs(conn, [(g.operation, g.node) for g in plan.grants], now)
        store.mark_preemption(conn, plan.preempted_nodes, now)
        # The shares after the plan: what the answer shows, and whose starvation clocks the
        # next pass continues (an operation the plan satisfied is no longer below its share).
        after = state.fair_share(_after(states, plan, now.timestamp()), now)
        for op in state.operations:
            wait = plan.waiting.get(op.id)
            reason = admission.pending.get(op.id) or (
                f"{wait.pending_jobs} jobs pending: {wait.reason}" if wait else None
            )
            starvation = after.operations[op.id].starvation
            since = _moment(starvation.below_fair_share_since) if starvation else None
            if (reason, since) != (op.status_reason, op.below_fair_share_since):
                store.update_operation(conn, op.id, now, status_reason=reason,
                                       below_fair_share_since=since)
        for pool_name, element in after.pools.items():
            starvation = element.starvation
            at = None if starvation is None else starvation.below_fair_share_since
            if at != state.pool_since.get(pool_name):
                store.set_pool_since(conn, name, pool_name, _moment(at))
        return _Pass(admission, plan, after)


def _after(states: Sequence[OperationState], plan: JobPlan, now: float) -> list[OperationState]:
    """The operations with the plan applied (ids of new jobs do not matter to fair share)."""
    preempted = {p.job for p in plan.preemptions}
    result = []
    for state in states:
        kept = tuple(job for job in state.jobs if job.id not in preempted)
        new = tuple(RunningJob(f"new-{i}", g.node, now)
                    for i, g in enumerate(plan.grants) if g.operation == state.id)
        result.append(replace(state, jobs=kept + new))
    return result


def _weight(value: str | int | float) -> Fraction:
    weight = number("weight", value)
    if weight <= 0:
        raise InvalidInput("weight", value, "must be positive")
    return weight


def _check_some_node_fits(state: _State, job: Mapping[str, int]) -> None:
    """Hard rejection: no node of the tree could ever hold one job."""
    nodes = state.cluster_nodes
    if any(all(a <= n.resources.get(k, 0) for k, a in job.items()) for n in nodes):
        return
    if not nodes:
        raise InvalidInput("tree", state.tree.name, "has no nodes (see its node_tag_filter)")
    for key, amount in sorted(job.items()):
        largest = max(n.resources.get(key, 0) for n in nodes)
        if amount > largest:
            raise InvalidInput(
                f"job_resources.{key}", amount,
                f"no node of tree {state.tree.name} has that much (largest: {largest})",
            )
    raise InvalidInput("job_resources", format_resources(job),
                       f"no single node of tree {state.tree.name} has all of it")


def _subtree_counts(state: _State, pool: str, per_pool: Mapping[str, int]) -> int:
    return sum(count for name, count in per_pool.items()
               if name != ROOT and pool in state.tree.ancestors(name))


def _check_operation_count(conn: Connection, state: _State, leaf: str) -> None:
    """``max_operation_count``, checked at every level up to the root: rejected, not queued."""
    per_pool = store.count_live_operations(conn, state.tree.name)
    pools = [] if leaf == ROOT else state.tree.ancestors(leaf)
    for pool in pools:
        started = _subtree_counts(state, pool, per_pool)
        limit = state.tree.effective[pool].effective_max_operation_count
        if started >= limit:
            raise InvalidInput(
                "pool", pool,
                f"has {started} started operations, its max_operation_count is {limit}",
            )
    started = sum(per_pool.values())
    if started >= state.tree.config.max_operation_count:
        raise InvalidInput(
            "tree", state.tree.name, f"has {started} started operations, its "
            f"max_operation_count is {state.tree.config.max_operation_count}",
        )


def _operation_counts(state: _State, pool: str) -> tuple[int, int]:
    """Running and started operations in the pool's subtree."""
    inside = [op for op in state.operations
              if op.pool != ROOT and pool in state.tree.ancestors(op.pool)]
    return sum(1 for op in inside if op.status is OperationStatus.RUNNING), len(inside)


def _parents_first(tree: PoolTree) -> list[str]:
    return sorted(tree.pools, key=lambda name: (len(tree.ancestors(name)), name))


def _element_rows(state: _State, shares: FairShareResult) -> list[ElementRow]:
    """The root, then each pool followed by its subtree and its operations."""
    rows = [ElementRow(ROOT, "root", 0, SharesView.of(shares.root),
                       sum(1 for op in state.operations if op.status is OperationStatus.RUNNING),
                       len(state.operations), None)]
    by_pool: dict[str, list[OperationRecord]] = {}
    for op in state.operations:
        by_pool.setdefault(op.pool, []).append(op)

    def operations(pool: str, depth: int) -> None:
        for op in by_pool.get(pool, []):
            rows.append(ElementRow(op.id, "operation", depth,
                                   SharesView.of(shares.operations[op.id]), None, None,
                                   op.status.value))

    def walk(parent: str | None, depth: int) -> None:
        for name in state.tree.children(parent):
            running, started = _operation_counts(state, name)
            rows.append(ElementRow(name, "pool", depth, SharesView.of(shares.pools[name]),
                                   running, started, None))
            walk(name, depth + 1)
            operations(name, depth + 1)

    walk(None, 1)
    operations(ROOT, 1)
    return rows
