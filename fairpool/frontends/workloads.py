"""Scheduler config (seed 004), part 2: workloads, routing, flavor assignment, compilation.

Pure: no I/O, no clock (time is an argument), no randomness. ``docs/config.md`` states the
semantics and every decision taken where the seed is silent.

API, in the order a reconcile pass uses it::

    validate_workload(workload_id, *, labels, instance_type, accelerator_type, market_type,
                      cloud_resource_id, workload_type, priority, demand, submitted_at) -> Workload
    route(config, workload) -> Route            # rules top to bottom, first match wins
    compile_snapshot(config, waiting, running, now) -> Compiled    # Compiled.snapshot: engine input
    decide(compiled, plan) -> Outcome           # plan = fairpool.engine.reconcile.reconcile(...)
    schedule(config, waiting, running, now) -> Outcome             # the three steps at once
    explain(config, workload, running, now) -> Decision            # ``fairpool config explain``
    queue_usage(config, running) -> tuple[QuotaUsage, ...]         # usage vs quota

``waiting`` is a sequence of ``Workload``; ``running`` a sequence of ``RunningWorkload`` (a
workload and the ``Admission`` it was given: queue, one flavor per resource group, priority,
time). Waiting workloads are routed again on every pass, with the config of that pass; a
running one keeps its admission. ``Outcome.decisions`` maps every waiting workload's id to a
``Decision`` (admitted with its ``Admission`` to store, queued with its position, or rejected),
each with a one-line ``reason`` and ``notes`` saying why earlier rules and other flavors did not
apply; ``Outcome.evictions`` lists the running workloads preempted in the pass.

How the config becomes the engine's quota forest: each queue is a root node that holds its
queue (priority, then FIFO; ``preempts`` only with ``within_resource_queue: lower_priority``),
with one leaf per flavor of its resource groups whose capacity is that flavor's quotas
(``nominal_quota`` omitted = unbounded, 0 blocks). A workload becomes one placement per
combination of matching flavors (one per resource group, listed order first), charging each
group's leaf with the workload's demand of that group's covered resources. Amounts are the
config's exact milli-units. A passthrough queue is a root with no leaves: its placement charges
nothing, so the engine admits it at once.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from fairpool.engine.explain import QueueEntry, queue_entries
from fairpool.engine.model import (
    Allocation,
    Charge,
    Node,
    Placement,
    Plan,
    Reason,
    Request,
    Snapshot,
)
from fairpool.engine.reconcile import reconcile
from fairpool.errors import InvalidInput, clipped, mapping, shown, string, validate_int
from fairpool.frontends.config import (
    MAX_NAME,
    MAX_PRIORITY,
    MAX_QUOTA,
    QUOTA_DECIMALS,
    RESERVED_LABEL_KEYS,
    MatchExpression,
    OnViolation,
    Operator,
    PriorityPolicy,
    Resource,
    ResourceGroup,
    ResourceQueue,
    SchedulerConfig,
)
from fairpool.frontends.names import MAX_LABELS, bounded_text, check_key_count, check_printing
from fairpool.frontends.pools import BACKFILL_AFTER_SECONDS

__all__ = [
    "MARKET_TYPES",
    "WORKLOAD_TYPES",
    "Admission",
    "Candidate",
    "Compiled",
    "Decision",
    "Eviction",
    "Outcome",
    "Parts",
    "QuotaUsage",
    "Route",
    "RuleMiss",
    "RunningWorkload",
    "Status",
    "Workload",
    "admitted_queue",
    "compile_snapshot",
    "decide",
    "explain",
    "format_units",
    "missing_from",
    "queue_usage",
    "route",
    "schedule",
    "selector_mismatch",
    "validate_workload",
]

#: Values the seed lists for two of the reserved keys (the others are free text).
MARKET_TYPES: Final = ("SPOT", "ON_DEMAND")
WORKLOAD_TYPES: Final = ("service", "job", "workspace")

_RESOURCES: Final = frozenset(r.value for r in Resource)


# -- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A job, service or workspace asking to run. Build it with ``validate_workload``."""

    id: str
    #: Custom tags and the reserved keys, in one read-only mapping (what selectors see).
    labels: Mapping[str, str] = field(hash=False)
    #: The priority the submitter asked for; None: the matching rule's default.
    priority: int | None
    #: Exact milli-units per resource (``gpu``, ``cpu``, ``memory_gb``, ``tpu``); only
    #: positive amounts are kept.
    demand: Mapping[str, int] = field(hash=False)
    #: Queue order (FIFO among equal priorities) and waiting time are measured from here
    #: (seconds, any epoch): its submission, or its last requeue after a preemption (as
    #: Kueue's default requeuing timestamp, its eviction).
    submitted_at: float


