"""Pool trees (seed 003): which operations run, and which jobs run on which node.

Pure and deterministic, like the rest of the engine: state and ``now`` go in, a frozen plan
comes out; ties are broken by start time, then id (operations) or node name.

Two steps, around the fair-share update (:func:`fairpool.engine.fairshare.compute_fair_share`):

1. :func:`admit_operations` -- ``max_running_operation_count``: pending operations are promoted,
   oldest first, while the pool, every ancestor and the tree have a free slot. Its result says
   which operations are running, which the fair-share update needs (a pending operation demands
   nothing).
2. :func:`plan_jobs` -- with the fair share known:

   * **Limits first.** A ``resource_limits`` that usage exceeds (one lowered in the config, a
     pool moved under a tighter parent) is restored by preempting: the newest preemptible jobs
     (as below) of the operations under it, until it holds (YTsaurus
     ``ResourceLimitsViolated``). Jobs that are not preemptible stay, over the limit; no new
     job starts under it until usage is back within it.
   * **Regular scheduling.** Pending jobs go to the most under-served running operation first
     (lowest usage / fair share of its dominant resource; operations with no fair share after
     every other), one job at a time, re-ranked after each grant. It is work conserving: free
     room is used beyond the fair share, up to ``resource_limits`` of the operation and of every
     pool up to the root. A job needs one node, selected by the tree's ``node_tag_filter``, with
     room for its whole vector (first fit in node-name order). A gang gets all its pending jobs
     in one pass or none.
   * **Starvation preemption.** An operation the fair-share update calls *starving* that still
     has pending jobs may take jobs, up to its fair share, by preempting on one node the newest
     *preemptible* jobs of other operations: those an operation can lose while its usage share
     stays at or above ``fair share * preemption_satisfaction_threshold`` (YTsaurus: an
     allocation is preemptible when it lies strictly above the threshold, counted oldest first).
     ``non_preemptible_resource_usage_threshold`` keeps each oldest job while the jobs before it
     use strictly less; a gang loses all its jobs or none. The node needing the fewest victims
     wins (then its name); victims that turn out unnecessary are dropped. A node that preempted
     is left alone for ``preemptive_scheduling_backoff``. A starving *gang* takes all its
     pending jobs at once (even past its fair share): each job is placed as above on working
     copies, and only if every one finds room are the victims preempted; otherwise nothing is.
   * **Interruption** (``allocation_preemption_timeout``). A victim of an *interruptible*
     operation is not preempted at once: it is interrupted and keeps its units until
     ``now + allocation_preemption_timeout``; the first pass at or after that deadline frees
     them (the job is preempted then). The starving operation does not get the room before:
     the room is *held* for it -- granted to it as soon as it is free, left alone by every
     other operation and not preempted for again meanwhile.

Every pending job that is not granted is explained once per operation (:class:`OperationWait`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from fairpool.engine.amounts import amount_text
from fairpool.engine.fairshare import (
    ROOT,
    FairShareResult,
    OperationSnapshot,
    StarvationStatus,
)
from fairpool.errors import counted
from fairpool.frontends.trees import ClusterNode, PoolTree, matches_tag_filter, tree_resources

Resources = Mapping[str, int]

__all__ = [
    "JobGrant",
    "JobPlan",
    "JobPreemption",
    "NodeState",
    "OperationAdmission",
    "OperationState",
    "OperationWait",
    "RunningJob",
    "admit_operations",
    "format_resources",
    "plan_jobs",
]


# -- input -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: str
    node: str
    #: Seconds, any epoch: "newest first" compares these (then ids).
    started_at: float
    #: Set while the job is being interrupted: the starving operation it makes room for.
    interrupted_for: str | None = None
    #: Set while the job is being interrupted: when its units are taken. Until then they are
    #: in use (no over-commit), and the job is no longer preemptible.
    interrupt_deadline: float | None = None


@dataclass(frozen=True, slots=True)
class OperationState:
    """An operation in one tree: ``job_count`` identical jobs of ``job_resources`` (in all its
    trees)."""

    id: str
    pool: str
    job_resources: Resources
    job_count: int
    gang: bool = False
    #: False: pending behind ``max_running_operation_count`` (no jobs yet, none granted).
    running: bool = True
    start_time: float = 0.0
    weight: Fraction = Fraction(1)
    resource_limits: Resources = field(default_factory=dict)
    jobs: tuple[RunningJob, ...] = ()
    #: Its jobs, when preempted, are interrupted first (``allocation_preemption_timeout``).
    interruptible: bool = False
    #: Live jobs in the operation's other pool trees (YTsaurus ``pool_trees``): pending jobs
    #: are one count for all its trees, so these are not pending here.
    elsewhere: int = 0

    @property
    def pending_job_count(self) -> int:
        return self.job_count - self.elsewhere - len(self.jobs)

    def fair_share_input(self, running: bool | None = None) -> OperationSnapshot:
        """The operation as the fair-share update sees it (``running`` overrides its own)."""
        return OperationSnapshot(
            id=self.id,
            pool=self.pool,
            job_resources=self.job_resources,
            running_job_count=len(self.jobs),
            pending_job_count=self.pending_job_count,
            weight=self.weight,
            start_time=self.start_time,
            resource_limits=self.resource_limits,
            running=self.running if running is None else running,
        )


#: A job that may be preempted, with its operation.
Victim = tuple[OperationState, RunningJob]


@dataclass(frozen=True, slots=True)
class NodeState:
    node: ClusterNode
    #: When preemption last made room on this node (``preemptive_scheduling_backoff``).
    last_preemption_at: float | None = None


# -- output ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperationAdmission:
    #: Operations allowed to run after this step (already running, or promoted now).
    running: frozenset[str]
    #: Pending operations promoted now, oldest first.
    promoted: tuple[str, ...]
    #: Still pending: the pool (or tree) whose ``max_running_operation_count`` holds it.
    pending: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class JobGrant:
    operation: str
    node: str


@dataclass(frozen=True, slots=True)
class JobPreemption:
    job: str
    operation: str
    node: str
    #: The starving operation the job made room for; None when it went to bring usage back
    #: within a ``resource_limits``.
    preemptor: str | None
    reason: str
    #: None: preempted now, its units free. Else interrupted: its units are taken (and the
    #: job preempted) by the first pass at or after this moment.
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class OperationWait:
    operation: str
    pending_jobs: int
    reason: str

    @property
    def starving(self) -> bool:
        """The reason is the starvation step's (``starving, but ...``)."""
        return any(mark in self.reason for mark in _STARVING)

    def unstarved(self) -> str:
        """The reason once the fair share after the plan no longer calls the operation
        starving (this pass's preemptions for it brought it within the tolerance): below
        its fair share it still is. It said "starving" beside "starving: no" (helper-89)."""
        reason = self.reason
        for mark, plain in _STARVING.items():
            reason = reason.replace(mark, plain, 1)
        return reason


