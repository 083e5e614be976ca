"""The engine's value objects: a snapshot goes in, a plan comes out.

Amounts are exact integers per resource key. Everything here is immutable; the engine never
mutates its input, so a snapshot can be replayed and compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

Amounts = Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Node:
    """A node of the quota forest (a pool, a policy's leaf, a queue, ...).

    ``capacity`` holds the physical units that exist here. A key absent from ``capacity`` is
    unbounded when it is in ``open_keys`` (or when ``open_keys`` is None), else zero: front-ends
    decide which, because ZenML and Kueue disagree on what "absent" means.
    """

    id: str
    #: How explanations name the node, e.g. "pool training-gpus".
    name: str
    parent: str | None = None
    capacity: Amounts = field(default_factory=dict)
    open_keys: frozenset[str] | None = None
    #: Units this node is entitled to (ZenML reserved, YTsaurus strong guarantee, Kueue nominal).
    guarantee: Amounts = field(default_factory=dict)
    #: Hard cap on the subtree's usage; never picks victims.
    limit: Amounts = field(default_factory=dict)
    #: On a queue node: seconds a capacity-blocked waiter may be passed by smaller requests
    #: before it holds the units it needs (None: it never holds, pure backfill).
    backfill_after: float | None = None
    #: On a queue node: whether its waiters may preempt running work (False: Kueue's
    #: ``withinClusterQueue: Never``).
    preempts: bool = True
    #: On a queue node: whether entries that fit their leaves' unused guarantee go before those
    #: that must borrow (pools & policies). False: priority, then oldest only (Kueue's queues,
    #: where a queue's flavors are tried in listed order whatever their quotas).
    guarantee_first: bool = True

    def cap(self, key: str) -> int | None:
        """Capacity for ``key`` here: an int, or None when unbounded."""
        value = self.capacity.get(key)
        if value is not None:
            return value
        if self.open_keys is None or key in self.open_keys:
            return None
        return 0


@dataclass(frozen=True, slots=True)
class Charge:
    """Units a placement takes at one leaf (and so at each of its ancestors)."""

    leaf: str
    amounts: Amounts


@dataclass(frozen=True, slots=True)
class Placement:
    """One way to run a request: where it queues, what it charges, the priority it carries."""

    queue: str
    charges: tuple[Charge, ...]
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """A waiting request: tried placement by placement, granted at most one of them."""

    id: str
    #: Queue order and waiting time are measured from here (seconds, any epoch).
    queued_at: float
    placements: tuple[Placement, ...]
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Allocation:
    """A granted request that currently holds its placement's units."""

    request_id: str
    placement: Placement
    allocated_at: float
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: Mapping[str, Node]
    allocations: tuple[Allocation, ...] = ()
    queue: tuple[Request, ...] = ()
    #: Allocations that queue again when preempted, by id: each as this request (same id),
    #: decided in the same pass in queue order, so before what it outranks. Others just end.
    requeue: Mapping[str, Request] = field(default_factory=dict)


class Check(StrEnum):
    """The check that failed, in the order the engine runs them."""

    #: Non-preemptible demand above the leaf's guarantee: can never fit.
    RESERVED = "reserved"
    #: Non-preemptible demand fits the guarantee, but other non-preemptible work uses it now.
    RESERVED_IN_USE = "reserved_in_use"
    #: Subtree usage would exceed a limit.
    LIMIT = "limit"
    #: Not enough units (or the key does not exist here).
    CAPACITY = "capacity"


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a placement did not get its units, with the numbers."""

    check: Check
    node: str
    key: str
    requested: int
    #: The bound that failed: capacity, limit or guarantee.
    bound: int
    #: Units already counted against that bound (0 for a hard rejection).
    in_use: int
    message: str
    #: The other keys the placement is short of now, which the message names after the
    #: first (a waiter who freed the one named found it waited on; helper-89).
    also_short: tuple[str, ...] = ()


class Rule(StrEnum):
    """Why a running allocation may be preempted."""

    #: The waiter's priority is strictly higher than the victim's.
    PRIORITY = "priority"
    #: The waiter is within its share on every metered key; the victim borrows on a short one.
    RECLAIM = "reclaim"


@dataclass(frozen=True, slots=True)
class Grant:
    request_id: str
    placement_index: int


@dataclass(frozen=True, slots=True)
class Preemption:
    victim_id: str
    preemptor_id: str
    rule: Rule
    message: str


@dataclass(frozen=True, slots=True)
class Rejection:
    """Never queued: no placement could fit even on an empty system. One reason per placement."""

    request_id: str
    reasons: tuple[Reason, ...]


@dataclass(frozen=True, slots=True)
class WaitingGroup:
    """Requests waiting in one queue for one reason (a stretch of identical requests).

    ``fairpool.engine.explain`` turns groups into per-request queue positions.
    """

    queue: str
    placement_index: int
    reason: Reason
    #: (queued_at, request id), in queue order.
    members: tuple[tuple[float, str], ...]
    #: The part of the queue order before time: (0 within guarantee | 1 borrowing, -priority).
    rank: tuple[int, int] = (0, 0)
    #: The member that holds free units back from requests behind it, if any.
    holder: str | None = None
    #: False: these requests can never fit on this queue (explained, not queued there).
    eligible: bool = True


@dataclass(frozen=True, slots=True)
class Plan:
    grants: tuple[Grant, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    #: May list a request granted elsewhere in the same pass; see ``explain``.
    waiting: tuple[WaitingGroup, ...] = ()