def validate_workload(
    workload_id: object,
    *,
    labels: object = None,
    instance_type: object = None,
    accelerator_type: object = None,
    market_type: object = None,
    cloud_resource_id: object = None,
    workload_type: object = None,
    priority: object = None,
    demand: object = None,
    submitted_at: object,
) -> Workload:
    """Check a submission and build its ``Workload``; raises ``InvalidInput`` naming the field.

    ``labels`` are the custom tags; the reserved keys come from their own arguments (a custom
    tag may not use one). ``demand`` is in units as a user writes them (``8``, ``0.5``,
    ``"1.25"``), at most 3 decimals; it is stored as exact milli-units.
    """
    ident = _text("id", workload_id, printing=True)
    labels = _mapping("labels", labels)
    check_key_count("labels", labels, MAX_LABELS)
    merged: dict[str, str] = {}
    for key, value in labels.items():
        name = _text("labels key", key, printing=True)
        if name in RESERVED_LABEL_KEYS:
            raise InvalidInput(
                f"labels.{name}", value,
                f"{name!r} is a reserved label key; set it with its own field "
                f"({name.replace('-', '_')}, --{name}), not as a custom tag",
            )
        merged[name] = _text(f"labels.{name}", value, allow_empty=True)
    reserved = {
        "instance-type": instance_type,
        "accelerator-type": accelerator_type,
        "market-type": market_type,
        "cloud-resource-id": cloud_resource_id,
        "workload-type": workload_type,
    }
    allowed = {"market-type": MARKET_TYPES, "workload-type": WORKLOAD_TYPES}
    for key, value in reserved.items():
        if value is None:
            continue
        # Named as the SDK and the API take it (market_type), as every other field here: the
        # label's key (market-type) was no field of an HTTP body (helper-83).
        field = key.replace("-", "_")
        text = _text(field, value)
        if key in allowed and text not in allowed[key]:
            meant = next((a for a in allowed[key] if a.lower() == text.lower()), None)
            hint = "" if meant is None else f"; did you mean {meant!r}?"
            raise InvalidInput.from_message(field, f"{field}: must be one of "
                                            f"{', '.join(allowed[key])} (got {shown(value)}{hint})")
        merged[key] = text
    requested = None if priority is None else validate_int("priority", priority, 0, MAX_PRIORITY)
    amounts: dict[str, int] = {}
    for key, value in _mapping("demand", demand).items():
        if string("demand key", key) not in _RESOURCES:
            raise InvalidInput(
                "demand", key, f"unknown resource; one of {', '.join(r.value for r in Resource)}"
            )
        milli = _milli(str(key), value)
        if milli:
            amounts[str(key)] = milli
    if (
        isinstance(submitted_at, bool) or not isinstance(submitted_at, int | float)
        or not math.isfinite(submitted_at)
    ):
        raise InvalidInput("submitted_at", submitted_at, "must be a finite number of seconds")
    return Workload(
        id=ident,
        labels=MappingProxyType(merged),
        priority=requested,
        demand=MappingProxyType(amounts),
        submitted_at=float(submitted_at),
    )


def _mapping(field_name: str, value: object) -> Mapping[Any, object]:
    """A mapping given (None: an empty one)."""
    return {} if value is None else mapping(field_name, value)


def _text(
    field_name: str, value: object, *, allow_empty: bool = False, printing: bool = False
) -> str:
    """Text up to a name's length; ``printing``: a name (an id, a label key), which prints
    as itself. A label's value is free text, as a request's (tables escape what does not
    print)."""
    if not string(field_name, value).strip() and not allow_empty:
        raise InvalidInput(field_name, value, "must be a non-empty string")
    text = bounded_text(field_name, value, MAX_NAME)
    return check_printing(field_name, text) if printing else text


#: Characters of an amount written as text: 13 digits, a point, 3 decimals and then some.
MAX_DEMAND_TEXT: Final = 40
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", re.ASCII)


def _milli(resource: str, value: object) -> int:
    """Units as written -> exact milli-units (floats through their shortest repr, as quotas);
    each way to fail says what is wrong, in the words the config's quotas use."""
    field_name = f"demand.{resource}"
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise InvalidInput(field_name, value, "must be a number")
    if isinstance(value, str) and len(value) > MAX_DEMAND_TEXT:
        raise InvalidInput(field_name, clipped(value), f"must be at most {MAX_DEMAND_TEXT} "
                           "characters")
    # Text is a plain decimal: Decimal alone takes "1_000", "+1", " 1" and other scripts'
    # decimal digits (Arabic-Indic, full-width), none of which a user means as a count.
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise InvalidInput(field_name, value, "must be a number")
    try:
        exact = Decimal(value if isinstance(value, int | Decimal) else str(value))
    except InvalidOperation:
        raise InvalidInput(field_name, value, "must be a number") from None
    if not exact.is_finite():
        raise InvalidInput(field_name, value, "must be a finite number")
    if exact.is_signed():  # -0 too: it would be a demand of nothing, asked as negative
        raise InvalidInput(field_name, value, "must be >= 0" if exact else "must be >= 0, unsigned")
    if exact > MAX_QUOTA:
        raise InvalidInput(field_name, value, f"must be at most {MAX_QUOTA}")
    milli = exact.scaleb(QUOTA_DECIMALS)
    if milli != milli.to_integral_value():
        raise InvalidInput(field_name, value, f"must have at most {QUOTA_DECIMALS} decimal places")
    return int(milli)


def format_units(milli: int) -> str:
    """Milli-units as a user writes them: ``64000`` -> ``64``, ``500`` -> ``0.5``."""
    return f"{Decimal(milli).scaleb(-QUOTA_DECIMALS).normalize():f}"