#: How the starvation step's reasons begin, and what each says once not starving.
_STARVING = {"starving, but ": "below its fair share, but ", "starving gang of ": "gang of "}


@dataclass(frozen=True, slots=True)
class JobPlan:
    #: In grant order (the order the store should start them in).
    grants: tuple[JobGrant, ...]
    preemptions: tuple[JobPreemption, ...]
    #: Operations with pending jobs left, by id.
    waiting: Mapping[str, OperationWait]
    #: Nodes where preemption made room now: their backoff starts.
    preempted_nodes: tuple[str, ...]
    #: Interrupted jobs whose deadline has come: preempted now, their units free.
    expired: tuple[str, ...] = ()

    def granted(self, operation: str) -> int:
        return sum(1 for grant in self.grants if grant.operation == operation)


def format_resources(resources: Resources) -> str:
    return ", ".join(
        f"{key} {amount_text(key, amount)}" for key, amount in sorted(resources.items())
    ) or "nothing"


# -- admission ---------------------------------------------------------------------------------


def admit_operations(tree: PoolTree, operations: Iterable[OperationState]) -> OperationAdmission:
    """Promote pending operations, oldest first, while every level has a running slot."""
    ordered = sorted(operations, key=lambda op: (op.start_time, op.id))
    running_in: dict[str, int] = {}
    tree_running = 0
    for op in ordered:
        if op.running:
            tree_running += 1
            for pool in _pools_of(tree, op.pool):
                running_in[pool] = running_in.get(pool, 0) + 1
    running = {op.id for op in ordered if op.running}
    promoted: list[str] = []
    pending: dict[str, str] = {}
    for op in ordered:
        if op.running:
            continue
        blocker = _running_blocker(tree, op.pool, running_in, tree_running)
        if blocker is not None:
            pending[op.id] = blocker
            continue
        running.add(op.id)
        promoted.append(op.id)
        tree_running += 1
        for pool in _pools_of(tree, op.pool):
            running_in[pool] = running_in.get(pool, 0) + 1
    return OperationAdmission(frozenset(running), tuple(promoted), MappingProxyType(pending))


def _pools_of(tree: PoolTree, pool: str) -> list[str]:
    """The pool and its ancestors (none for an operation in the root)."""
    return [] if pool == ROOT else tree.ancestors(pool)


def _running_blocker(
    tree: PoolTree, pool: str, running_in: Mapping[str, int], tree_running: int
) -> str | None:
    for name in _pools_of(tree, pool):
        limit = tree.effective[name].effective_max_running_operation_count
        if running_in.get(name, 0) >= limit:
            return (
                f"pending: pool {name} runs {counted(running_in.get(name, 0), 'operation')}, its "
                f"max_running_operation_count is {limit}"
            )
    limit = tree.config.max_running_operation_count
    if tree_running >= limit:
        return (
            f"pending: tree {tree.name} runs {counted(tree_running, 'operation')}, its "
            f"max_running_operation_count is {limit}"
        )
    return None


