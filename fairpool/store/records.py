"""Frozen records read from the store, each built from its row by an explicit ``from_row``.

Resource maps (capacity, reserved, limit, demand) live in child tables; the caller loads
them in bulk and passes them in, so building N records never costs N queries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping


class ComponentType(StrEnum):
    """The kind of stack component that sends requests."""

    #: Runs whole pipelines.
    ORCHESTRATOR = "orchestrator"
    #: Runs single steps on separate infrastructure.
    STEP_OPERATOR = "step_operator"


class RequestStatus(StrEnum):
    """Where a request is in its life; the last four are final."""

    #: Waiting for capacity.
    QUEUED = "queued"
    #: Holds an allocation in a pool.
    ALLOCATED = "allocated"
    #: Finished and gave its units back.
    RELEASED = "released"
    #: Could never fit anywhere; never queued.
    REJECTED = "rejected"
    #: Lost its allocation to a more entitled request (a retry may follow).
    PREEMPTED = "preempted"
    #: Withdrawn by its owner.
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """True once the request can change no more."""
        return self not in (RequestStatus.QUEUED, RequestStatus.ALLOCATED)


class WorkloadStatus(StrEnum):
    """Where a workload of the scheduler config (seed 004) is in its life; the last four are
    final."""

    #: Routed to a queue, waiting for quota (also after being preempted: it is requeued).
    QUEUED = "queued"
    #: Admitted: a flavor per resource group, its demand counted against their quotas.
    ADMITTED = "admitted"
    #: Its holder said it ended; its quota is free again.
    FINISHED = "finished"
    #: Withdrawn by its owner.
    CANCELLED = "cancelled"
    #: Routed, but no flavor of its queue can ever hold it ("no flavor matched").
    REJECTED = "rejected"
    #: No scheduling rule routes it (or every matching rule's priority policy refused it).
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        return self not in (WorkloadStatus.QUEUED, WorkloadStatus.ADMITTED)


class TokenRole(StrEnum):
    """What an API token may do when the server checks tokens."""

    #: Everything.
    ADMIN = "admin"
    #: Read pools and policies; create requests for its components and manage its own.
    SUBMITTER = "submitter"


@dataclass(frozen=True, slots=True)
class Component:
    id: str
    name: str
    type: ComponentType
    created_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> Component:
        return cls(
            id=row["id"],
            name=row["name"],
            type=ComponentType(row["type"]),
            created_at=row["created_at"],
        )


@dataclass(frozen=True, slots=True)
class Pool:
    id: str
    name: str
    description: str | None
    created_at: datetime
    updated_at: datetime
    #: Total units per resource key.
    capacity: dict[str, int]

    @classmethod
    def from_row(cls, row: RowMapping, capacity: Mapping[str, int]) -> Pool:
        return cls(
            id=row["id"],
            name=row["name"],
            description=row["description"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            capacity=dict(capacity),
        )


@dataclass(frozen=True, slots=True)
class Policy:
    id: str
    pool_id: str
    component_id: str
    priority: int
    created_at: datetime
    updated_at: datetime
    #: Guaranteed units, for every key the policy names (0 when it only limits the key).
    reserved: dict[str, int]
    #: Caps, only for the keys that have one.
    limit: dict[str, int]

    @classmethod
    def from_row(
        cls, row: RowMapping, reserved: Mapping[str, int], limit: Mapping[str, int]
    ) -> Policy:
        return cls(
            id=row["id"],
            pool_id=row["pool_id"],
            component_id=row["component_id"],
            priority=row["priority"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            reserved=dict(reserved),
            limit=dict(limit),
        )


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    component_id: str
    status: RequestStatus
    status_reason: str | None
    preemptible: bool
    max_retries: int
    #: 1 for the first try, +1 for each retry after a preemption.
    attempt: int
    previous_attempt_id: str | None
    preempted_by_id: str | None
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    #: Set when the status becomes final.
    finished_at: datetime | None
    #: Units asked for per resource key.
    demand: dict[str, int]
    #: Seconds the allocation stays held without a heartbeat; None: until released.
    lease_ttl: int | None = None
    #: The API token it was submitted with (its retries inherit it); None: not through an
    #: authenticated API call.
    created_by_token_id: str | None = None

    @classmethod
    def from_row(cls, row: RowMapping, demand: Mapping[str, int]) -> Request:
        return cls(
            id=row["id"],
            component_id=row["component_id"],
            status=RequestStatus(row["status"]),
            status_reason=row["status_reason"],
            preemptible=row["preemptible"],
            max_retries=row["max_retries"],
            attempt=row["attempt"],
            previous_attempt_id=row["previous_attempt_id"],
            preempted_by_id=row["preempted_by_id"],
            labels=row["labels"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            demand=dict(demand),
            lease_ttl=row["lease_ttl"],
            created_by_token_id=row["created_by_token_id"],
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    request_id: str
    #: None once the pool is deleted; ``pool_name`` keeps the history readable.
    pool_id: str | None
    #: None once the policy is deleted.
    policy_id: str | None
    pool_name: str
    #: The policy's priority when the units were granted.
    priority: int
    allocated_at: datetime
    #: None while the allocation holds its units.
    released_at: datetime | None
    #: The holder must renew before this; None: no lease.
    lease_expires_at: datetime | None = None

    @classmethod
    def from_row(cls, row: RowMapping) -> Allocation:
        return cls(
            request_id=row["request_id"],
            pool_id=row["pool_id"],
            policy_id=row["policy_id"],
            pool_name=row["pool_name"],
            priority=row["priority"],
            allocated_at=row["allocated_at"],
            released_at=row["released_at"],
            lease_expires_at=row["lease_expires_at"],
        )


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    at: datetime
    kind: str
    request_id: str | None
    pool_id: str | None
    message: str
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: RowMapping) -> Event:
        return cls(
            id=row["id"],
            at=row["at"],
            kind=row["kind"],
            request_id=row["request_id"],
            pool_id=row["pool_id"],
            message=row["message"],
            data=row["data"],
        )


@dataclass(frozen=True, slots=True)
class ApiToken:
    """An API token as stored: never its secret, only the secret's hash and first characters."""

    id: str
    #: A label for people (who or what holds it); not unique.
    name: str | None
    role: TokenRole
    #: Component names a submitter may create requests for; empty for an admin.
    components: tuple[str, ...]
    #: The secret's first characters (``fp_`` and 8 more): enough to recognize it, useless
    #: to authenticate.
    prefix: str
    #: SHA-256 of the whole secret, hex.
    secret_hash: str
    created_at: datetime
    #: None while the token is valid.
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def from_row(cls, row: RowMapping) -> ApiToken:
        return cls(
            id=row["id"],
            name=row["name"],
            role=TokenRole(row["role"]),
            components=tuple(row["components"]),
            prefix=row["prefix"],
            secret_hash=row["secret_hash"],
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


@dataclass(frozen=True, slots=True)
class ConfigVersionInfo:
    """A version without its document (``config_summaries``): what a listing and the check of
    queue specs read, where a long history's documents would be megabytes."""

    version: int
    applied_at: datetime
    #: Set when this version re-applied an older one (``fairpool config rollback``).
    rolled_back_from: int | None
    #: ``config_diff.summary`` of its config; None for a version applied before migration
    #: 0015 that no apply has read since.
    summary: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class ConfigVersion(ConfigVersionInfo):
    """One applied scheduler config; the highest version is the active one."""

    #: The YAML exactly as applied (validated then, so it parses again).
    document: str

    @classmethod
    def from_row(cls, row: RowMapping) -> ConfigVersion:
        return cls(
            version=row["version"],
            document=row["document"],
            applied_at=row["applied_at"],
            rolled_back_from=row["rolled_back_from"],
            summary=row["summary"],
        )


#: The resource axes of a workload's demand, one milli-unit column each.
WORKLOAD_RESOURCES = ("gpu", "cpu", "memory_gb", "tpu")


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    status: WorkloadStatus
    status_reason: str | None
    #: Custom tags and the reserved keys (instance-type, accelerator-type, ...), as submitted.
    labels: dict[str, str]
    #: The priority the submitter asked for; None: the rule's default.
    requested_priority: int | None
    #: Milli-units per resource axis, only the non-zero ones.
    demand: dict[str, int]
    submitted_at: datetime
    updated_at: datetime
    #: Where routing sent it and at which priority (None before routing or when it failed).
    queue: str | None
    priority: int | None
    #: The config version it was last routed under.
    config_version: int | None
    #: One flavor per resource group of its queue, in group order, once admitted (kept after,
    #: for the record; empty on a passthrough queue).
    flavors: tuple[str, ...]
    admitted_at: datetime | None
    finished_at: datetime | None
    #: How many times it was preempted and requeued.
    preemptions: int
    #: When it was last preempted and queued again (None: never): it waits from then.
    requeued_at: datetime | None = None
    #: Why earlier rules and other flavors did not apply, when it was decided (admitted,
    #: rejected, failed); a queued one's are said by the pass that reads it.
    notes: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: RowMapping) -> Workload:
        return cls(
            id=row["id"],
            status=WorkloadStatus(row["status"]),
            status_reason=row["status_reason"],
            labels=dict(row["labels"]),
            requested_priority=row["requested_priority"],
            demand={key: row[key] for key in WORKLOAD_RESOURCES if row[key]},
            submitted_at=row["submitted_at"],
            updated_at=row["updated_at"],
            queue=row["queue"],
            priority=row["priority"],
            config_version=row["config_version"],
            flavors=tuple(row["flavors"] or ()),
            admitted_at=row["admitted_at"],
            finished_at=row["finished_at"],
            preemptions=row["preemptions"],
            requeued_at=row["requeued_at"],
            notes=tuple(row["status_notes"]),
        )