# -- routing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleMiss:
    """Why one scheduling rule did not take the workload."""

    rule: int
    reason: str

    def __str__(self) -> str:
        return f"scheduling_rules[{self.rule}]: {self.reason}"


@dataclass(frozen=True)
class Route:
    """Where the scheduling rules send a workload.

    ``rule`` is the index of the rule that matched. A config with no rules routes every
    workload nowhere (``queue`` and ``rule`` None, ``failure`` None): it is admitted with no
    quota. A workload no rule matches has ``failure`` set.
    """

    queue: str | None
    priority: int
    rule: int | None = None
    #: The priority the workload asked for (differs from ``priority`` when clamped).
    requested: int | None = None
    #: Why each rule before the matching one (every rule, on failure) did not apply.
    misses: tuple[RuleMiss, ...] = ()
    failure: str | None = None

    def notes(self) -> tuple[str, ...]:
        """The misses, then a clamp, as lines for explanations."""
        lines = [str(miss) for miss in self.misses]
        if self.requested is not None and self.requested != self.priority:
            lines.append(
                f"scheduling_rules[{self.rule}]: requested priority {self.requested} clamped "
                f"to {self.priority} (on_violation: force_update)"
            )
        return tuple(lines)


def route(config: SchedulerConfig, workload: Workload) -> Route:
    """Rules top to bottom; the first whose selector matches and whose priority policy accepts
    the workload's priority wins (a policy that rejects makes the rule fall through)."""
    requested = workload.priority
    if not config.scheduling_rules:
        return Route(queue=None, priority=requested or 0, requested=requested)
    misses: list[RuleMiss] = []
    for index, rule in enumerate(config.scheduling_rules):
        mismatch = selector_mismatch(rule.selector, workload.labels)
        if mismatch is not None:
            misses.append(RuleMiss(index, f"selector: {mismatch}"))
            continue
        priority, violation = _priority(rule.priority_policy, requested)
        if violation is not None:
            misses.append(RuleMiss(index, violation))
            continue
        return Route(rule.resource_queue, priority, index, requested, tuple(misses))
    return Route(
        queue=None, priority=requested or 0, requested=requested, misses=tuple(misses),
        failure="no scheduling rule matched",
    )


def _priority(policy: PriorityPolicy | None, requested: int | None) -> tuple[int, str | None]:
    """The priority a matching rule assigns, and why its policy rejects it (None: accepted).

    Bounds apply to a requested priority only: one that requests none gets the default (0
    when unset), as the seed and ``warnings`` say. An unset ``on_violation`` rejects.
    """
    if policy is None:
        return requested or 0, None
    if requested is None:
        return policy.effective_default, None
    low = policy.min or 0
    high = MAX_PRIORITY if policy.max is None else policy.max
    if low <= requested <= high:
        return requested, None
    if policy.on_violation is OnViolation.FORCE_UPDATE:
        return min(max(requested, low), high), None
    how = "reject" if policy.on_violation is not None else "unset, so reject"
    return requested, (
        f"priority {requested} is outside [{low}, {high}] (on_violation: {how}), falls through"
    )


def selector_mismatch(
    selector: Iterable[MatchExpression], labels: Mapping[str, str]
) -> str | None:
    """The first expression the labels fail, in words; None when all match (Kubernetes
    semantics: ``not_in`` and ``does_not_exist`` match an absent label)."""
    for expression in selector:
        key, value = expression.key, labels.get(expression.key)
        # Quoted as the label's value is: unquoted, [''] read as [] and ['us, eu'] as two.
        listed = f"[{', '.join(map(repr, expression.values))}]"
        if expression.operator is Operator.IN and value not in expression.values:
            got = "is not set" if value is None else f"is {value!r}"
            return f"{key} {got}, not in {listed}"
        if expression.operator is Operator.NOT_IN and value in expression.values:
            return f"{key} is {value!r}, which not_in {listed} excludes"
        if expression.operator is Operator.EXISTS and value is None:
            return f"{key} is not set (exists)"
        if expression.operator is Operator.DOES_NOT_EXIST and value is not None:
            return f"{key} is set to {value!r} (does_not_exist)"
    return None


# -- admissions and usage --------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """What a workload was admitted with; it keeps it until it ends."""

    #: None: admitted by a config with no scheduling rules (counted nowhere).
    queue: str | None
    #: One flavor per resource group of the queue, in group order (empty: passthrough).
    flavors: tuple[str, ...]
    priority: int
    admitted_at: float


@dataclass(frozen=True)
class RunningWorkload:
    workload: Workload
    admission: Admission


@dataclass(frozen=True)
class QuotaUsage:
    """Usage against one (queue, flavor, resource) quota; milli-units."""

    queue: str
    #: None on a passthrough queue (no flavors, no quota).
    flavor: str | None
    resource: str
    used_milli: int
    #: None: unlimited.
    nominal_quota_milli: int | None
    #: Running workloads admitted with this flavor (on a passthrough queue: in the queue).
    workloads: int


def admitted_reason(queue: str, flavors: Sequence[str], priority: int) -> str:
    """What an admitted workload's reason says of its admission."""
    if not flavors:
        return f"admitted to passthrough queue {queue} (no quota)"
    return f"admitted to queue {queue} with flavor {' + '.join(flavors)} at priority {priority}"