# -- the job plan ------------------------------------------------------------------------------


def plan_jobs(
    tree: PoolTree,
    nodes: Sequence[NodeState],
    operations: Sequence[OperationState],
    fair_share: FairShareResult,
    now: float,
) -> JobPlan:
    """Grant pending jobs, then preempt for starving operations (see the module docstring).

    ``fair_share`` is the update for exactly these operations (those not ``running`` excluded
    from demand); ``now`` is in seconds, the clock of ``RunningJob.started_at``.
    """
    return _Planner(tree, nodes, operations, fair_share, now).run()


class _Planner:
    """One planning pass: mutable working copies of node room and usage, thrown away after."""

    def __init__(
        self,
        tree: PoolTree,
        nodes: Sequence[NodeState],
        operations: Sequence[OperationState],
        fair_share: FairShareResult,
        now: float,
    ) -> None:
        self.tree, self.fair_share, self.now = tree, fair_share, now
        selected = sorted(
            (n for n in nodes if matches_tag_filter(tree.config.node_tag_filter, n.node.tags)),
            key=lambda n: n.node.name,
        )
        self.nodes = {n.node.name: n for n in selected}
        self.total = tree_resources(tree.config, (n.node for n in selected))
        self.free: dict[str, dict[str, int]] = {
            n.node.name: dict(n.node.resources) for n in selected
        }
        self.ops = {op.id: op for op in sorted(operations, key=lambda op: (op.start_time, op.id))}
        #: Live jobs per operation: running, or interrupted with their deadline still ahead.
        self.running_jobs: dict[str, list[RunningJob]] = {}
        self.pool_usage: dict[str, dict[str, int]] = {}
        self.expired: list[str] = []
        #: Per starving operation, per node: the units its interrupted victims free there
        #: (empty once they are free: the room is then in ``free``).
        self.incoming: dict[str, dict[str, dict[str, int]]] = {}
        #: Live jobs being interrupted, per operation (no longer preemptible).
        self.leaving: dict[str, int] = {}
        for op in self.ops.values():
            live = []
            for job in op.jobs:
                if job.interrupt_deadline is not None and now >= job.interrupt_deadline:
                    self.expired.append(job.id)
                    if job.interrupted_for is not None:
                        self.incoming.setdefault(job.interrupted_for, {}).setdefault(job.node, {})
                    continue
                live.append(job)
                if job.node in self.free:
                    _add(self.free[job.node], op.job_resources, -1)
                if job.interrupt_deadline is not None:
                    self.leaving[op.id] = self.leaving.get(op.id, 0) + 1
                    if job.interrupted_for is not None:
                        by_node = self.incoming.setdefault(job.interrupted_for, {})
                        _add(by_node.setdefault(job.node, {}), op.job_resources, 1)
            self.running_jobs[op.id] = sorted(live, key=lambda j: (j.started_at, j.id))
            for pool in _pools_of(tree, op.pool):
                _add(self.pool_usage.setdefault(pool, {}), op.job_resources, len(live))
        self.granted: dict[str, int] = {}
        self.grants: list[JobGrant] = []
        self.preemptions: list[JobPreemption] = []
        self.preempted_nodes: set[str] = set()
        self.waiting: dict[str, str] = {}
        #: Jobs per operation waiting for room held for it, and the nodes holding it.
        self.awaited: dict[str, int] = {}
        self.awaited_on: dict[str, set[str]] = {}

    # -- shares ----------------------------------------------------------------------------

    def dominant(self, op: OperationState) -> tuple[str, Fraction]:
        """The operation's dominant resource and its fair share of it."""
        shares = self.fair_share.operations[op.id]
        return shares.dominant_resource, shares.fair_share.total[shares.dominant_resource]

    def usage_share(self, op: OperationState, resource: str, jobs: int) -> Fraction:
        total = self.total.get(resource, 0)
        amount = op.job_resources.get(resource, 0) * jobs
        if total == 0:
            return Fraction(0 if amount == 0 else 1)
        return Fraction(amount, total)

    def jobs_of(self, op: OperationState) -> int:
        return len(self.running_jobs[op.id]) + self.granted.get(op.id, 0)

    def pending(self, op: OperationState) -> int:
        return op.job_count - op.elsewhere - self.jobs_of(op)

    def open_pending(self, op: OperationState) -> int:
        """Pending jobs not waiting for room held for them."""
        return self.pending(op) - self.awaited.get(op.id, 0)

    def rank(self, op: OperationState) -> tuple[bool, Fraction, float, str]:
        """Most under-served first: usage / fair share of the dominant resource; operations
        without a fair share last (by usage), then the oldest."""
        resource, fair = self.dominant(op)
        usage = self.usage_share(op, resource, self.jobs_of(op))
        return (fair == 0, usage / fair if fair else usage, op.start_time, op.id)

    # -- fitting ---------------------------------------------------------------------------

    def limit_problem(self, op: OperationState, jobs: int) -> str | None:
        """Why ``jobs`` more jobs would break a ``resource_limits`` (the operation's, then its
        pools' from the leaf up), else None."""
        demand = {key: amount * jobs for key, amount in op.job_resources.items()}
        own = {key: amount * self.jobs_of(op) for key, amount in op.job_resources.items()}
        problem = _over(op.resource_limits, own, demand, f"operation {op.id}")
        for pool in _pools_of(self.tree, op.pool):
            limits = self.tree.effective[pool].config.resource_limits
            problem = problem or _over(
                limits, self.pool_usage.get(pool, {}), demand, f"pool {pool}"
            )
        return problem

    def place_all(
        self, job: Resources, count: int, room: Mapping[str, Mapping[str, int]] | None = None
    ) -> list[str]:
        """The nodes ``count`` jobs would take, first fit in ``room`` (the free room), stopping
        at the first that fits nowhere (a gang's trial: nothing is granted)."""
        trial = {name: dict(free) for name, free in (room or self.free).items()}
        placed: list[str] = []
        for _ in range(count):
            node = self.first_fit(job, trial)
            if node is None:
                break
            _add(trial[node], job, -1)
            placed.append(node)
        return placed

    def first_fit(self, job: Resources, free: Mapping[str, Mapping[str, int]]) -> str | None:
        for name, room in free.items():
            if _fits(job, room):
                return name
        return None

    def no_room(self, op: OperationState) -> str:
        if not any(_fits(op.job_resources, n.node.resources) for n in self.nodes.values()):
            return (
                f"no node of tree {self.tree.name} is large enough for one job "
                f"({format_resources(op.job_resources)})"
            )
        return (
            f"no node of tree {self.tree.name} has room for a job "
            f"({format_resources(op.job_resources)}) now"
        )

    def grant(self, op: OperationState, node: str) -> None:
        _add(self.free[node], op.job_resources, -1)
        for pool in _pools_of(self.tree, op.pool):
            _add(self.pool_usage.setdefault(pool, {}), op.job_resources, 1)
        self.granted[op.id] = self.granted.get(op.id, 0) + 1
        self.grants.append(JobGrant(op.id, node))

    def hold(self, op: OperationState, node: str, jobs: int, incoming: Resources) -> None:
        """Keep room for ``jobs`` jobs of ``op`` on ``node``: the free part of it now (the rest,
        ``incoming``, is still held by jobs being interrupted)."""
        need = {key: max(0, amount * jobs - incoming.get(key, 0))
                for key, amount in op.job_resources.items()}
        _add(self.free[node], need, -1)
        self.awaited[op.id] = self.awaited.get(op.id, 0) + jobs
        self.awaited_on.setdefault(op.id, set()).add(node)

    # -- room being freed by interruptions -------------------------------------------------

    def reserve(self) -> None:
        """Before anything else: an operation that interrupted jobs gets the room they free as
        soon as it is free (with any free room on that node), and keeps it held until then."""
        for op in self.ops.values():
            nodes = self.incoming.get(op.id)
            if not nodes or not op.running or self.pending(op) <= 0:
                continue
            if op.gang:
                self.reserve_for_gang(op, nodes)
                continue
            for node in sorted(n for n in nodes if n in self.free):
                wanted = min(self.room_for(op, node), self.open_pending(op))
                while (wanted and _fits(op.job_resources, self.free[node])
                       and self.limit_problem(op, 1) is None):
                    self.grant(op, node)
                    wanted -= 1
                if wanted and self.limit_problem(op, 1) is None:
                    self.hold(op, node, wanted, nodes[node])

    def reserve_for_gang(self, op: OperationState, nodes: Mapping[str, Resources]) -> None:
        """All pending jobs of the gang once they fit at once, else everything held."""
        count = self.open_pending(op)
        if self.limit_problem(op, count) is not None:
            return
        placed = self.place_all(op.job_resources, count)
        if len(placed) == count:
            for node in placed:
                self.grant(op, node)
            return
        for node in sorted(n for n in nodes if n in self.free):
            wanted = min(self.room_for(op, node), self.open_pending(op))
            if wanted:
                self.hold(op, node, wanted, nodes[node])

    def room_for(self, op: OperationState, node: str) -> int:
        """Jobs of ``op`` that fit on ``node`` once its interrupted victims there are gone."""
        room = dict(self.free[node])
        _add(room, self.incoming[op.id][node], 1)
        return min(room.get(key, 0) // amount for key, amount in op.job_resources.items()
                   if amount > 0)

    # -- regular scheduling ----------------------------------------------------------------

    def schedule(self) -> None:
        heap = [(self.rank(op), op.id) for op in self.ops.values() if op.running and op.job_count]
        heapq.heapify(heap)
        while heap:
            _, op_id = heapq.heappop(heap)
            op = self.ops[op_id]
            if self.open_pending(op) <= 0:
                continue
            if op.gang:
                # A gang waiting for interrupted jobs starts whole, from the room held for it.
                if not self.awaited.get(op.id):
                    self.schedule_gang(op)
                continue
            problem = self.limit_problem(op, 1)
            node = None if problem else self.first_fit(op.job_resources, self.free)
            if node is None:
                self.waiting[op.id] = problem or self.no_room(op)
                continue
            self.grant(op, node)
            if self.open_pending(op) > 0:
                heapq.heappush(heap, (self.rank(op), op.id))

    def schedule_gang(self, op: OperationState) -> None:
        """All pending jobs of a gang in this pass, or none."""
        count = self.pending(op)
        problem = self.limit_problem(op, count)
        if problem is not None:
            self.waiting[op.id] = f"gang of {counted(count, 'job')}: {problem}"
            return
        placed = self.place_all(op.job_resources, count)
        if len(placed) < count:
            empty = {name: n.node.resources for name, n in self.nodes.items()}  # copied there
            ever = len(self.place_all(op.job_resources, count, empty))
            self.waiting[op.id] = (
                f"gang of {counted(count, 'job')}: only {len(placed)} fit on the nodes of tree "
                f"{self.tree.name} now (all or nothing)" if ever == count else
                f"gang of {counted(count, 'job')}: only {ever} fit on the nodes of tree "
                f"{self.tree.name} even with nothing else running; it waits for nodes to be "
                "added (all or nothing)"
            )
            return
        for node in placed:
            self.grant(op, node)

    # -- starvation preemption -------------------------------------------------------------

    def preemptible(self) -> dict[str, list[RunningJob]]:
        """Per operation, the jobs it may lose this pass, newest first."""
        threshold = self.tree.config.preemption_satisfaction_threshold
        result: dict[str, list[RunningJob]] = {}
        for op in self.ops.values():
            # Jobs being interrupted are already leaving: neither victims again nor counted.
            jobs = [job for job in self.running_jobs[op.id] if job.interrupt_deadline is None]
            resource, fair = self.dominant(op)
            floor = fair * threshold
            if not jobs or self.usage_share(op, resource, len(jobs)) <= floor:
                continue
            kept = self.protected(op)
            if op.gang:
                # All or nothing: only when losing every job keeps it at its floor.
                removable = len(jobs) if floor == 0 and not kept else 0
            else:
                removable = 0
                while (
                    removable < len(jobs) - kept
                    and self.usage_share(op, resource, len(jobs) - removable - 1) >= floor
                ):
                    removable += 1
            if removable:
                newest_first = sorted(jobs, key=lambda j: (j.started_at, j.id), reverse=True)
                result[op.id] = newest_first[:removable]
        return result

    def protected(self, op: OperationState) -> int:
        """How many of its oldest jobs ``non_preemptible_resource_usage_threshold`` keeps: as
        YTsaurus, each one while the usage of the jobs before it is strictly below the
        threshold on every key named that its jobs use (it protected the whole operation or
        none of it, by its total usage)."""
        pool = op.pool if op.pool != ROOT else None
        threshold = (
            self.tree.effective[pool].effective_non_preemptible_resource_usage_threshold
            if pool is not None
            else self.tree.config.non_preemptible_resource_usage_threshold
        )
        if not threshold:
            return 0
        kept = op.job_count
        for key, amount in threshold.items():
            each = op.job_resources.get(key, 0)
            if each > 0:  # how many i >= 0 have i * each < amount, exactly
                kept = min(kept, max(0, math.ceil(Fraction(amount) / Fraction(each))))
        return kept

    def preempt(self) -> None:
        starving = [
            op
            for op in self.ops.values()
            if op.running
            and self.open_pending(op) > 0
            and (state := self.fair_share.operations[op.id].starvation) is not None
            and state.status is StarvationStatus.STARVING
        ]
        if not starving:
            return
        victims = self.preemptible()
        backoff = self.tree.config.preemptive_scheduling_backoff / 1000
        open_nodes = [
            name
            for name, state in self.nodes.items()
            if state.last_preemption_at is None or self.now >= state.last_preemption_at + backoff
        ]
        for op in sorted(starving, key=self.rank):
            awaited = self.awaited.get(op.id, 0)
            if op.gang:
                if not awaited:
                    self.preempt_for_gang(op, victims, open_nodes)
                continue
            resource, fair = self.dominant(op)
            while (
                self.open_pending(op) > 0
                and self.usage_share(op, resource, self.jobs_of(op) + awaited) < fair
            ):
                problem = self.limit_problem(op, 1 + awaited)
                if problem is not None:
                    self.waiting[op.id] = f"starving, but {problem}"
                    break
                node = self.first_fit(op.job_resources, self.free)
                if node is not None:
                    self.grant(op, node)
                    continue
                choice = self.cheapest_room(op, victims, open_nodes, self.free)
                if choice is None:
                    self.waiting[op.id] = self.why_no_preemption(op, victims, open_nodes)
                    break
                node, chosen = choice
                incoming = self.make_room(op, node, chosen, victims)
                if incoming is None:
                    self.grant(op, node)
                else:
                    self.hold(op, node, 1, incoming)
                    awaited += 1
                self.waiting.pop(op.id, None)

    def why_no_preemption(
        self, op: OperationState, victims: Mapping[str, list[RunningJob]],
        open_nodes: Sequence[str],
    ) -> str:
        """Why a starving ``op`` preempts nothing more: what stops it, named (it was "no node
        can make room" whatever did)."""
        tree = self.tree.name
        if not any(jobs for victim_id, jobs in victims.items() if victim_id != op.id):
            return (f"starving, but no job of another operation in tree {tree} may be "
                    "preempted: losing any would take its operation below its fair share * "
                    "preemption_satisfaction_threshold, or non_preemptible_resource_usage_"
                    "threshold keeps it")
        if len(open_nodes) < len(self.nodes) and self.cheapest_room(
            op, victims, list(self.nodes), self.free
        ) is not None:
            backoff = self.tree.config.preemptive_scheduling_backoff
            return (f"starving, but the nodes of tree {tree} where preempting would make room "
                    f"preempted less than preemptive_scheduling_backoff ({backoff} ms) ago")
        return (f"starving, but no node of tree {tree} can make room for a job by preempting "
                "jobs above their fair share")

    def make_room(
        self,
        op: OperationState,
        node: str,
        chosen: Sequence[Victim],
        victims: dict[str, list[RunningJob]],
    ) -> dict[str, int] | None:
        """Preempt ``chosen`` for ``op``: None when the room is free now, else the units its
        interrupted victims still hold (the room is then held for ``op``)."""
        incoming: dict[str, int] = {}
        for victim_op, job in chosen:
            if self.evict(victim_op, job, op, victims):
                _add(incoming, victim_op.job_resources, 1)
        self.preempted_nodes.add(node)
        return incoming or None

    def preempt_for_gang(
        self,
        op: OperationState,
        victims: dict[str, list[RunningJob]],
        open_nodes: Sequence[str],
    ) -> None:
        """A starving gang: every pending job at once -- free room first, then preemption job
        by job as for any operation, tried on working copies -- or nothing preempted."""
        count = self.pending(op)
        problem = self.limit_problem(op, count)
        if problem is not None:
            self.waiting[op.id] = f"starving gang of {counted(count, 'job')}, but {problem}"
            return
        free = {name: dict(room) for name, room in self.free.items()}
        left = {victim_id: list(jobs) for victim_id, jobs in victims.items()}
        placed: list[tuple[str, list[Victim]]] = []
        for _ in range(count):
            node = self.first_fit(op.job_resources, free)
            chosen: list[Victim] = []
            if node is None:
                choice = self.cheapest_room(op, left, open_nodes, free)
                if choice is None:
                    self.waiting[op.id] = (
                        f"starving gang of {counted(count, 'job')}, but only {len(placed)} fit "
                        f"on the nodes of tree {self.tree.name} even by preempting jobs above "
                        "their fair share (all or nothing: nothing preempted)"
                    )
                    return
                node, chosen = choice
                for victim_op, job in chosen:
                    left[victim_op.id].remove(job)
                    _add(free[job.node], victim_op.job_resources, 1)
            _add(free[node], op.job_resources, -1)
            placed.append((node, chosen))
        # One interrupted victim anywhere and the gang waits whole: every job's room is held.
        wait = any(self.interrupts(victim_op) for _, chosen in placed for victim_op, _ in chosen)
        for node, chosen in placed:
            incoming = self.make_room(op, node, chosen, victims) if chosen else None
            if wait:
                self.hold(op, node, 1, incoming or {})
            else:
                self.grant(op, node)
        self.waiting.pop(op.id, None)

    def cheapest_room(
        self,
        op: OperationState,
        victims: Mapping[str, list[RunningJob]],
        open_nodes: Sequence[str],
        free: Mapping[str, Mapping[str, int]],
    ) -> tuple[str, list[Victim]] | None:
        """The node where the fewest preemptible jobs make room for one job of ``op`` (ties:
        the newest victims, then the node name)."""
        best: tuple[str, list[Victim]] | None = None
        for node in open_nodes:
            candidates = sorted(
                (
                    (self.ops[victim_id], job)
                    for victim_id, jobs in victims.items()
                    if victim_id != op.id
                    for job in jobs
                    if job.node == node
                ),
                key=lambda pair: (pair[1].started_at, pair[1].id),
                reverse=True,
            )
            chosen = _smallest_set(op.job_resources, free[node], _units(candidates, victims))
            if chosen is not None and (best is None or _cost(chosen) < _cost(best[1])):
                best = (node, chosen)
        return best

    def interrupts(self, victim: OperationState) -> bool:
        """Whether preempting a job of ``victim`` interrupts it first (a timeout of 0 does not)."""
        return victim.interruptible and self.tree.config.allocation_preemption_timeout > 0

    def evict(
        self,
        victim: OperationState,
        job: RunningJob,
        preemptor: OperationState,
        victims: dict[str, list[RunningJob]],
    ) -> bool:
        """Preempt ``job`` for ``preemptor`` (see :meth:`take`)."""
        resource, fair = self.dominant(victim)
        jobs_before = self.jobs_of(victim) - self.leaving.get(victim.id, 0)
        threshold = self.tree.config.preemption_satisfaction_threshold
        cause = (
            # A share, not an amount ("used 1 of cpu" read as one CPU; helper-89).
            f"for starving operation {preemptor.id}: operation {victim.id}'s {resource} usage "
            f"share {_share(self.usage_share(victim, resource, jobs_before))} was above its "
            f"fair share {_share(fair)} * preemption_satisfaction_threshold {_share(threshold)}"
        )
        return self.take(victim, job, victims, preemptor.id, cause)

    def take(
        self,
        victim: OperationState,
        job: RunningJob,
        victims: dict[str, list[RunningJob]],
        preemptor: str | None,
        cause: str,
    ) -> bool:
        """Preempt ``job``, or interrupt it (True): its units stay in use until its deadline."""
        interrupt = self.interrupts(victim)
        timeout = self.tree.config.allocation_preemption_timeout
        reason = (
            f"{'interrupted' if interrupt else 'preempted'} {cause}"
            + (f"; allocation_preemption_timeout {timeout} ms" if interrupt else "")
        )
        deadline = self.now + timeout / 1000 if interrupt else None
        self.preemptions.append(
            JobPreemption(job.id, victim.id, job.node, preemptor, reason, deadline)
        )
        victims[victim.id].remove(job)
        if interrupt:
            self.leaving[victim.id] = self.leaving.get(victim.id, 0) + 1
            return True
        self.running_jobs[victim.id].remove(job)
        if job.node in self.free:
            _add(self.free[job.node], victim.job_resources, 1)
        for pool in _pools_of(self.tree, victim.pool):
            _add(self.pool_usage[pool], victim.job_resources, -1)
        return False

    # -- limits ----------------------------------------------------------------------------

    def enforce_limits(self) -> None:
        """Usage above a ``resource_limits`` loses the newest preemptible jobs under it (a
        gang all of them) until it is within it; jobs being interrupted already count as gone,
        so later passes do not take more for the same excess."""
        active = {op_id: len(jobs) - self.leaving.get(op_id, 0)
                  for op_id, jobs in self.running_jobs.items()}
        usage: dict[str, dict[str, int]] = {}
        for op in self.ops.values():
            for pool in _pools_of(self.tree, op.pool):
                _add(usage.setdefault(pool, {}), op.job_resources, active[op.id])

        def violation(op: OperationState) -> str | None:
            """An exceeded limit over ``op`` on a key its jobs use: preempting one of them
            brings it down (a cpu-only job freed no gpu, and started again at once)."""
            used = {key for key, amount in op.job_resources.items() if amount}
            own = {key: amount * active[op.id] for key, amount in op.job_resources.items()}
            found = _above(op.resource_limits, own, f"operation {op.id}", used)
            for pool in _pools_of(self.tree, op.pool):
                limits = self.tree.effective[pool].config.resource_limits
                found = found or _above(limits, usage[pool], f"pool {pool}", used)
            return found

        violating = {op.id for op in self.ops.values() if active[op.id] and violation(op)}
        if not violating:
            return
        victims = self.preemptible()
        candidates = sorted(
            ((self.ops[op_id], job) for op_id, jobs in victims.items() if op_id in violating
             for job in jobs),
            key=lambda pair: (pair[1].started_at, pair[1].id),
            reverse=True,
        )

        def count(unit: Sequence[Victim], sign: int) -> None:
            for op, _ in unit:
                active[op.id] += sign
                for pool in _pools_of(self.tree, op.pool):
                    _add(usage[pool], op.job_resources, sign)

        chosen: list[tuple[list[Victim], str]] = []
        for unit in _units(candidates, victims):
            cause = violation(unit[0][0])
            if cause is not None:
                chosen.append((unit, cause))
                count(unit, -1)
        # Those that turn out unnecessary stay, the last chosen first: a newer gang taken for
        # one key, where an older job taken next for another key freed enough of both, was
        # granted again at once, elsewhere.
        needed = []
        for unit, cause in reversed(chosen):
            count(unit, +1)
            if violation(unit[0][0]) is not None:
                count(unit, -1)
                needed.append((unit, cause))
        for unit, cause in reversed(needed):
            for op, job in unit:
                self.take(op, job, victims, None, f"to bring {cause}")

    # -- the pass --------------------------------------------------------------------------

    def run(self) -> JobPlan:
        self.enforce_limits()
        self.reserve()
        self.schedule()
        self.preempt()
        waiting = {}
        for op in self.ops.values():
            if self.pending(op) <= 0:
                continue
            reason = self.waiting.get(op.id) or (
                "pending: not running yet" if not op.running else self.no_room(op)
            )
            awaited = self.awaited.get(op.id, 0)
            if awaited:
                held = (
                    f"{awaited} wait for interrupted jobs to leave "
                    f"{', '.join(sorted(self.awaited_on[op.id]))} "
                    "(allocation_preemption_timeout)"
                )
                reason = held if awaited == self.pending(op) else f"{held}; {reason}"
            waiting[op.id] = OperationWait(op.id, self.pending(op), reason)
        return JobPlan(
            tuple(self.grants),
            tuple(self.preemptions),
            MappingProxyType(waiting),
            tuple(sorted(self.preempted_nodes)),
            tuple(sorted(self.expired)),
        )


