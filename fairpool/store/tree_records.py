"""Frozen records of the pool-tree front-end (seed 003), each built from its row.

Configurations are kept as the JSON mappings of their explicit options (what
``PoolTreeConfig.from_mapping`` / ``PoolConfig.from_mapping`` read); the service parses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
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
    #: Made room for a starving operation; the operation asks for the job again (pending).
    PREEMPTED = "preempted"
    #: Ended with its operation.
    COMPLETED = "completed"
    ABORTED = "aborted"


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
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> TreePoolRecord:
        return cls(
            tree=row["tree"],
            name=row["name"],
            parent=row["parent"],
            config=dict(row["config"]),
            ephemeral_user=row["ephemeral_user"],
            below_fair_share_since=row["below_fair_share_since"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class OperationRecord:
    id: str
    tree: str
    pool: str
    user: str
    job_resources: dict[str, int]
    job_count: int
    gang: bool
    #: Exact decimal or ratio text ("2", "0.5", "1/3").
    weight: str
    resource_limits: dict[str, int]
    status: OperationStatus
    status_reason: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    below_fair_share_since: datetime | None

    @classmethod
    def from_row(cls, row: RowMapping) -> OperationRecord:
        return cls(
            id=row["id"],
            tree=row["tree"],
            pool=row["pool"],
            user=row["user_name"],
            job_resources=dict(row["job_resources"]),
            job_count=row["job_count"],
            gang=row["gang"],
            weight=row["weight"],
            resource_limits=dict(row["resource_limits"]),
            status=OperationStatus(row["status"]),
            status_reason=row["status_reason"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            updated_at=row["updated_at"],
            below_fair_share_since=row["below_fair_share_since"],
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    operation_id: str
    node: str
    status: JobStatus
    started_at: datetime
    finished_at: datetime | None
    #: The starving operation a preempted job made room for.
    preempted_by: str | None
    reason: str | None

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
        )