def repriced_reason(queue: str, flavors: Sequence[str], priority: int, was: int | None,
                    version: int | None) -> str:
    """A running workload's reason once config ``version`` changed its priority from ``was``."""
    return (f"{admitted_reason(queue, flavors, priority)} "
            f"(was {was} before config version {version})")


def queue_usage(
    config: SchedulerConfig, running: Iterable[RunningWorkload]
) -> tuple[QuotaUsage, ...]:
    """Every (queue, flavor, covered resource) in config order, with what running workloads use.
    A passthrough queue gets one row per resource. Workloads whose admission this config
    cannot charge (their queue is gone) are left out."""
    used: dict[tuple[str, str | None, str], int] = defaultdict(int)
    counts: dict[tuple[str, str | None], int] = defaultdict(int)
    for item in running:
        queue = admitted_queue(config, item.admission)
        if queue is None:
            continue
        if queue.is_passthrough:
            counts[(queue.name, None)] += 1
            for resource, amount in item.workload.demand.items():
                used[(queue.name, None, resource)] += amount
        for group, name in zip(queue.resource_groups, item.admission.flavors, strict=True):
            counts[(queue.name, name)] += 1
            for resource, amount in _group_demand(group, item.workload.demand).items():
                used[(queue.name, name, resource)] += amount
    rows: list[QuotaUsage] = []
    for queue in config.resource_queues:
        if queue.is_passthrough:
            rows.extend(
                QuotaUsage(queue.name, None, r.value, used[(queue.name, None, r.value)], None,
                           counts[(queue.name, None)])
                for r in Resource
            )
        for group in queue.resource_groups:
            for flavor in group.flavors:
                rows.extend(
                    QuotaUsage(queue.name, flavor.name, r.value,
                               used[(queue.name, flavor.name, r.value)], flavor.quota_milli(r),
                               counts[(queue.name, flavor.name)])
                    for r in group.covered_resources
                )
    return tuple(rows)


def admitted_queue(config: SchedulerConfig, admission: Admission) -> ResourceQueue | None:
    """The queue an admission charges in this config, or None when it charges nothing here
    (no rules when admitted, or a queue this config does not have in that shape)."""
    if admission.queue is None:
        return None
    try:
        queue = config.queue(admission.queue)
    except KeyError:
        return None
    groups = queue.resource_groups
    if len(groups) != len(admission.flavors) or any(
        all(f.name != flavor for f in group.flavors)
        for group, flavor in zip(groups, admission.flavors, strict=True)
    ):
        return None
    return queue


def missing_from(config: SchedulerConfig, admission: Admission) -> str:
    """What ``config`` lacks that an admission charged (``admitted_queue`` found it charges
    nothing there), for its reason: ``no queue q`` (it said "no such queue or flavor",
    helper-89). A queue's spec cannot change once applied, so a queue kept by name differs
    only in a config stored before that rule."""
    try:
        config.queue(admission.queue or "")
    except KeyError:
        return f"no queue {admission.queue}"
    return f"queue {admission.queue} with other flavors"


def _group_demand(group: ResourceGroup, demand: Mapping[str, int]) -> dict[str, int]:
    """The part of a demand a resource group governs. Resources no group of the queue covers
    are not governed by it (the reservation example covers only gpu)."""
    return {r.value: demand[r.value] for r in group.covered_resources if r.value in demand}


# -- compilation -----------------------------------------------------------------------------


def _queue_node(queue: str) -> str:
    # JSON lists keep ids unambiguous whatever characters names contain.
    return json.dumps(["queue", queue])


def _flavor_node(queue: str, flavor: str) -> str:
    return json.dumps(["flavor", queue, flavor])


def _nodes(config: SchedulerConfig) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for queue in config.resource_queues:
        root = _queue_node(queue.name)
        nodes[root] = Node(
            id=root,
            name=f"queue {queue.name}",
            backfill_after=BACKFILL_AFTER_SECONDS,
            preempts=queue.preemption is not None and queue.preemption.preempts_lower_priority,
            guarantee_first=False,
        )
        for group in queue.resource_groups:
            for flavor in group.flavors:
                leaf = _flavor_node(queue.name, flavor.name)
                nodes[leaf] = Node(
                    id=leaf,
                    name=f"flavor {flavor.name}",
                    parent=root,
                    # Absent keys are unbounded (open_keys None); an explicit 0 blocks.
                    capacity={
                        q.name.value: q.nominal_quota_milli
                        for q in flavor.resources
                        if q.nominal_quota_milli is not None
                    },
                )
    return nodes


def _placement(
    queue: ResourceQueue, flavors: Sequence[str], demand: Mapping[str, int], priority: int
) -> Placement:
    charges = []
    for group, flavor in zip(queue.resource_groups, flavors, strict=True):
        amounts = _group_demand(group, demand)
        if amounts:
            charges.append(Charge(_flavor_node(queue.name, flavor), amounts))
    return Placement(_queue_node(queue.name), tuple(charges), priority)