def _units(
    candidates: Sequence[Victim], victims: Mapping[str, list[RunningJob]]
) -> list[list[Victim]]:
    """Candidates (newest first) grouped into what is preempted together: one job, or every
    preemptible job of a gang -- and a gang only when all of them are among the candidates."""
    units: list[list[Victim]] = []
    seen: set[str] = set()
    for op, job in candidates:
        if not op.gang:
            units.append([(op, job)])
        elif op.id not in seen:
            seen.add(op.id)
            members = [pair for pair in candidates if pair[0].id == op.id]
            if len(members) == len(victims[op.id]):
                units.append(members)
    return units


def _smallest_set(
    job: Resources, free: Mapping[str, int], units: Sequence[list[Victim]]
) -> list[Victim] | None:
    """Units in order until ``job`` fits, then those found unnecessary dropped (DESIGN.md:
    greedy in victim order, then drop victims that turn out unnecessary)."""
    room = dict(free)
    chosen: list[list[Victim]] = []
    for unit in units:
        if _fits(job, room):
            break
        chosen.append(unit)
        for op, _ in unit:
            _add(room, op.job_resources, 1)
    if not _fits(job, room):
        return None
    for unit in reversed(list(chosen)):
        trial = dict(room)
        for op, _ in unit:
            _add(trial, op.job_resources, -1)
        if _fits(job, trial):
            room = trial
            chosen.remove(unit)
    return [pair for unit in chosen for pair in unit]


