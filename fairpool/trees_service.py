"""Pool trees (seed 003) as a service: nodes, trees, pools, operations and their jobs.

Like ``fairpool.scheduling``, each command is one write transaction: the change, then a pass
over every tree it touches (operation admission, fair share, the job plan; see
``fairpool.engine.jobs``), then the plan is stored -- so a command answers with the decision
already made. An operation may run in several trees (YTsaurus ``pool_trees``): it has a
placement (pool, weight, limits, running or pending) in each, and one pending-job count.
Reads compute the dynamic characteristics (fair / usage / demand share, dominant resource,
starvation) from the stored state; they never write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from sqlalchemy import Connection

from fairpool.engine.amounts import amount_text
from fairpool.engine.fairshare import (
    ROOT,
    ElementKind,
    ElementShares,
    FairShareResult,
    IntegralState,
    StarvationStatus,
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
from fairpool.engine.piecewise import ZERO
from fairpool.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    as_ref,
    counted,
    listed,
    mapping,
    one_of,
    string,
    validate_int,
)
from fairpool.frontends.names import MAX_NAME, bounded_text
from fairpool.frontends.pools import validate_filter, validate_name
from fairpool.frontends.trees import (
    EPHEMERAL_DELIMITER,
    MAX_OPTION_TEXT,
    NAME_PATTERN,
    ClusterNode,
    Pool,
    PoolConfig,
    PoolIntegralGuarantees,
    PoolTree,
    PoolTreeConfig,
    canonical_tree_options,
    load_pool_tree,
    matches_tag_filter,
    parse_resources,
    pool_tree_document,
    positive,
    stored_configs,
    tree_document,
    tree_option_name,
    tree_resources,
)
from fairpool.frontends.yaml_text import load_yaml
from fairpool.idempotency import Keyed
from fairpool.paging import Page, check_page
from fairpool.store import schema
from fairpool.store import trees as store
from fairpool.store.db import Database
from fairpool.store.tree_records import (
    IntegralRecord,
    JobRecord,
    JobStatus,
    NodeRecord,
    OperationRecord,
    OperationStatus,
    PlacementRecord,
    PoolTreeRecord,
)
from fairpool.views import OPERATION_STATUSES

#: Jobs of one operation: every pass (each command, each server's reconciler tick) plans and
#: stores each job, so one operation must not be able to stall whoever shares the store
#: (100k jobs: ~5 s a pass). The same for the embedded CLI as over HTTP: a store it wrote
#: may be served later.
MAX_JOB_COUNT = 10_000
#: Trees of one operation (YTsaurus pool_trees): each is a placement every pass plans; the
#: same embedded and over HTTP, which used to be the only one to cap them.
MAX_POOL_TREES = 16


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _moment(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _integral_settings(
    given: PoolIntegralGuarantees | None, tree: PoolTreeConfig
) -> dict[str, Any]:
    """A pool's integral_guarantees with every option resolved (the multiplier limit from the
    tree when the pool has none; free-volume distribution off unless asked for)."""
    integral = given or PoolIntegralGuarantees()
    limit = integral.relaxed_share_multiplier_limit
    return {
        "guarantee_type": integral.guarantee_type.value,
        "burst_guarantee_resources": dict(integral.burst_guarantee_resources),
        "resource_flow": dict(integral.resource_flow),
        "relaxed_share_multiplier_limit": _share(
            tree.integral_guarantees.relaxed_share_multiplier_limit if limit is None else limit
        ),
        "can_accept_free_volume": integral.can_accept_free_volume,
        "should_distribute_free_volume_among_children":
            bool(integral.should_distribute_free_volume_among_children),
    }


def _elapsed(since: datetime, now: datetime) -> Fraction:
    """Exact seconds from ``since`` to ``now``; 0 if the clock went back."""
    return max(Fraction((now - since) // timedelta(microseconds=1), 10**6), ZERO)


def _share(value: Fraction) -> float:
    return round(float(value), 6)


def _weight(value: Fraction) -> float:
    """A weight as a share is shown, to 6 decimals, but to 6 significant digits below 1:
    rounded as a share, 1e-12 showed as 0.0, which no weight may be."""
    return round(float(value), 6) if value >= 1 else float(f"{float(value):.6g}")


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
    #: Per resource: strong_guarantee / integral_guarantee / weight_proportional / total fair
    #: share, usage, demand.
    detailed: dict[str, dict[str, float]]
    #: Burst and relaxed pools: YTsaurus's Orchid integral fields; None elsewhere.
    integral: dict[str, Any] | None

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
            weight=_weight(element.weight),
            starving=starvation is not None and starvation.status.value == "starving",
            below_fair_share_since=None
            if starvation is None
            else _iso(_moment(starvation.below_fair_share_since)),
            detailed={
                "strong_guarantee": _shares(element.fair_share.strong_guarantee),
                "integral_guarantee": _shares(element.fair_share.integral_guarantee),
                "weight_proportional": _shares(element.fair_share.weight_proportional),
                "fair_share": _shares(element.fair_share.total),
                "usage_share": _shares(element.usage_share),
                "demand_share": _shares(element.demand_share),
            },
            integral=None if element.integral is None else _integral_view(element),
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
            "integral": self.integral,
        }


def _integral_view(element: ElementShares) -> dict[str, Any]:
    """An integral pool's Orchid fields (``accumulated_resource_volume`` in resource-seconds,
    ratio volumes in share-seconds), rounded like every share shown."""
    integral = element.integral
    assert integral is not None
    duration = integral.estimated_burst_usage_duration_seconds
    return {
        "integral_guarantee_type": integral.guarantee_type.value,
        "proposed_integral_share": _shares(element.proposed_integral_share),
        "specified_burst_ratio": _share(integral.specified_burst_ratio),
        "specified_resource_flow_ratio": _share(integral.specified_resource_flow_ratio),
        "total_burst_ratio": _share(integral.total_burst_ratio),
        "total_resource_flow_ratio": _share(integral.total_resource_flow_ratio),
        "accumulated_resource_volume": _shares(integral.accumulated_resource_volume),
        "accumulated_resource_ratio_volume": _share(integral.accumulated_resource_ratio_volume),
        "integral_pool_capacity": _share(integral.integral_pool_capacity),
        "estimated_burst_usage_duration_seconds": None if duration is None else _share(duration),
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
class InterruptingJobView:
    """A job chosen for preemption that keeps its units until ``deadline``."""

    job: str
    node: str
    preempted_by: str | None
    reason: str | None
    deadline: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "node": self.node,
            "preempted_by": self.preempted_by,
            "reason": self.reason,
            "deadline": _iso(self.deadline),
        }


@dataclass(frozen=True, slots=True)
class PlacementView:
    """An operation in one of its pool trees (YTsaurus computes an operation's dynamic
    characteristics per tree)."""

    tree: str
    pool: str
    weight: str
    resource_limits: dict[str, int]
    #: running / pending in this tree (while the operation is live), else its final status.
    status: str
    reason: str | None
    running_jobs: int
    shares: SharesView | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "tree": self.tree,
            "pool": self.pool,
            "weight": self.weight,
            "resource_limits": self.resource_limits,
            "status": self.status,
            "reason": self.reason,
            "running_jobs": self.running_jobs,
            **({} if self.shares is None else {
                key: value for key, value in self.shares.as_dict().items() if key != "weight"
            }),
        }


@dataclass(frozen=True, slots=True)
class OperationView:
    id: str
    #: Its trees and their pools, comma-separated in the order given (see ``trees``).
    tree: str
    pool: str
    user: str
    status: str
    #: Why jobs (or the operation) are pending; None when nothing waits.
    reason: str | None
    job_resources: dict[str, int]
    job_count: int
    gang: bool
    #: In its first tree (see ``trees`` for each).
    weight: str
    resource_limits: dict[str, int]
    interruptible: bool
    running_jobs: int
    pending_jobs: int
    #: Running jobs per node.
    nodes: dict[str, int]
    interrupting: tuple[InterruptingJobView, ...]
    preempted: tuple[PreemptedJobView, ...]
    #: In its tree; None when it has several (see ``trees``) or has ended.
    shares: SharesView | None
    trees: tuple[PlacementView, ...]
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
            "interruptible": self.interruptible,
            "running_jobs": self.running_jobs,
            "pending_jobs": self.pending_jobs,
            "nodes": self.nodes,
            "interrupting_jobs": len(self.interrupting),
            "interrupting": [job.as_dict() for job in self.interrupting],
            "preempted_jobs": len(self.preempted),
            "preempted": [job.as_dict() for job in self.preempted],
            # The operation's weight above is its own; the shares' copy would repeat it.
            **({} if self.shares is None else {
                key: value for key, value in self.shares.as_dict().items() if key != "weight"
            }),
            "trees": [placement.as_dict() for placement in self.trees],
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
    #: Integral pools' state after the last pass.
    integral: dict[str, IntegralRecord]
    nodes: tuple[NodeRecord, ...]
    #: Live operations with a placement in this tree.
    operations: tuple[OperationRecord, ...]
    #: Live jobs in this tree per live operation.
    jobs: dict[str, tuple[RunningJob, ...]]
    #: Live jobs per live operation in its other trees (not pending here).
    elsewhere: dict[str, int]

    @classmethod
    def load(cls, conn: Connection, name: str) -> _State:
        record = store.find_tree(conn, name)
        if record is None:
            raise NotFound.of("pool tree", name)
        pools = store.list_pools(conn, name)
        with stored_configs():
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
        elsewhere = dict.fromkeys(jobs, 0)
        for job in store.jobs_of(conn, list(jobs), live=True):
            if job.tree != name:
                elsewhere[job.operation_id] += 1
                continue
            interrupting = job.status is JobStatus.INTERRUPTING
            jobs[job.operation_id].append(RunningJob(
                job.id, job.node, job.started_at.timestamp(),
                interrupted_for=job.preempted_by if interrupting else None,
                interrupt_deadline=_seconds(job.interrupt_deadline) if interrupting else None,
            ))
        return cls(
            record,
            tree,
            {p.name: p.ephemeral_user for p in pools if p.ephemeral_user is not None},
            {p.name: p.below_fair_share_since.timestamp() for p in pools
             if p.below_fair_share_since is not None},
            {p.name: p.integral for p in pools if p.integral is not None},
            tuple(store.list_nodes(conn)),
            operations,
            {op_id: tuple(found) for op_id, found in jobs.items()},
            elsewhere,
        )

    def placement(self, op: OperationRecord) -> PlacementRecord:
        return op.placement(self.record.name)

    @property
    def cluster_nodes(self) -> list[ClusterNode]:
        return [_cluster_node(n) for n in self.nodes
                if matches_tag_filter(self.tree.config.node_tag_filter, n.tags)]

    @property
    def total(self) -> dict[str, int]:
        return tree_resources(self.tree.config, self.cluster_nodes)

    def states(self, running: frozenset[str] | None = None) -> list[OperationState]:
        total = self.total
        states = []
        for op in self.operations:
            placement = self.placement(op)
            states.append(OperationState(
                id=op.id,
                pool=placement.pool,
                job_resources=_job_in(op.job_resources, total),
                job_count=op.job_count,
                gang=op.gang,
                running=placement.running if running is None else op.id in running,
                start_time=op.created_at.timestamp(),
                weight=Fraction(placement.weight),
                resource_limits=placement.resource_limits,
                jobs=self.jobs[op.id],
                interruptible=op.interruptible,
                elsewhere=self.elsewhere[op.id],
            ))
        return states

    def since(self) -> dict[tuple[ElementKind, str], float]:
        since = {(ElementKind.POOL, name): at for name, at in self.pool_since.items()}
        for op in self.operations:
            at = self.placement(op).below_fair_share_since
            if at is not None:
                since[(ElementKind.OPERATION, op.id)] = at.timestamp()
        return since

    def integral_states(self, now: datetime | None = None) -> dict[str, IntegralState]:
        """The stored integral states; with ``now``, each with the time elapsed since it was
        stored (the pass refills and consumes the volume over it), else with none (a read)."""
        return {
            name: IntegralState(
                record.volume,
                record.share_ratio,
                ZERO if now is None else _elapsed(record.updated_at, now),
            )
            for name, record in self.integral.items()
        }

    def fair_share(
        self,
        states: Sequence[OperationState],
        now: datetime,
        integral: Mapping[str, IntegralState] | None = None,
    ) -> FairShareResult:
        """``integral``: the integral pools' states (default: as stored, nothing elapsed)."""
        snapshot = self.tree.fair_share_snapshot(
            self.total,
            [state.fair_share_input() for state in states],
            self.integral_states() if integral is None else integral,
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
    #: Other trees of operations whose jobs this pass changed.
    stale: frozenset[str]


def _job_in(job: Mapping[str, int], total: Mapping[str, int]) -> dict[str, int]:
    """One job's resources in a tree: ``user_slots`` counts only where the nodes declare it
    (an operation in several trees asks for a slot if any of them has slots)."""
    return {key: amount for key, amount in job.items() if key != "user_slots" or key in total}


def _tree_configs(conn: Connection) -> list[tuple[str, PoolTreeConfig]]:
    """Every tree's name and options, as stored."""
    with stored_configs():
        return [(t.name, PoolTreeConfig.from_mapping(t.config)) for t in store.list_trees(conn)]


def _still_started(what: str, started: Sequence[OperationRecord]) -> Conflict:
    """A tree or pool that cannot go while operations are started in it, naming them."""
    return Conflict(
        f"{what} has {counted(len(started), 'started operation')} "
        f"({', '.join(op.id for op in started[:5])}{', ...' if len(started) > 5 else ''}): "
        "complete or abort them first"
    )


def _option_value(option: str, text: str, field: str = "") -> object:
    """An option's value from its command-line text (``10``, ``{cpu: 100}``), as YAML;
    ``field``: its name in errors, as the rest of its checks name it (the option's own)."""
    bounded_text("option", option, MAX_NAME)
    return load_yaml(field or option, bounded_text("value", text, MAX_OPTION_TEXT), text)


def _decimal_text(weight: Fraction) -> str:
    """A weight as a decimal ("0.1", as given; it was shown "1/10"): it was read from one, so
    it has an exact one; 200 digits hold any within 1e-30 to 1e30 written in 64 characters."""
    with localcontext(prec=200):
        return format(Decimal(weight.numerator) / weight.denominator, "f")


def _declared_parent(state: _State, parent: str | None) -> None:
    """A declared pool never sits under an ephemeral one (YTsaurus keeps those out of
    Cypress): the ephemeral pool goes with its last operation, which its child would stop."""
    if parent in state.ephemeral_users:
        raise InvalidInput("parent", parent, f"is user {state.ephemeral_users[parent]}'s "
                           "ephemeral pool, gone with its last operation; name it in the "
                           "tree's document (pool-tree apply) to keep it")


def _check_late_rules(before: PoolTree, after: PoolTree) -> None:
    """No change brings a problem of ``PoolTree.late_rule_problems``. One stored before its
    rule is not held against other changes: an ephemeral default_parent_pool now means the
    root, and a fifo one refuses the operations that would need it, naming it; a guarantee
    its parent lacks is scaled as before."""
    stored = {str(problem) for problem in before.late_rule_problems()}
    for problem in after.late_rule_problems():
        if str(problem) not in stored:
            raise problem


def _user_as_pool(user: str) -> str:
    """The pool of an operation given none: the user's name, which must then be a pool's
    (the error names the user, which the caller gave, not the pool, which it did not)."""
    if not NAME_PATTERN.fullmatch(user):
        raise InvalidInput("user", user, "used as the pool name (no --pool), must match "
                           f"{NAME_PATTERN.pattern}")
    return user


def _cluster_node(record: NodeRecord) -> ClusterNode:
    return ClusterNode(record.name, frozenset(record.tags), record.resources)


# -- the service -------------------------------------------------------------------------------


class TreesService:
    def __init__(self, db: Database, clock: Callable[[], datetime] = _utcnow) -> None:
        self.db = db
        self.clock = clock

    # -- nodes -------------------------------------------------------------------------------

    def add_node(
        self, name: str, tags: Sequence[str], resources: Mapping[str, object]
    ) -> NodeView:
        node = ClusterNode.create(name, tags, resources)
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
            running = store.live_jobs_on(conn, as_ref(name))
            if running:
                raise Conflict(
                    f"node {name} runs {counted(running, 'job')}; complete or abort their "
                    "operations first"
                )
            store.delete_node(conn, name)
            self._pass_all(conn)

    def _node_views(self, conn: Connection, only: str | None = None) -> list[NodeView]:
        trees = _tree_configs(conn)
        live = store.list_operations(conn, statuses=store.LIVE)
        resources = {op.id: op.job_resources for op in live}
        nodes = store.list_nodes(conn)
        capacity = {node.name: node.resources for node in nodes}
        used: dict[str, dict[str, int]] = {}
        counts: dict[str, int] = {}
        for job in store.jobs_of(conn, list(resources), live=True):
            counts[job.node] = counts.get(job.node, 0) + 1
            target = used.setdefault(job.node, {})
            # A node without user_slots is in a tree without them: the job took none there.
            job_here = _job_in(resources[job.operation_id], capacity.get(job.node, {}))
            for key, amount in job_here.items():
                target[key] = target.get(key, 0) + amount
        views = []
        for node in nodes:
            if only is not None and node.name != only:
                continue
            member = [name for name, config in trees
                      if matches_tag_filter(config.node_tag_filter, node.tags)]
            views.append(NodeView(node.name, node.tags, node.resources,
                                  member[0] if member else None, counts.get(node.name, 0),
                                  used.get(node.name, {})))
        return views

    def _check_node_membership(self, conn: Connection) -> None:
        """A node belongs to at most one tree (YTsaurus keeps trees' nodes disjoint), and
        to the tree of the jobs it runs: a filter that let go of a node with jobs on it let
        another tree place jobs there too, past the node's resources."""
        trees = _tree_configs(conn)
        jobs = store.live_job_trees(conn)
        for node in store.list_nodes(conn):
            member = [name for name, config in trees
                      if matches_tag_filter(config.node_tag_filter, node.tags)]
            if len(member) > 1:
                raise InvalidInput(
                    "node_tag_filter", node.name,
                    f"node would belong to trees {' and '.join(member)}; make the trees' "
                    "filters select disjoint nodes",
                )
            for tree, count in sorted(jobs.get(node.name, {}).items()):
                if tree not in member:
                    raise Conflict(
                        f"node {node.name} runs {counted(count, 'job')} of tree {tree}, whose "
                        "node_tag_filter would no longer select it: complete or abort their "
                        "operations first"
                    )

    # -- trees -------------------------------------------------------------------------------

    def create_tree(self, name: str, options: Mapping[str, object] | None = None) -> TreeView:
        """A new tree with ``options`` (tree config). The first tree becomes ``default_tree``."""
        config = {} if options is None else dict(mapping("options", options))
        PoolTree.build(string("name", name), PoolTreeConfig.from_mapping(config), ())
        with self.db.write() as conn:
            self._insert_tree(conn, name, config)
            self._check_node_membership(conn)
            return self._tree_view(conn, name)

    def apply_tree(
        self, document: str, name: str | None = None, create: bool = False
    ) -> AppliedTree:
        """Create or update a whole tree from YAML (``name``, ``config``, nested ``pools``):
        pools not in the document are deleted (ephemeral pools stay; one the document names
        becomes a declared pool). Applying the same document twice changes nothing the
        second time. ``create`` (``pool-tree create --config-file``): refused, as a create
        is, when the tree exists."""
        string("document", document)
        wanted = load_pool_tree(document, None if name is None else string("name", name))
        if name is not None and wanted.name != name:
            raise InvalidInput(
                "name", wanted.name, f"the file describes another tree than {name!r}"
            )
        config = dict(tree_document(document).get("config") or {})
        changes: list[str] = []
        with self.db.write() as conn:
            now = self.clock()
            record = store.find_tree(conn, wanted.name)
            current = PoolTree.build(wanted.name, wanted.config, ())
            ephemeral: dict[str, str] = {}
            if record is not None:  # as stored: before the new config is
                state = _State.load(conn, wanted.name)
                current, ephemeral = state.tree, state.ephemeral_users
            if record is None or create:
                self._insert_tree(conn, wanted.name, config)
                changes.append(f"+ tree {wanted.name}")
            elif record.config != config:
                store.set_tree_config(conn, wanted.name, config, now)
                changes.append(f"~ tree {wanted.name}: config")
            merged = [*wanted.pools.values(),
                      *(current.pools[p] for p in ephemeral if p not in wanted.pools)]
            _check_late_rules(current, PoolTree.build(wanted.name, wanted.config, merged))
            live = store.count_live_operations(conn, wanted.name)
            removed = sorted(set(current.pools) - set(wanted.pools) - set(ephemeral),
                             key=lambda p: (-len(current.ancestors(p)), p))
            for pool_name in removed:
                if live.get(pool_name):
                    raise Conflict(f"pool {pool_name} has "
                                   f"{counted(live[pool_name], 'started operation')}; "
                                   "it cannot be removed")
            changes.extend(f"- pool {pool_name}" for pool_name in removed)
            # New and moved pools are saved (parents first) before the removed ones go (leaves
            # first): a kept pool leaves a removed parent before that parent is deleted, and
            # no statement leaves a pool without its parent (the foreign key is checked per
            # statement, on SQLite as on PostgreSQL).
            for pool_name in wanted.parents_first():
                pool = wanted.pools[pool_name]
                before = current.pools.get(pool_name)
                if before == pool:
                    continue
                store.save_pool(conn, wanted.name, pool_name, pool.parent,
                                pool.config.to_mapping(), now)
                if pool_name in ephemeral:  # declared by the file: it stays
                    store.keep_pool(conn, wanted.name, pool_name)
                changes.append(f"{'~' if before else '+'} pool {pool_name}")
            for pool_name in removed:
                store.delete_pool(conn, wanted.name, pool_name)
            self._check_node_membership(conn)
            self._passes(conn, [wanted.name])
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
            config = canonical_tree_options(state.record.config)
            parsed = _option_value(option, value, f"config.{option}")
            if parsed is None:  # null: unset, back to the default
                config.pop(tree_option_name(option), None)
            else:
                config.update(canonical_tree_options({option: parsed}))
            _check_late_rules(state.tree,
                                     state.tree.with_config(PoolTreeConfig.from_mapping(config)))
            store.set_tree_config(conn, name, config, self.clock())
            self._check_node_membership(conn)
            self._passes(conn, [name])
            return self._tree_view(conn, name)

    def delete_tree(self, name: str) -> None:
        """Delete a tree with its pools; refused while operations are started in it. Ended
        operations lose their history in it (an operation that ran only there is gone)."""
        with self.db.write() as conn:
            state = _State.load(conn, name)
            if state.operations:
                raise _still_started(f"pool tree {name}", state.operations)
            store.delete_tree(conn, name, state.tree.parents_first()[::-1])

    def show_tree(self, name: str | None = None) -> TreeView:
        with self.db.read() as conn:
            return self._tree_view(conn, self._tree_name(conn, name), detailed=True)

    def export_tree(self, name: str | None = None) -> dict[str, object]:
        """The tree as a document ``apply_tree`` takes (``pool-tree export``): applied, it
        changes nothing; edited, it is the tree's next version."""
        with self.db.read() as conn:
            state = _State.load(conn, self._tree_name(conn, name))
            return pool_tree_document(state.tree, state.record.config, state.ephemeral_users)

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
                raise NotFound.of("pool tree", name)
            store.set_default_tree(conn, name)
            return name

    def reconcile(self, name: str | None = None) -> TreeView:
        """One pass by hand: promotions, grants and starvation preemption as of now."""
        with self.db.write() as conn:
            tree = self._tree_name(conn, name)
            self._passes(conn, [tree])
            return self._tree_view(conn, tree, detailed=True)

    def tick(self, name: str) -> bool:
        """The server's pass over a tree each second (whether it passed): only where time
        alone can change a decision (``store.time_acts_on``: waiting operations, interrupted
        jobs, integral pools). Every write that changes a tree passes over it itself. A pass
        over a large tree with nothing waiting took seconds of the writer's lock, each
        second (helper-79)."""
        with self.db.read() as conn:
            if not store.time_acts_on(conn, name):
                return False
        with self.db.write() as conn:
            self._passes(conn, [name])
        return True

    def _tree_name(self, conn: Connection, name: str | None) -> str:
        if name is not None:
            return name
        default = store.default_tree(conn)
        if default is None:
            raise InvalidInput.no_tree(trees=bool(store.list_trees(conn)))
        return default

    def _tree_view(self, conn: Connection, name: str, detailed: bool = False) -> TreeView:
        state = _State.load(conn, name)
        running = sum(1 for op in state.operations if state.placement(op).running)
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
            running_operations=running,
            pending_operations=len(state.operations) - running,
            elements=elements,
            warnings=warnings,
        )

    # -- pools -------------------------------------------------------------------------------

    def create_pool(
        self, tree: str, name: str, parent: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> PoolView:
        string("name", name)  # before the tree is looked up, as the API's check is
        if parent is not None:
            string("parent", parent)
        config = PoolConfig.from_mapping({} if options is None else mapping("options", options))
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            if name in state.tree.pools:
                raise Conflict(f"pool {name} already exists in tree {tree}")
            _declared_parent(state, parent)
            _check_late_rules(state.tree, state.tree.with_pool(Pool(name, parent, config)))
            store.save_pool(conn, tree, name, parent, config.to_mapping(), self.clock())
            self._passes(conn, [tree])
            return self._pool_view(conn, tree, name)

    def set_pool(self, tree: str, name: str, option: str, value: str) -> PoolView:
        """Set one pool option (``parent`` moves it), validated with the whole tree."""
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            pool = self._own_pool(state, name)
            parsed = _option_value(option, value)
            if option == "parent":
                if name in state.ephemeral_users:  # pool$user out of its pool would escape it
                    raise InvalidInput("parent", parsed, f"pool {name} is ephemeral: it stays "
                                       "where its operations made it")
                parent = None if parsed in (None, ROOT) else str(parsed)
                _declared_parent(state, parent)
                changed = replace(pool, parent=parent)
            elif parsed is None:  # null: unset, inherited or default again
                changed = replace(pool, config=pool.config.without(option))
            else:
                given = PoolConfig.from_mapping({option: parsed})
                changed = replace(pool, config=pool.config.updated(given))
            _check_late_rules(state.tree, state.tree.with_pool(changed))
            store.save_pool(conn, tree, name, changed.parent, changed.config.to_mapping(),
                            self.clock())
            self._passes(conn, [tree])
            return self._pool_view(conn, tree, name)

    def describe_pool(self, tree: str | None, name: str) -> PoolView:
        with self.db.read() as conn:
            return self._pool_view(conn, self._tree_name(conn, tree), name)

    def delete_pool(self, tree: str, name: str) -> None:
        as_ref(name)  # refused before the tree is looked up, as over HTTP
        with self.db.write() as conn:
            state = _State.load(conn, tree)
            self._own_pool(state, name)
            started = [op for op in state.operations if state.placement(op).pool == name]
            if started:
                raise _still_started(f"pool {name}", started)
            state.tree.without_pool(name)
            store.delete_pool(conn, tree, name)
            self._passes(conn, [tree])

    @staticmethod
    def _own_pool(state: _State, name: str) -> Pool:
        pool = state.tree.pools.get(as_ref(name))
        if pool is None:
            raise NotFound.of("pool", name, f" in tree {state.tree.name}")
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
                "weight": _weight(shares.pools[name].weight),
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
                "integral_guarantees": _integral_settings(
                    resolved.config.integral_guarantees, state.tree.config
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
        trees: Sequence[str] = (),
        pool: str | None = None,
        weight: str | int | float = 1,
        gang: bool = False,
        resource_limits: Mapping[str, object] | None = None,
        interruptible: bool = False,
        tree_options: Mapping[str, object] | None = None,
        created_by: str | None = None,
        idempotency_key: str | None = None,
    ) -> OperationView:
        """Start an operation of ``job_count`` jobs in ``trees`` (YTsaurus ``pool_trees``;
        none: the default_tree), with ``pool`` / ``weight`` / ``resource_limits`` in each
        unless ``tree_options`` (YTsaurus ``scheduling_options_per_pool_tree``) says otherwise
        for a tree. Rejected (nothing written) when a ``max_operation_count`` is reached
        anywhere up to the root of any of its trees; else pending or running in each tree,
        with the jobs that fit granted at once. ``created_by``: the API token it was started
        with. ``idempotency_key``: when an operation was started with it already, that
        operation is answered and nothing is made."""
        validate_name("user", user)
        if pool is not None:
            bounded_text("pool", pool, MAX_NAME)
        weight_value = positive("weight", weight, text=True)  # --weight's, as given
        validate_int("job_count", job_count, 1, MAX_JOB_COUNT)
        job = parse_resources("job_resources", job_resources)
        limits = parse_resources(
            "resource_limits", {} if resource_limits is None else resource_limits)
        tree_names = listed("trees", trees)
        options = _parse_tree_options(tree_options)
        key = Keyed.of(idempotency_key, {
            "user": user, "job": job, "job_count": job_count, "trees": tree_names,
            "pool": pool, "weight": weight_value, "gang": gang, "limits": limits,
            "interruptible": interruptible, "options": options,
        })
        with self.db.write() as conn:
            made = key.made(conn, schema.tree_operation, "an operation", created_by)
            if made is not None:
                return self._operation_view(conn, store.get_operation(conn, made), {})
            now = self.clock()
            names = tree_names or [self._tree_name(conn, None)]
            _check_trees(names, options)
            states = {name: _State.load(conn, name) for name in names}
            if any(s.total.get("user_slots") for s in states.values()) and "user_slots" not in job:
                # YTsaurus counts a job's slot; only in trees whose nodes declare slots.
                job["user_slots"] = 1
            if not any(job.values()):
                raise InvalidInput("job_resources", dict(job_resources), "must ask for something")
            placements = []
            for name in names:
                given = options.get(name, _TreeOptions())
                # "" is no pool's name, not "none given"
                asked = given.pool if given.pool is not None else pool
                leaf, state = self._operation_pool(
                    conn, states[name], _user_as_pool(user) if asked is None else asked, user,
                    now,
                )
                _check_some_node_fits(state, _job_in(job, state.total))
                _check_operation_count(conn, state, leaf)
                placements.append(store.Placement(
                    name, leaf, _decimal_text(given.weight or weight_value),
                    limits if given.resource_limits is None else given.resource_limits,
                ))
            operation_id = store.insert_operation(
                conn, user=user, job_resources=job, job_count=job_count, gang=gang,
                interruptible=interruptible, placements=placements, now=now,
                created_by=created_by, idempotency=key.columns,
            )
            results = self._passes(conn, names)
            return self._operation_view(conn, store.get_operation(conn, operation_id), results)

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
            # Not in an ephemeral pool (a setting stored before 2026-11-29): it would live on.
            if resolved.create_ephemeral_subpools and not resolved.is_ephemeral:
                subpool = tree.ephemeral_subpool(pool, user)
                if subpool.name not in tree.pools:
                    state = self._add_ephemeral(conn, state, subpool, user, now)
                return subpool.name, state
            if resolved.forbid_immediate_operations:
                raise InvalidInput("pool", pool, f"forbids operations directly in it in tree "
                                   f"{tree.name} (forbid_immediate_operations); use one of "
                                   "its subpools")
            return pool, state
        ephemeral = tree.ephemeral_pool(pool)
        # Pools made under default_parent_pool, as YTsaurus counts them: a pool$user subpool
        # of a create_ephemeral_subpools pool is not one (it took the user's only one).
        owned = sum(1 for name, owner in state.ephemeral_users.items()
                    if owner == user and EPHEMERAL_DELIMITER not in name)
        if owned >= config.max_ephemeral_pool_per_user:
            raise InvalidInput("pool", pool, f"no such pool in tree {tree.name}, and user {user} "
                               f"already has {counted(owned, 'ephemeral pool')} there "
                               "(max_ephemeral_pool_per_user "
                               f"{config.max_ephemeral_pool_per_user})")
        return pool, self._add_ephemeral(conn, state, ephemeral, user, now)

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
            return self._operation_view(conn, store.get_operation(conn, ref), {})

    def list_operations(
        self, tree: str | None = None, status: str | None = None
    ) -> list[OperationView]:
        """Every operation the filters match, oldest first (``operation_page``)."""
        return list(self.operation_page(tree, status).items)

    def operation_page(
        self,
        tree: str | None = None,
        status: str | None = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        after: str | None = None,
        created_by: str | None = None,
    ) -> Page[OperationView]:
        """Operations ``offset`` to ``offset + limit`` (``limit`` None: to the end), after
        the cursor ``after`` if given, of those placed in ``tree``, with ``status``, started
        with token ``created_by``; oldest first, and how many match."""
        statuses = None
        if status is not None:
            statuses = [OperationStatus(one_of("status", status, OPERATION_STATUSES))]
        validate_filter("tree", tree)
        cursor = check_page(limit, offset, after)
        with self.db.read() as conn:
            if tree is not None and store.find_tree(conn, tree) is None:
                raise NotFound.of("pool tree", tree)  # not an empty list: a typo is said
            found, total, end = store.operation_page(
                conn, tree, statuses, created_by, limit=limit, offset=offset, after=cursor
            )
            jobs: dict[str, list[JobRecord]] = {op.id: [] for op in found}
            for job in store.jobs_of(conn, list(jobs)):  # one query for the page, not one each
                jobs[job.operation_id].append(job)
            views = tuple(self._operation_view(conn, op, {}, shares=False, jobs=jobs[op.id])
                          for op in found)
        return Page(views, total, limit, offset, str(end) if end else None)

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
            store.update_operation(conn, operation.id, now, status=status, status_reason=why)
            for placement in operation.placements:
                store.update_placement(conn, operation.id, placement.tree, running=False,
                                       reason=None, below_fair_share_since=None)
                self._drop_unused_ephemeral(conn, placement.tree, placement.pool)
            results = self._passes(conn, [p.tree for p in operation.placements])
            return self._operation_view(conn, store.get_operation(conn, operation.id), results)

    @staticmethod
    def _drop_unused_ephemeral(conn: Connection, tree: str, pool: str) -> None:
        """An ephemeral pool goes with its last started operation, as in YTsaurus; then so
        does an ephemeral parent it was the last user of (an ephemeral pool under another
        was made before 2026-11-29: the parent stayed, counted against its user)."""
        records = {p.name: p for p in store.list_pools(conn, tree)}
        live = store.count_live_operations(conn, tree)
        current: str | None = pool
        while current is not None:
            record = records.get(current)
            if record is None or record.ephemeral_user is None or live.get(current):
                return
            if any(p.parent == current for p in records.values()):
                return
            store.delete_pool(conn, tree, current)
            del records[current]
            current = record.parent

    def _operation_view(
        self,
        conn: Connection,
        operation: OperationRecord,
        results: Mapping[str, _Pass],
        shares: bool = True,
        jobs: Sequence[JobRecord] | None = None,
    ) -> OperationView:
        """The operation; its shares in each tree from ``results`` (the passes just run), else
        computed now. ``jobs``: its jobs, when already read (else read here)."""
        if jobs is None:
            jobs = store.jobs_of(conn, [operation.id])
        running = [j for j in jobs if j.status is JobStatus.RUNNING]
        interrupting = [j for j in jobs if j.status is JobStatus.INTERRUPTING]
        nodes: dict[str, int] = {}
        for job in sorted(running, key=lambda j: j.node):  # by node name, whatever the row order
            nodes[job.node] = nodes.get(job.node, 0) + 1
        live = not operation.status.is_final
        placements = []
        for placement in operation.placements:
            element = None
            if shares and live:
                if placement.tree in results:
                    fair = results[placement.tree].shares
                else:
                    state = _State.load(conn, placement.tree)
                    fair = state.fair_share(state.states(), self.clock())
                element = SharesView.of(fair.operations[operation.id])
            placements.append(PlacementView(
                tree=placement.tree,
                pool=placement.pool,
                weight=placement.weight,
                resource_limits=placement.resource_limits,
                status=operation.status.value if not live
                else "running" if placement.running else "pending",
                reason=placement.reason,
                running_jobs=sum(1 for j in running if j.tree == placement.tree),
                shares=element,
            ))
        first = placements[0]
        several = len(placements) > 1
        if not live:
            reason = operation.status_reason
        elif several:
            reason = "; ".join(f"tree {p.tree}: {p.reason}" for p in placements
                               if p.reason) or None
        else:
            reason = first.reason
        return OperationView(
            id=operation.id,
            tree=",".join(p.tree for p in placements),
            pool=",".join(p.pool for p in placements),
            user=operation.user,
            status=operation.status.value,
            reason=reason,
            job_resources=operation.job_resources,
            job_count=operation.job_count,
            gang=operation.gang,
            weight=first.weight,
            resource_limits=first.resource_limits,
            interruptible=operation.interruptible,
            running_jobs=len(running),
            pending_jobs=0 if not live
            else operation.job_count - len(running) - len(interrupting),
            nodes=nodes,
            interrupting=tuple(
                InterruptingJobView(j.id, j.node, j.preempted_by, j.reason,
                                    j.interrupt_deadline)
                for j in interrupting
            ),
            # By preemption time, a pass's newest job first (those started together by id,
            # not as the pass chose them).
            preempted=tuple(
                PreemptedJobView(j.id, j.node, j.preempted_by, j.reason, j.finished_at)
                for j in sorted(
                    sorted((j for j in jobs if j.status is JobStatus.PREEMPTED),
                           key=lambda j: (j.started_at, j.id), reverse=True),
                    key=lambda j: j.finished_at or j.started_at)
            ),
            shares=None if several else first.shares,
            trees=tuple(placements),
            created_at=operation.created_at,
            started_at=operation.started_at,
            finished_at=operation.finished_at,
        )

    # -- the pass ----------------------------------------------------------------------------

    def _pass_all(self, conn: Connection) -> None:
        self._passes(conn, [record.name for record in store.list_trees(conn)])

    def _passes(self, conn: Connection, names: Sequence[str]) -> dict[str, _Pass]:
        """A pass over each tree of ``names``; then, once more, over the other trees of the
        operations whose jobs changed (their pending jobs are one count for all their trees,
        so those trees' reasons and shares are stale)."""
        results = {name: self._pass(conn, name) for name in names}
        again = sorted({tree for result in results.values() for tree in result.stale})
        results.update((name, self._pass(conn, name)) for name in again)
        return results

    def _pass(self, conn: Connection, name: str) -> _Pass:
        """Admission, fair share, job plan; store the plan and the starvation clocks."""
        now = self.clock()
        state = _State.load(conn, name)
        admission = admit_operations(state.tree, state.states())
        states = state.states(admission.running)
        # Integral pools' volumes are refilled and consumed over the time since the last pass,
        # once: the second update below starts from the volumes this one leaves.
        before = state.fair_share(states, now, state.integral_states(now))
        nodes = [
            NodeState(_cluster_node(n), _seconds(n.last_preemption_at)) for n in state.nodes
        ]
        plan = plan_jobs(state.tree, nodes, states, before, now.timestamp())
        by_id = {op.id: op for op in state.operations}
        for op_id in admission.promoted:
            store.update_placement(conn, op_id, name, running=True)
            if by_id[op_id].status is OperationStatus.PENDING:  # not yet running in any tree
                store.update_operation(conn, op_id, now, status=OperationStatus.RUNNING,
                                       started_at=now)
        store.finish_interruptions(conn, plan.expired, now)
        for preemption in plan.preemptions:
            store.preempt_job(conn, preemption.job, preemption.preemptor, preemption.reason, now,
                              _moment(preemption.deadline))
        store.insert_jobs(conn, name, [(g.operation, g.node) for g in plan.grants], now)
        store.mark_preemption(conn, plan.preempted_nodes, now)
        # The shares after the plan: what the answer shows, and whose starvation clocks the
        # next pass continues (an operation the plan satisfied is no longer below its share).
        refilled = {
            pool_name: element.integral.state
            for pool_name, element in before.pools.items() if element.integral is not None
        }
        after = state.fair_share(_after(states, plan, now.timestamp()), now, refilled)
        for op in state.operations:
            wait = plan.waiting.get(op.id)
            starvation = after.operations[op.id].starvation
            starving = starvation is not None and starvation.status is StarvationStatus.STARVING
            reason = admission.pending.get(op.id) or (
                f"{counted(wait.pending_jobs, 'job')} pending: "
                f"{wait.reason if starving else wait.unstarved()}" if wait else None
            )
            since = _moment(starvation.below_fair_share_since) if starvation else None
            placement = state.placement(op)
            if (reason, since) != (placement.reason, placement.below_fair_share_since):
                store.update_placement(conn, op.id, name, reason=reason,
                                       below_fair_share_since=since)
        for pool_name, element in after.pools.items():
            starvation = element.starvation
            at = None if starvation is None else starvation.below_fair_share_since
            if at != state.pool_since.get(pool_name):
                store.set_pool_since(conn, name, pool_name, _moment(at))
            # Every pass stores the integral state, with its time: the next pass refills
            # from it. A pool that stopped being integral forgets its volume.
            integral = element.integral
            if integral is not None:
                store.set_pool_integral(conn, name, pool_name, IntegralRecord(
                    dict(integral.state.accumulated_volume),
                    integral.state.last_share_ratio, now,
                ))
            elif pool_name in state.integral:
                store.set_pool_integral(conn, name, pool_name, None)
        changed = {g.operation for g in plan.grants} | {p.operation for p in plan.preemptions}
        stale = frozenset(p.tree for op in state.operations if op.id in changed
                          for p in op.placements if p.tree != name)
        return _Pass(admission, plan, after, stale)


def _after(states: Sequence[OperationState], plan: JobPlan, now: float) -> list[OperationState]:
    """The operations with the plan applied (ids of new jobs do not matter to fair share;
    interrupted jobs keep their units)."""
    gone = {p.job for p in plan.preemptions if p.deadline is None} | set(plan.expired)
    interrupted = {p.job: p for p in plan.preemptions if p.deadline is not None}
    result = []
    for state in states:
        kept = tuple(
            replace(job, interrupted_for=interrupted[job.id].preemptor,
                    interrupt_deadline=interrupted[job.id].deadline)
            if job.id in interrupted else job
            for job in state.jobs if job.id not in gone
        )
        new = tuple(RunningJob(f"new-{i}", g.node, now)
                    for i, g in enumerate(plan.grants) if g.operation == state.id)
        result.append(replace(state, jobs=kept + new))
    return result


@dataclass(frozen=True, slots=True)
class _TreeOptions:
    """One entry of ``scheduling_options_per_pool_tree``: what overrides the operation's
    own pool, weight and resource_limits in that tree."""

    pool: str | None = None
    weight: Fraction | None = None
    resource_limits: dict[str, int] | None = None


_TREE_OPTION_KEYS = ("pool", "weight", "resource_limits")


def _parse_tree_options(given: Mapping[str, object] | None) -> dict[str, _TreeOptions]:
    """``{tree: {pool, weight, resource_limits}}``, each key checked and named on error."""
    if given is None:
        return {}
    parsed = {}
    for tree, options in mapping("tree_options", given).items():
        field = f"tree_options.{tree}"
        if not isinstance(options, Mapping):
            raise InvalidInput(field, options, "must map pool / weight / resource_limits "
                               "to values")
        for key in options:
            if key not in _TREE_OPTION_KEYS:
                raise InvalidInput(f"{field}.{key}", options[key], "unknown option; one of "
                                   + ", ".join(_TREE_OPTION_KEYS))
        pool = options.get("pool")
        if pool is not None and not isinstance(pool, str):
            raise InvalidInput(f"{field}.pool", pool, "must be a pool name")
        weight = options.get("weight")
        limits = options.get("resource_limits")
        if limits is not None and not isinstance(limits, Mapping):
            raise InvalidInput(f"{field}.resource_limits", limits, "must be a mapping")
        parsed[str(tree)] = _TreeOptions(
            pool=pool,
            weight=None if weight is None else positive(f"{field}.weight", weight),
            resource_limits=None if limits is None
            else parse_resources(f"{field}.resource_limits", dict(limits)),
        )
    return parsed


def _check_trees(names: Sequence[str], options: Mapping[str, _TreeOptions]) -> None:
    """At most ``MAX_POOL_TREES``, each once; per-tree options only for the operation's
    trees."""
    if len(names) > MAX_POOL_TREES:
        raise InvalidInput("tree", len(names), f"an operation runs in at most "
                           f"{MAX_POOL_TREES} trees")
    for index, name in enumerate(names):
        if name in names[:index]:
            raise InvalidInput("tree", name, "given twice")
    for name in options:
        if name not in names:
            raise InvalidInput(f"tree_options.{name}", name, "is not one of the operation's "
                               f"trees ({', '.join(names)})")


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
                f"job_resources.{key}", amount_text(key, amount),
                f"no node of tree {state.tree.name} has that much (largest: "
                f"{amount_text(key, largest)})",
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
                f"has {counted(started, 'started operation')} in tree {state.tree.name}, its "
                f"max_operation_count is {limit}",
            )
    started = sum(per_pool.values())
    if started >= state.tree.config.max_operation_count:
        raise InvalidInput(
            "tree", state.tree.name, f"has {counted(started, 'started operation')}, its "
            f"max_operation_count is {state.tree.config.max_operation_count}",
        )


def _operation_counts(state: _State, pool: str) -> tuple[int, int]:
    """Running (in this tree) and started operations in the pool's subtree."""
    inside = [placement for placement in map(state.placement, state.operations)
              if placement.pool != ROOT and pool in state.tree.ancestors(placement.pool)]
    return sum(1 for placement in inside if placement.running), len(inside)


def _element_rows(state: _State, shares: FairShareResult) -> list[ElementRow]:
    """The root, then each pool followed by its subtree and its operations."""
    placements = [state.placement(op) for op in state.operations]
    rows = [ElementRow(ROOT, "root", 0, SharesView.of(shares.root),
                       sum(1 for placement in placements if placement.running),
                       len(placements), None)]
    by_pool: dict[str, list[PlacementRecord]] = {}
    for placement in placements:
        by_pool.setdefault(placement.pool, []).append(placement)

    def operations(pool: str, depth: int) -> None:
        for placement in by_pool.get(pool, []):
            rows.append(ElementRow(placement.operation_id, "operation", depth,
                                   SharesView.of(shares.operations[placement.operation_id]),
                                   None, None, "running" if placement.running else "pending"))

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