def _matching_flavors(
    selectors: Mapping[str, Sequence[MatchExpression]],
    queue: ResourceQueue,
    labels: Mapping[str, str],
) -> tuple[list[list[str]], list[str]]:
    """Per resource group, the flavors whose selector matches, in listed order; and why each
    other flavor does not."""
    matching: list[list[str]] = []
    notes: list[str] = []
    for group in queue.resource_groups:
        found = []
        for flavor in group.flavors:
            mismatch = selector_mismatch(selectors[flavor.name], labels)
            if mismatch is None:
                found.append(flavor.name)
            else:
                notes.append(f"flavor {flavor.name}: selector: {mismatch}")
        matching.append(found)
    return matching, notes


class Status(StrEnum):
    """A decision about a waiting workload."""

    ADMITTED = "admitted"
    QUEUED = "queued"
    REJECTED = "rejected"
    #: No rule routes it (seed 004: "a workload matching no rule is failed").
    FAILED = "failed"


@dataclass(frozen=True)
class Decision:
    """What a pass decided for one waiting workload, and why."""

    workload_id: str
    status: Status
    route: Route
    #: One line: the outcome and its main reason.
    reason: str
    #: Why earlier rules and other flavors did not apply, one line each.
    notes: tuple[str, ...] = ()
    #: Admitted: what to store for the running workload.
    admission: Admission | None = None
    #: Queued: 1 = next in its queue (priority, then FIFO).
    position: int | None = None
    #: Admitted: the workloads preempted to make room for it.
    preempted: tuple[str, ...] = ()

    @property
    def queue(self) -> str | None:
        return self.route.queue

    @property
    def priority(self) -> int:
        return self.route.priority


@dataclass(frozen=True)
class Eviction:
    """A running workload preempted in this pass."""

    workload_id: str
    preemptor_id: str
    queue: str
    reason: str


@dataclass(frozen=True)
class Candidate:
    """A waiting workload the engine decides: its route, its placements and the flavor
    combination each stands for (same order), and why other flavors did not match."""

    workload: Workload
    route: Route
    placements: tuple[Placement, ...]
    combinations: tuple[tuple[str, ...], ...]
    mismatches: tuple[str, ...]


@dataclass(frozen=True)
class Compiled:
    """A config and its workloads as the engine sees them, and what is needed to read back
    its plan."""

    snapshot: Snapshot
    #: The waiting workloads the engine decides (``decide`` adds the requeued victims').
    candidates: Mapping[str, Candidate]
    #: Decided without the engine: routing failures, no flavor matched, no rules at all.
    decided: Mapping[str, Decision]
    #: Running workloads whose queue (or flavor) this config does not have: they keep running
    #: and count against nothing.
    orphans: tuple[str, ...]
    #: Running workloads the snapshot charges, by id: their admissions (for eviction reasons).
    admissions: Mapping[str, Admission]
    #: Waiting workload ids in the order given (the order of ``Outcome.decisions``).
    order: tuple[str, ...]
    #: Running workloads whose rule now gives another priority: the one they compete at.
    repriced: Mapping[str, int] = field(default_factory=dict)
    #: Running workloads that cannot queue again (no rule routes them now, say): their
    #: decision, should they be preempted.
    unqueueable: Mapping[str, Decision] = field(default_factory=dict)
    #: For the next compile (``compile_snapshot``'s ``reuse``).
    parts: Parts = field(default_factory=lambda: Parts())


@dataclass(frozen=True)
class _Fit:
    """A routed workload's flavor combinations and their placements (one each, same order),
    and why other flavors did not match: its ``Candidate`` but for the time it queues from."""

    #: What workloads of one shape share (``shapes``): queue, priority, demand, combinations.
    shape: tuple[object, ...]
    placements: tuple[Placement, ...]
    combinations: tuple[tuple[str, ...], ...]
    mismatches: tuple[str, ...]

    def candidate(self, workload: Workload, path: Route) -> Candidate:
        return Candidate(workload, path, self.placements, self.combinations, self.mismatches)


#: A workload's fit, or its decision when the engine has none to make (no rule routes it, no
#: flavor matched); None when that depends on the time: no rules at all, admitted ``now``.
_Found = _Fit | Decision | None


@dataclass(frozen=True)
class _Routed:
    """What a compile worked out for a waiting workload."""

    workload: Workload
    route: Route
    found: _Found


@dataclass(frozen=True)
class _Held:
    """What a compile worked out for a running workload."""

    running: RunningWorkload
    #: The queue its admission charges (None: none in this config, ``admitted_queue``); then
    #: its route now, its admission at the priority it competes at, and its allocation.
    queue: ResourceQueue | None
    route: Route | None = None
    admission: Admission | None = None
    allocation: Allocation | None = None
    #: In a queue that preempts, what it would queue again as, once ``fitted``: not worked
    #: out until a pass has something waiting.
    found: _Found = None
    fitted: bool = False


@dataclass(frozen=True)
class Parts:
    """What ``compile_snapshot`` worked out per workload under ``config``, none of it
    depending on the time: routes, flavor fits, a running workload's allocation. Given to the
    next compile (``Compiled.parts``), a workload equal to the one a part was worked out from
    (usually the very object) takes it as it is: routing and flavors depend on the config and
    the workload only. Another config takes none."""

    config: SchedulerConfig | None = None
    waiting: Mapping[str, _Routed] = field(default_factory=dict)
    running: Mapping[str, _Held] = field(default_factory=dict)
    #: The placements tuple of each shape in use, so that new workloads share it (``_fit``).
    shapes: Mapping[tuple[object, ...], tuple[Placement, ...]] = field(default_factory=dict)


