"""Frozen records of the pool-tree front-end (seed 003), each built from its row.

Configurations are kept as the JSON mappings of their explicit options (what
``PoolTreeConfig.from_mapping`` / ``PoolConfig.from_mapping`` read); the service parses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from fractions import Fraction
from typing import Any

from sqlalchemy import RowMapping


class OperationStatus(StrEnum):
    """Where an operation is in its life; the last two are final."""

    #: Started, waiting behind ``max_running_operation_count`` (no jobs).
    PENDING = "pending"
    #: May run jobs; its jobs are granted as nodes have room and its fair share allows.
    RUNNING = "running"
    #: Its owner said it finished; its jobs' units are free.
    COMPLETED = "completed"
    #: Stopped by its owner before it finished.
    ABORTED = "aborted"

    @property
    def is_final(self) -> bool:
        return self in (OperationStatus.COMPLETED, OperationStatus.ABORTED)


class JobStatus(StrEnum):
    RUNNING = "running"
    #: Chosen for preemption, interruptible: it keeps its units until its
    #: ``interrupt_deadline`` (``allocation_preemption_timeout``), then it is preempted.
    INTERRUPTING = "interrupting"
    #: Made room for a starving operation; the operation asks for the job again (pending).
    PREEMPTED = "preempted"
    #: Ended with its operation.
    COMPLETED = "completed"
    ABORTED = "aborted"

    @property
    def is_live(self) -> bool:
        """Its units are in use."""
        return self in (JobStatus.RUNNING, JobStatus.INTERRUPTING)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    tags: tuple[str, ...]
    resources: dict[str, int]
    created_at: datetime
    #: When preemption last made room here (``preemptive_scheduling_backoff``).
    last_preemption_at: datetime | None

    @classmethod
    def from_row(cls, row: RowMapping) -> NodeRecord:
        return cls(
            name=row["name"],
            tags=tuple(row["tags"]),
            resources=dict(row["resources"]),
            created_at=row["created_at"],
            last_preemption_at=row["last_preemption_at"],
        )


@dataclass(frozen=True, slots=True)
class PoolTreeRecord:
    name: str
    #: The tree's explicit options.
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> PoolTreeRecord:
        return cls(
            name=row["name"],
            config=dict(row["config"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class TreePoolRecord:
    tree: str
    name: str
    #: None: a child of the tree's root.
    parent: str | None
    #: The pool's explicit options.
    config: dict[str, Any]
    #: Set for an ephemeral pool: the user it was made for (it goes with their last operation).
    ephemeral_user: str | None
    #: Carried from pass to pass for the starvation timeout.
    below_fair_share_since: datetime | None
    #: Integral guarantees, carried from pass to pass: None before the pool's first pass as
    #: an integral pool.
    integral: IntegralRecord | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> TreePoolRecord:
        at = row["integral_updated_at"]
        return cls(
            tree=row["tree"],
            name=row["name"],
            parent=row["parent"],
            config=dict(row["config"]),
            ephemeral_user=row["ephemeral_user"],
            below_fair_share_since=row["below_fair_share_since"],
            integral=None if at is None else IntegralRecord(
                {key: Fraction(value) for key, value in row["integral_volume"].items()},
                Fraction(row["integral_share_ratio"]),
                at,
            ),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class IntegralRecord:
    """An integral pool's state after a fair-share update (exact, stored as text)."""

    #: Resource -> resource-seconds.
    volume: dict[str, Fraction]
    #: The integral share ratio the pool holds until the next update consumes it.
    share_ratio: Fraction
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """An operation in one of its pool trees: YTsaurus's ``scheduling_options_per_pool_tree``
    (pool, weight, resource_limits) and its state there."""

    operation_id: str
    tree: str
    #: The trees' order as given.
    position: int
    pool: str
    #: Exact decimal or ratio text ("2", "0.5", "1/3").
    weight: str
    resource_limits: dict[str, int]
    #: Admitted by the tree's max_running_operation_count; else pending in this tree.
    running: bool
    #: Why its jobs (or it) wait in this tree; None when nothing waits.
    reason: str | None
    #: Carried from pass to pass for the starvation timeout.
    below_fair_share_since: datetime | None

    @classmethod
    def from_row(cls, row: RowMapping) -> PlacementRecord:
        return cls(
            operation_id=row["operation_id"],
            tree=row["tree"],
            position=row["position"],
            pool=row["pool"],
            weight=row["weight"],
            resource_limits=dict(row["resource_limits"]),
            running=row["running"],
            reason=row["reason"],
            below_fair_share_since=row["below_fair_share_since"],
        )


@dataclass(frozen=True, slots=True)
class OperationRecord:
    id: str
    user: str
    job_resources: dict[str, int]
    job_count: int
    gang: bool
    #: Its jobs, when preempted, are interrupted first (``allocation_preemption_timeout``).
    interruptible: bool
    status: OperationStatus
    #: Why it ended (live operations: see each placement's reason).
    status_reason: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    #: One per pool tree, in the order given.
    placements: tuple[PlacementRecord, ...]

    @classmethod
    def from_row(cls, row: RowMapping, placements: Sequence[PlacementRecord]) -> OperationRecord:
        return cls(
            id=row["id"],
            user=row["user_name"],
            job_resources=dict(row["job_resources"]),
            job_count=row["job_count"],
            gang=row["gang"],
            interruptible=row["interruptible"],
            status=OperationStatus(row["status"]),
            status_reason=row["status_reason"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            updated_at=row["updated_at"],
            placements=tuple(sorted(placements, key=lambda p: p.position)),
        )

    def placement(self, tree: str) -> PlacementRecord:
        """The operation in ``tree`` (one of its trees)."""
        return next(p for p in self.placements if p.tree == tree)


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    operation_id: str
    node: str
    status: JobStatus
    started_at: datetime
    finished_at: datetime | None
    #: The starving operation a preempted (or interrupting) job made room for.
    preempted_by: str | None
    reason: str | None
    #: Set once the job is interrupted: when its units are taken.
    interrupt_deadline: datetime | None
    #: The pool tree it runs in (one of its operation's).
    tree: str

    @classmethod
    def from_row(cls, row: RowMapping) -> JobRecord:
        return cls(
            id=row["id"],
            operation_id=row["operation_id"],
            node=row["node"],
            status=JobStatus(row["status"]),
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            preempted_by=row["preempted_by"],
            reason=row["reason"],
            interrupt_deadline=row["interrupt_deadline"],
            tree=row["tree"],
        )
