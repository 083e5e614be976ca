"""What the service returns: read models with one JSON-ready ``as_dict()`` each.

The CLI, and later the HTTP API, print these; nothing downstream re-derives a field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, get_args

#: A component's types and the statuses of requests, workloads and operations, as views
#: carry them: the values of the store's enums as plain tuples, for what must not load
#: SQLAlchemy (remote mode, the CLI's options) and for the service's checks of input, which
#: need no enum to be built per call. ``tests/test_remote.py`` checks that they agree.
COMPONENT_TYPES = ("orchestrator", "step_operator")
REQUEST_STATUSES = ("queued", "allocated", "released", "rejected", "preempted", "cancelled")
WORKLOAD_STATUSES = ("queued", "admitted", "finished", "cancelled", "rejected", "failed")
OPERATION_STATUSES = ("pending", "running", "completed", "aborted")
#: Which of a pool's requests ``pool_requests`` lists.
PoolRequestView = Literal["queued", "active", "all"]
POOL_REQUEST_VIEWS: tuple[str, ...] = get_args(PoolRequestView)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _iso(value) if isinstance(value, datetime) or value is None else value
        for key, value in data.items()
    }


#: Between an allocated request's reason and the requests preempted for its units (the
#: CLI's ``create`` repeats what follows).
PREEMPTING = ", preempting "

#: What a prune deletes, by kind (``PruneView``, the metrics' ``fairpool_pruned_total``).
PRUNED_KINDS = ("requests", "events", "workloads", "operations")

@dataclass(frozen=True, slots=True)
class QueuePlace:
    """Where a waiting request stands in one pool (position 0: not eligible there)."""

    pool: str
    position: int
    reason: str
    check: str
    holding: bool = False


@dataclass(frozen=True, slots=True)
class RequestView:
    id: str
    status: str
    status_reason: str | None
    component: str
    component_type: str
    resources: dict[str, int]
    preemptible: bool
    max_retries: int
    attempt: int
    previous_attempt_id: str | None
    retried_as_id: str | None
    preempted_by_id: str | None
    labels: dict[str, str]
    pool: str | None
    priority: int | None
    created: datetime
    updated: datetime
    allocated_at: datetime | None
    released_at: datetime | None
    lease_ttl: int | None = None
    lease_expires_at: datetime | None = None
    queue: tuple[QueuePlace, ...] = ()
    #: In a pool's request list: "queued" or "active".
    state: str | None = None

    def as_dict(self) -> dict[str, Any]:
        # Field by field: every API answer about a request is built here, and asdict's
        # recursive deep copy cost more than the rest of the response.
        data = {
            "id": self.id,
            "status": self.status,
            "status_reason": self.status_reason,
            "component": self.component,
            "component_type": self.component_type,
            "resources": dict(self.resources),
            "preemptible": self.preemptible,
            "max_retries": self.max_retries,
            "attempt": self.attempt,
            "previous_attempt_id": self.previous_attempt_id,
            "retried_as_id": self.retried_as_id,
            "preempted_by_id": self.preempted_by_id,
            "labels": dict(self.labels),
            "pool": self.pool,
            "priority": self.priority,
            "created": self.created.isoformat(),
            "updated": self.updated.isoformat(),
            "allocated_at": _iso(self.allocated_at),
            "released_at": _iso(self.released_at),
            "lease_ttl": self.lease_ttl,
            "lease_expires_at": _iso(self.lease_expires_at),
            "queue": [
                {"pool": p.pool, "position": p.position, "reason": p.reason, "check": p.check,
                 "holding": p.holding}
                for p in self.queue
            ],
        }
        if self.state is not None:
            data["state"] = self.state
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestView:
        """The inverse of ``as_dict`` (what a remote client reads back)."""
        values = dict(data)
        for key in ("created", "updated", "allocated_at", "released_at", "lease_expires_at"):
            if values.get(key) is not None:
                values[key] = datetime.fromisoformat(values[key])
        values["queue"] = tuple(QueuePlace(**place) for place in values.get("queue", ()))
        return cls(**values)


#: The longest ``older_than`` of a prune (seconds): a hundred years.
MAX_RETENTION = 100 * 365 * 24 * 3600
#: The shortest a server's ``--keep-history`` (seconds): clients still read what ended a
#: moment ago (a holder hears its request was preempted at its next heartbeat).
MIN_KEEP_HISTORY = 3600


@dataclass(frozen=True, slots=True)
class EventView:
    """A change in a request's life (``created``, ``allocated``, ``preempted``, ``retried``,
    ``released``, ``lease_expired``, ...), with the reason given then."""

    at: datetime
    kind: str
    request_id: str
    #: The pool it happened on, when there was one (None once the pool is deleted).
    pool: str | None
    message: str
    #: What the message says, for programs: a preemption's rule and preemptor (``by``), a
    #: retry attempt's previous attempt.
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EventView:
        return cls(**{**data, "at": datetime.fromisoformat(data["at"])})


@dataclass(frozen=True, slots=True)
class PolicyView:
    id: str
    pool: str
    pool_id: str
    component: str
    component_type: str
    priority: int
    reserved: dict[str, int]
    limit: dict[str, int]
    #: Per pool key, what the engine enforces: omitted keys reserve 0, limit the pool total.
    effective_reserved: dict[str, int]
    effective_limit: dict[str, int]
    created: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyView:
        return cls(**{**data, "created": datetime.fromisoformat(data["created"])})


@dataclass(frozen=True, slots=True)
class ComponentView:
    """A component (an orchestrator or a step operator: who asks for units), known from its
    first policy: the pools it has a policy on, and its live requests."""

    id: str
    name: str
    type: str
    pools: list[str]
    allocated: int
    queued: int
    created: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComponentView:
        return cls(**{**data, "created": datetime.fromisoformat(data["created"])})


@dataclass(frozen=True, slots=True)
class PoolView:
    id: str
    name: str
    description: str | None
    capacity: dict[str, int]
    occupied: dict[str, int]
    queue_length: int
    created: datetime
    updated: datetime
    policies: tuple[PolicyView, ...] = ()
    active_requests: tuple[RequestView, ...] = ()
    queued_requests: tuple[RequestView, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["policies"] = [p.as_dict() for p in self.policies]
        data["active_requests"] = [r.as_dict() for r in self.active_requests]
        data["queued_requests"] = [r.as_dict() for r in self.queued_requests]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolView:
        return cls(**{
            **data,
            "created": datetime.fromisoformat(data["created"]),
            "updated": datetime.fromisoformat(data["updated"]),
            "policies": tuple(PolicyView.from_dict(p) for p in data.get("policies", ())),
            "active_requests": tuple(
                RequestView.from_dict(r) for r in data.get("active_requests", ())
            ),
            "queued_requests": tuple(
                RequestView.from_dict(r) for r in data.get("queued_requests", ())
            ),
        })


@dataclass(frozen=True, slots=True)
class PruneView:
    """What a prune deleted (or, ``dry_run``, would delete): what ended before ``before``."""

    before: datetime
    dry_run: bool = False
    requests: int = 0
    events: int = 0
    workloads: int = 0
    operations: int = 0
    #: False: more is due, left for the next prune (one given a number of batches).
    complete: bool = True

    def adding(self, what: str, count: int) -> PruneView:
        return replace(self, **{what: getattr(self, what) + count})

    def then(self, later: PruneView) -> PruneView:
        """This prune and the ``later`` one that went on with it, as one: the counts summed,
        the later cutoff (what ended before it is gone when ``later`` is complete)."""
        summed = {what: count + getattr(later, what) for what, count in self.counts().items()}
        return replace(later, **summed)

    def counts(self) -> dict[str, int]:
        """How many of each kind: requests, events, workloads, operations."""
        return {what: getattr(self, what) for what in PRUNED_KINDS}

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PruneView:
        return cls(**{**data, "before": datetime.fromisoformat(data["before"])})


#: Told what a prune has deleted so far, as it goes (``fairpool prune`` shows it).
PruneProgress = Callable[[PruneView], None]


@dataclass(frozen=True, slots=True)
class PassSummary:
    """What one reconcile pass changed."""

    granted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    #: Allocations released because their holder stopped sending heartbeats.
    expired: list[str] = field(default_factory=list)
    waiting: int = 0
    seconds: float = 0.0
    #: Per granted request, seconds from its creation to its allocation.
    waits: list[float] = field(default_factory=list)
    #: Requests created in the pass's own transaction: nobody waited for them before it.
    created: list[str] = field(default_factory=list)

    def dequeued(self) -> set[str]:
        """The requests the pass took out of the queue (granted or rejected): what long-polls
        wait for. The others it changed were not queued (preempted, expired) or are new
        (retries), so nobody waits for them to leave the queue yet; nor for those created in
        its own transaction (most submits are allocated at once): their creator has the
        answer, and nobody else knew them (on PostgreSQL, no NOTIFY for them)."""
        return {*self.granted, *self.rejected} - set(self.created)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PassSummary:
        return cls(**data)