def compile_snapshot(
    config: SchedulerConfig,
    waiting: Sequence[Workload],
    running: Sequence[RunningWorkload],
    now: float,
    reuse: Parts | None = None,
) -> Compiled:
    """Route every waiting workload, assign its candidate flavors and build the snapshot,
    taking what ``reuse`` (the last compile's ``Compiled.parts``) worked out for equal
    workloads under this config.

    A running workload the engine preempts queues again in the same pass, from ``now``."""
    if reuse is None or reuse.config is not config:
        reuse = Parts()
    nodes = _nodes(config)
    selectors = {flavor.name: flavor.selector for flavor in config.resource_flavors}
    # Workloads of one shape share one placements tuple, so the engine groups them cheaply.
    shapes = dict(reuse.shapes)
    held: dict[str, _Held] = {}
    routed: dict[str, _Routed] = {}
    candidates: dict[str, Candidate] = {}
    allocations: list[Allocation] = []
    requeue: dict[str, Request] = {}
    orphans: list[str] = []
    admissions: dict[str, Admission] = {}
    repriced: dict[str, int] = {}
    unqueueable: dict[str, Decision] = {}
    # Only running work in a queue that preempts can be a victim, and only when something
    # waits: those get what they would queue again as (the rest of a pass is cheaper).
    victims: list[_Held] = []
    for item in running:
        part = reuse.running.get(item.workload.id)
        if part is None or not (part.running is item or part.running == item):
            part = _held(config, item)
        held[item.workload.id] = part
        if part.queue is None:
            if item.admission.queue is not None:
                orphans.append(item.workload.id)
            continue
        assert part.admission is not None and part.allocation is not None
        admissions[item.workload.id] = part.admission
        if part.admission.priority != item.admission.priority:
            repriced[item.workload.id] = part.admission.priority
        allocations.append(part.allocation)
        if part.queue.preemption is not None and part.queue.preemption.preempts_lower_priority:
            victims.append(part)

    requests: list[Request] = []
    decided: dict[str, Decision] = {}
    for workload in waiting:
        waits = reuse.waiting.get(workload.id)
        if waits is None or not (waits.workload is workload or waits.workload == workload):
            path = route(config, workload)
            waits = _Routed(workload, path, _fit(config, selectors, shapes, workload, path))
        routed[workload.id] = waits
        if not isinstance(waits.found, _Fit):
            decided[workload.id] = _refusal(workload.id, waits.route, waits.found, now)
            continue
        requests.append(Request(workload.id, workload.submitted_at, waits.found.placements))
        candidates[workload.id] = waits.found.candidate(workload, waits.route)
    for part in victims if requests else ():
        workload, again = part.running.workload, part.route
        assert again is not None
        if not part.fitted:
            part = held[workload.id] = replace(
                part, found=_fit(config, selectors, shapes, workload, again), fitted=True
            )
        # Its candidate is made by ``decide`` once preempted: most never are.
        if isinstance(part.found, _Fit):
            requeue[workload.id] = Request(workload.id, now, part.found.placements)
        else:
            unqueueable[workload.id] = _refusal(workload.id, again, part.found, now)
    snapshot = Snapshot(now, nodes, tuple(allocations), tuple(requests), requeue)
    in_use = [p.found for p in routed.values()] + [p.found for p in held.values()]
    parts = Parts(config, routed, held,
                  {f.shape: f.placements for f in in_use if isinstance(f, _Fit)})
    return Compiled(
        snapshot, candidates, decided, tuple(orphans), admissions,
        tuple(w.id for w in waiting), repriced, unqueueable, parts,
    )


def _held(config: SchedulerConfig, item: RunningWorkload) -> _Held:
    queue = admitted_queue(config, item.admission)
    if queue is None:
        return _Held(item, None)
    admission = item.admission
    # It competes at the priority the config in force gives it, as it would waiting: one
    # admitted at 10 whose rule now says 50 is not preempted by a 30 it would then preempt.
    path = route(config, item.workload)
    if path.queue == admission.queue and path.priority != admission.priority:
        admission = replace(admission, priority=path.priority)
    placement = _placement(queue, admission.flavors, item.workload.demand, admission.priority)
    return _Held(item, queue, path, admission,
                 Allocation(item.workload.id, placement, admission.admitted_at))


def _fit(
    config: SchedulerConfig,
    selectors: Mapping[str, Sequence[MatchExpression]],
    shapes: dict[tuple[object, ...], tuple[Placement, ...]],
    workload: Workload,
    path: Route,
) -> _Found:
    """The routed workload's flavors, or its decision when the engine has none to make."""
    if path.failure is not None:
        return Decision(workload.id, Status.FAILED, path, path.failure, path.notes())
    if path.queue is None:
        return None
    queue = config.queue(path.queue)
    matching, mismatches = _matching_flavors(selectors, queue, workload.labels)
    if not all(matching):
        return Decision(
            workload.id, Status.REJECTED, path, f"no flavor matched in queue {queue.name}",
            (*path.notes(), *mismatches),
        )
    combinations = tuple(itertools.product(*matching))
    key = (queue.name, path.priority, tuple(sorted(workload.demand.items())), combinations)
    placements = shapes.get(key)
    if placements is None:
        placements = shapes[key] = tuple(
            _placement(queue, combination, workload.demand, path.priority)
            for combination in combinations
        )
    return _Fit(key, placements, combinations, tuple(mismatches))