def _cost(victims: Sequence[Victim]) -> tuple[int, float]:
    """Fewest victims, then the node whose oldest victim is the newest (newest jobs go first
    across nodes too)."""
    return (len(victims), -min(job.started_at for _, job in victims))


def _fits(job: Resources, room: Mapping[str, int]) -> bool:
    return all(amount <= room.get(key, 0) for key, amount in job.items() if amount)


def _add(target: dict[str, int], amounts: Resources, times: int) -> None:
    for key, amount in amounts.items():
        target[key] = target.get(key, 0) + amount * times


def _over(limits: Resources, usage: Mapping[str, int], demand: Resources, who: str) -> str | None:
    for key in sorted(limits):
        wanted = demand.get(key, 0)
        if wanted and usage.get(key, 0) + wanted > limits[key]:
            return (
                f"{who} resource_limits.{key}: usage {amount_text(key, usage.get(key, 0))} + "
                f"{amount_text(key, wanted)} > limit {amount_text(key, limits[key])}"
            )
    return None


def _above(
    limits: Resources, usage: Mapping[str, int], who: str, keys: set[str]
) -> str | None:
    """The first of ``keys`` on which ``usage`` exceeds ``limits``, as a reason."""
    for key in sorted(keys & set(limits)):
        if usage.get(key, 0) > limits[key]:
            return (
                f"{who} within its resource_limits.{key} (usage "
                f"{amount_text(key, usage.get(key, 0))} > limit {amount_text(key, limits[key])})"
            )
    return None


def _share(value: Fraction) -> str:
    """A share for people: four decimals, exact values kept short."""
    return f"{float(value):.4f}".rstrip("0").rstrip(".") if value else "0"