def _refusal(workload_id: str, path: Route, found: Decision | None, now: float) -> Decision:
    """The decision of a workload the engine has none to make for: no rule routes it, no
    flavor matched (``found``), or no rules at all (None: admitted ``now``)."""
    if found is not None:
        return found
    return Decision(
        workload_id, Status.ADMITTED, path,
        "admitted: the scheduler config has no scheduling rules (no quota)",
        admission=Admission(None, (), path.priority, now),
    )


def _requeued(compiled: Compiled, victim_id: str) -> Candidate:
    """A preempted workload's candidate, queued again from the pass's time."""
    part = compiled.parts.running[victim_id]
    workload = part.running.workload
    assert isinstance(part.found, _Fit) and part.route is not None
    return part.found.candidate(
        Workload(workload.id, workload.labels, workload.priority, workload.demand,
                 compiled.snapshot.now),
        part.route,
    )


# -- reading the plan back -------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    #: Every waiting workload, in the order given; then (``schedule``) every running workload
    #: preempted in the pass: what it got once requeued.
    decisions: Mapping[str, Decision]
    evictions: tuple[Eviction, ...] = ()
    #: Running workloads whose rule now gives another priority: the one they compete at.
    repriced: Mapping[str, int] = field(default_factory=dict)
    #: What the compile worked out, for the next pass (``schedule``'s ``reuse``).
    parts: Parts | None = field(default=None, compare=False, repr=False)


def decide(compiled: Compiled, plan: Plan) -> Outcome:
    """The engine's plan as one ``Decision`` per waiting workload, plus the evictions and
    what the evicted got once requeued."""
    requeued = [p.victim_id for p in plan.preemptions if p.victim_id in compiled.snapshot.requeue]
    if requeued:
        compiled = replace(compiled, candidates={
            **compiled.candidates, **{v: _requeued(compiled, v) for v in requeued}
        })
    evictions: list[Eviction] = []
    victims: dict[str, list[str]] = defaultdict(list)
    for preemption in plan.preemptions:
        preemptor = compiled.candidates[preemption.preemptor_id].route
        assert preemptor.queue is not None  # only routed workloads reach the engine
        victim = compiled.admissions[preemption.victim_id]
        evictions.append(Eviction(
            preemption.victim_id, preemption.preemptor_id, preemptor.queue,
            f"preempted by workload {preemption.preemptor_id} in queue {preemptor.queue} "
            f"(priority {preemptor.priority} > {victim.priority})",
        ))
        victims[preemption.preemptor_id].append(preemption.victim_id)

    decisions = dict(compiled.decided)
    decisions.update((e.workload_id, compiled.unqueueable[e.workload_id]) for e in evictions
                     if e.workload_id in compiled.unqueueable)
    usage = _final_usage(compiled, plan)
    now = compiled.snapshot.now
    for grant in plan.grants:
        candidate = compiled.candidates[grant.request_id]
        path, index = candidate.route, grant.placement_index
        assert path.queue is not None
        flavors = candidate.combinations[index]
        # Earlier combinations had no room when tried; say why with the numbers of now.
        skipped = [
            _shortfall(compiled.snapshot.nodes, usage, placement)
            for placement in candidate.placements[:index]
        ]
        preempted = tuple(victims[grant.request_id])
        reason = admitted_reason(path.queue, flavors, path.priority)
        if preempted:
            reason += f", preempting {', '.join(preempted)}"
        decisions[grant.request_id] = Decision(
            grant.request_id, Status.ADMITTED, path, reason,
            _notes(candidate, skipped),
            admission=Admission(path.queue, flavors, path.priority, now),
            preempted=preempted,
        )
    for rejection in plan.rejections:
        candidate = compiled.candidates[rejection.request_id]
        texts = [_reason_text(reason) for reason in rejection.reasons]
        decisions[rejection.request_id] = Decision(
            rejection.request_id, Status.REJECTED, candidate.route,
            f"never fits in queue {candidate.route.queue}: {texts[0]}",
            _notes(candidate, texts),
        )
    # A waiter blocked past BACKFILL_AFTER_SECONDS holds free units back from those behind it.
    holders = {group.queue: group.holder for group in plan.waiting if group.holder is not None}
    for request_id, entries in queue_entries(plan).items():
        candidate = compiled.candidates[request_id]
        # "Free" as ``queue_usage`` counts it: what runs, not what a hold keeps back.
        texts = [_waiting_text(compiled, usage, candidate, e) for e in entries]
        # What it waits for is its first flavor that could ever fit (position > 0): those
        # that never can are skipped, and said in the notes only.
        main = next(t for t, e in zip(texts, entries, strict=True) if e.position > 0)
        holder = holders.get(entries[0].queue)
        if holder is not None and holder != request_id:
            held = (f"free units are held for {holder}, queued longer than "
                    f"{BACKFILL_AFTER_SECONDS:g} s, so that smaller workloads stop passing it")
            texts.append(held)
            main = f"{main}; {held}"
        decisions[request_id] = Decision(
            request_id, Status.QUEUED, candidate.route,
            f"queued in queue {candidate.route.queue}: {main}",
            _notes(candidate, texts),
        )
    _number_queues(compiled, decisions)
    # The preempted follow the waiting: what they got once requeued.
    order = (*compiled.order, *(e.workload_id for e in evictions))
    return Outcome({i: decisions[i] for i in order}, tuple(evictions), compiled.repriced,
                   compiled.parts)


def _notes(candidate: Candidate, flavor_notes: Iterable[str]) -> tuple[str, ...]:
    # Combinations of several groups repeat a flavor's reason; say each once.
    return tuple(dict.fromkeys((*candidate.route.notes(), *candidate.mismatches, *flavor_notes)))


def _number_queues(compiled: Compiled, decisions: dict[str, Decision]) -> None:
    """Queued workloads get their place in their queue: priority, then FIFO, then id."""
    by_queue: dict[str | None, list[Candidate]] = defaultdict(list)
    for request_id, decision in decisions.items():
        if decision.status is Status.QUEUED:
            by_queue[decision.queue].append(compiled.candidates[request_id])
    for members in by_queue.values():
        members.sort(key=lambda c: (-c.route.priority, c.workload.submitted_at, c.workload.id))
        for position, candidate in enumerate(members, 1):
            decision = decisions[candidate.workload.id]
            decisions[candidate.workload.id] = replace(decision, position=position)


def _final_usage(compiled: Compiled, plan: Plan) -> dict[str, dict[str, int]]:
    """Per leaf, per key: what running and newly admitted workloads use after the plan."""
    evicted = {p.victim_id for p in plan.preemptions}
    held = [a.placement for a in compiled.snapshot.allocations if a.request_id not in evicted]
    held += [compiled.candidates[g.request_id].placements[g.placement_index] for g in plan.grants]
    usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for placement in held:
        for charge in placement.charges:
            for key, amount in charge.amounts.items():
                usage[charge.leaf][key] += amount
    return usage


def _shortfall(
    nodes: Mapping[str, Node], usage: Mapping[str, Mapping[str, int]], placement: Placement
) -> str:
    for charge in placement.charges:
        node = nodes[charge.leaf]
        for key, amount in charge.amounts.items():
            quota = node.cap(key)
            in_use = usage.get(charge.leaf, {}).get(key, 0)
            if quota is not None and in_use + amount > quota:
                return _capacity_text(node.name, key, amount, quota, in_use)
    return f"{' + '.join(nodes[c.leaf].name for c in placement.charges)}: no room when tried"


def _waiting_text(
    compiled: Compiled, usage: Mapping[str, Mapping[str, int]], candidate: Candidate,
    entry: QueueEntry,
) -> str:
    """A waiting placement's reason, with what its flavor's quota has in use after the plan
    (the engine's count adds the units a hold keeps back, which are free all the same)."""
    reason = entry.reason
    also = f" (also short of {', '.join(reason.also_short)})" if reason.also_short else ""
    for charge in candidate.placements[entry.placement_index].charges:
        if compiled.snapshot.nodes[charge.leaf].name == reason.node:
            in_use = usage.get(charge.leaf, {}).get(reason.key, 0)
            return _capacity_text(reason.node, reason.key, reason.requested, reason.bound,
                                  in_use) + also
    return _reason_text(reason) + also


def _reason_text(reason: Reason) -> str:
    # Config quotas are the only bounds this front-end sets: every reason is a capacity check.
    return _capacity_text(reason.node, reason.key, reason.requested, reason.bound, reason.in_use)


def _capacity_text(node: str, key: str, requested: int, quota: int, in_use: int) -> str:
    if requested > quota:
        if quota == 0:
            return f"{node}: {key} is blocked (nominal_quota 0)"
        return f"{node}: {key} requested {format_units(requested)} > nominal_quota " \
            f"{format_units(quota)}"
    free = format_units(max(quota - in_use, 0))
    return f"{node}: {key} requested {format_units(requested)}, free {free} of nominal_quota " \
        f"{format_units(quota)}"


def schedule(
    config: SchedulerConfig,
    waiting: Sequence[Workload],
    running: Sequence[RunningWorkload],
    now: float,
    reuse: Parts | None = None,
) -> Outcome:
    """One pass: compile (taking what ``reuse`` worked out, ``compile_snapshot``), run the
    engine, read its plan back.

    A preempted workload is requeued, and decided again in the same pass, in queue order with
    the waiting ones (so before those it outranks): another flavor may have room for it (seed
    004: the first flavor whose selector matches and has quota), and the pass's answer must
    not change when the next pass runs with nothing new."""
    compiled = compile_snapshot(config, waiting, running, now, reuse)
    return decide(compiled, reconcile(compiled.snapshot))


def explain(
    config: SchedulerConfig,
    workload: Workload,
    running: Sequence[RunningWorkload],
    now: float,
    *,
    waiting: Sequence[Workload] = (),
    reuse: Parts | None = None,
) -> Decision:
    """What would happen to ``workload`` if submitted now, given what runs and what waits (it
    queues behind those ahead of it, and units held for one that waited long are not its):
    which rule, queue, flavor, priority and position, and why not others."""
    return schedule(config, [*waiting, workload], running, now, reuse).decisions[workload.id]
