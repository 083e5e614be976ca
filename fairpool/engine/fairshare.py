"""Vector HDRF fair share for pool trees, as YTsaurus computes it (``library/vector_hdrf``).

Pure and single-threaded: a :class:`TreeSnapshot` goes in, a :class:`FairShareResult` comes out.
No clock (``now`` is an argument), no I/O, no randomness; ties are broken by name / id.

Usage::

    result = compute_fair_share(snapshot)                     # shares only
    result = compute_fair_share(snapshot, now=t, below_fair_share_since=since)
    result.pools["project-batch"].fair_share["cpu"]           # Fraction
    result.operations["op-1"].starvation.status               # StarvationStatus

Shares are fractions of the tree's total resources (``TreeSnapshot.total_resources``), one per
resource, exact (``fractions.Fraction``). YTsaurus computes in doubles and compares with
epsilons; exact rationals make "same snapshot, same result, byte for byte" trivially true,
make strict comparisons (starvation's ``usage < fair share * tolerance``) well defined, and let
the property tests assert ``sum <= 1`` without an epsilon. The price is speed (rationals are
several times slower than floats); the algorithm keeps YTsaurus's function-based complexity.

The algorithm (``docs/trees.md`` has the long version):

1. **Guarantees.** Explicit ``strong_guarantee_resources`` are copied; a resource a pool does
   not name gets ``(pool main / parent main) * parent's`` (the root's is the tree total),
   scaled down when the inferred values overrun what explicit siblings left. Shares are then
   clamped to limits and scaled by one common factor where children overrun their parent
   (YTsaurus's ``PoolTreeGuaranteesOvercommit``; reported in ``FairShareResult.warnings``).
2. **Functions, bottom-up.** Each element gets *fair share by fit factor* (FSBFF): an
   operation first covers its current usage, then grows linearly to its demand; a fair-share
   pool sums its children's *fair share by suggestion* with the argument of each child stretched
   by ``weight / min weight``; a FIFO pool lays its operations end to end in
   ``fifo_sort_parameters`` order. *Max fit factor by suggestion* (MFFBS) inverts FSBFF under
   the bound ``min(guarantee + s, limits)`` per resource, so guarantees come first and limits
   cap; *fair share by suggestion* is FSBFF after MFFBS.
3. **Shares, top-down.** The root is suggested 1; every pool passes its fit factor down.
   Dominant resource fairness follows from the suggestion being one scalar for all resources.
4. **Starvation.** ``below fair share`` when usage is under ``min(fair share * tolerance,
   demand)`` in every resource the element is not blocked on; ``starving`` once that has lasted
   longer than the effective ``fair_share_starvation_timeout``.

**Integral guarantees** (burst and relaxed pools; only when the tree has some), between steps
1 and 2: each integral pool's volume (``PoolSnapshot.integral_state``, with the seconds
elapsed since the previous update: an input, never read from a clock) gains ``total * elapsed *
flow ratio``, loses ``total * elapsed * last share ratio``, floored at 0 and capped at
``max(old, flow * pool_capacity_saturation_period)``; burst guarantees overcommitting the tree
scale with the strong ones; a burst pool is guaranteed ``min(burst ratio, volume / total /
smooth_period)`` and takes what it would get at suggestion 0; relaxed pools share what the
guarantees leave in proportion to their volumes. The resulting integral share is added to the
guarantee in MFFBS (``DetailedFairShare.integral_guarantee``); the new volume and share ratio
are in ``ElementShares.integral.state``. The float backend computes these steps in floats in
Python and hands the compiled kernel the guarantees with the integral shares included.

Not implemented (documented in ``docs/trees.md``): free-volume redistribution of integral
pools, the step function for gang operations, ``best_allocation_share`` (the node-fit cap on an
operation's limits), aggressive starvation, promised-guarantee fair share and priority strong
guarantee adjustment.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from itertools import accumulate, chain
from operator import attrgetter, is_, truediv
from types import MappingProxyType, ModuleType
from typing import Any, Literal, cast

from fairpool.engine.collector import collector_paused
from fairpool.engine.piecewise import (
    ONE,
    ZERO,
    Fitted,
    Function,
    Number,
    Vector,
    add,
    dominated,
    fit,
    scale,
    sub,
    total,
    vmin,
    zeros,
)

#: The compiled float backend (``_hdrf.c``), None where the package was installed without a
#: C compiler: then the float backend runs the same algorithm in Python (tests/test_fairshare_speed
#: asserts that the compiled one is used where the tests run).
kernel: ModuleType | None
try:
    from fairpool.engine import _hdrf as kernel
except ImportError:
    kernel = None

#: The resources YTsaurus knows, in its enum order: dominant-resource ties go to the first.
#: Other (custom) keys follow in name order.
STANDARD_RESOURCES = ("user_slots", "cpu", "gpu", "memory")

#: The root pool's name, as YTsaurus spells it.
ROOT = "<Root>"

#: An operation's fit factor runs over [0, 2]: usage is covered on [0, 1], demand on [1, 2].
OPERATION_FIT_FACTOR_END = Fraction(2)

Resources = Mapping[str, int]

#: Accumulated volumes are rounded down to a multiple of 1 / VOLUME_RESOLUTION resource-seconds
#: (a resource-microsecond): exact, but with denominators that stay small update after update.
VOLUME_RESOLUTION = 10**6


class SchedulingMode(StrEnum):
    FAIR_SHARE = "fair_share"
    FIFO = "fifo"


class FifoSortParameter(StrEnum):
    """``fifo_sort_parameters`` entries. ``weight`` sorts heavier first, the others ascending."""

    WEIGHT = "weight"
    START_TIME = "start_time"
    PENDING_JOB_COUNT = "pending_job_count"


class ElementKind(StrEnum):
    ROOT = "root"
    POOL = "pool"
    OPERATION = "operation"


class StarvationStatus(StrEnum):
    NON_STARVING = "non_starving"
    STARVING = "starving"


class IntegralGuaranteeType(StrEnum):
    """``integral_guarantees.guarantee_type``: a burst pool is guaranteed up to its
    ``burst_guarantee_resources`` while its volume lasts; a relaxed pool gets a share of what
    strong and burst guarantees leave, in proportion to its volume."""

    NONE = "none"
    BURST = "burst"
    RELAXED = "relaxed"


_NO_INTEGRAL = IntegralGuaranteeType.NONE

# -- input ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StarvationSettings:
    """Effective starvation options of one element (already inherited pool -> parent -> tree)."""

    #: ``fair_share_starvation_tolerance``, in [0, 1].
    tolerance: Fraction = Fraction(4, 5)
    #: ``fair_share_starvation_timeout`` in milliseconds (YTsaurus units).
    timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class IntegralGuarantees:
    """A pool's ``integral_guarantees`` (YTsaurus ``TPoolIntegralGuaranteesConfig``), as far as
    the update reads it; resources are absolute amounts, like strong guarantees."""

    guarantee_type: IntegralGuaranteeType = IntegralGuaranteeType.NONE
    burst_guarantee_resources: Resources = field(default_factory=dict)
    resource_flow: Resources = field(default_factory=dict)
    #: None: the tree's ``relaxed_share_multiplier_limit``.
    relaxed_share_multiplier_limit: Fraction | None = None


@dataclass(frozen=True, slots=True)
class IntegralState:
    """What an integral pool carries from one update to the next (YTsaurus
    ``TIntegralResourcesState``): the accumulated volume per resource, in resource-seconds
    (cpu-seconds, byte-seconds, ...), and the integral share ratio it held since the previous
    update. ``elapsed`` is the time since that update, in seconds: passed in, never read from a
    clock; 0 (the first update of a pool) neither refills nor consumes."""

    accumulated_volume: Mapping[str, Fraction] = field(default_factory=dict)
    last_share_ratio: Fraction = ZERO
    elapsed: Fraction = ZERO


@dataclass(frozen=True, slots=True)
class IntegralSettings:
    """The tree's ``integral_guarantees`` (YTsaurus defaults), durations in milliseconds."""

    smooth_period: int = 60_000
    pool_capacity_saturation_period: int = 86_400_000
    relaxed_share_multiplier_limit: Fraction = Fraction(3)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A pool with its effective attributes. ``parent`` None means a child of the root."""

    name: str
    parent: str | None = None
    mode: SchedulingMode = SchedulingMode.FAIR_SHARE
    #: None: inferred from guarantees when the tree says so, else 1.
    weight: Fraction | None = None
    strong_guarantee_resources: Resources = field(default_factory=dict)
    resource_limits: Resources = field(default_factory=dict)
    fifo_sort_parameters: tuple[FifoSortParameter, ...] = (
        FifoSortParameter.WEIGHT,
        FifoSortParameter.START_TIME,
    )
    starvation: StarvationSettings = StarvationSettings()
    integral_guarantees: IntegralGuarantees = IntegralGuarantees()
    #: The previous update's volume and share ratio (ignored unless the pool is integral).
    integral_state: IntegralState = IntegralState()


@dataclass(frozen=True, slots=True)
class OperationSnapshot:
    """An operation in one tree: ``running_job_count + pending_job_count`` jobs of one vector.

    Usage is ``job_resources * running_job_count``; demand adds the pending jobs. An operation
    that is not running (pending behind ``max_running_operation_count``) demands only its usage,
    as in YTsaurus. The front-end includes ``user_slots: 1`` in ``job_resources``.
    """

    id: str
    pool: str
    job_resources: Resources
    running_job_count: int = 0
    pending_job_count: int = 0
    weight: Fraction = ONE
    #: Seconds, any epoch; the FIFO ``start_time`` key.
    start_time: float = 0.0
    resource_limits: Resources = field(default_factory=dict)
    running: bool = True
    #: None: the pool's effective values. An operation may only be more conservative (lower
    #: tolerance, longer timeout); the front-end enforces that when it builds the snapshot.
    starvation: StarvationSettings | None = None

    @property
    def usage(self) -> dict[str, int]:
        return {key: amount * self.running_job_count for key, amount in self.job_resources.items()}

    @property
    def demand(self) -> dict[str, int]:
        jobs = self.running_job_count + (self.pending_job_count if self.running else 0)
        return {key: amount * jobs for key, amount in self.job_resources.items()}


@dataclass(frozen=True, slots=True)
class TreeSnapshot:
    """Everything one fair-share update reads."""

    #: The resources of the nodes the tree's ``node_tag_filter`` selects.
    total_resources: Resources
    pools: tuple[PoolSnapshot, ...] = ()
    operations: tuple[OperationSnapshot, ...] = ()
    main_resource: str = "cpu"
    infer_weight_from_guarantees_share_multiplier: Fraction | None = None
    #: The root's (tree-level) starvation options; the root itself never starves.
    starvation: StarvationSettings = StarvationSettings()
    enable_pool_starvation: bool = True
    integral_guarantees: IntegralSettings = IntegralSettings()


# -- output --------------------------------------------------------------------------------

Shares = Mapping[str, Fraction]


@dataclass(frozen=True, slots=True)
class DetailedFairShare:
    """The fair share split as YTsaurus's Orchid shows it (``SetDetailedFairShare``): the part
    within the strong guarantee, then within the integral share, then the rest."""

    strong_guarantee: Shares
    integral_guarantee: Shares
    weight_proportional: Shares
    total: Shares


@dataclass(frozen=True, slots=True)
class IntegralShares:
    """An integral pool's fields in YTsaurus's Orchid. Ratios are shares of the tree; volumes
    are after this update's refill and consumption."""

    guarantee_type: IntegralGuaranteeType
    #: ``burst_guarantee_resources`` / ``resource_flow`` as a share of the tree (the largest
    #: over resources), as configured.
    specified_burst_ratio: Fraction
    specified_resource_flow_ratio: Fraction
    #: The burst ratio the update used: scaled down with strong guarantees when strong and
    #: burst guarantees together overcommit the tree.
    burst_ratio: Fraction
    total_burst_ratio: Fraction
    total_resource_flow_ratio: Fraction
    #: Resource-seconds per resource.
    accumulated_resource_volume: Shares
    #: The smallest ``volume / total`` over resources: share-seconds ("fair_share*sec").
    accumulated_resource_ratio_volume: Fraction
    #: The share-seconds the volume fills up to: flow ratio * ``pool_capacity_saturation_period``.
    integral_pool_capacity: Fraction
    #: How long the volume lasts while using the burst guarantee (the flow keeps refilling);
    #: None where it lasts for ever (burst <= flow) and for relaxed pools.
    estimated_burst_usage_duration_seconds: Fraction | None
    #: What the next update starts from (its ``elapsed`` left to the caller).
    state: IntegralState


@dataclass(frozen=True, slots=True)
class Starvation:
    below_fair_share: bool
    #: When the element went below its fair share (``now`` if it just did); None when it is not.
    below_fair_share_since: float | None
    status: StarvationStatus


@dataclass(frozen=True, slots=True)
class ElementShares:
    """The dynamic characteristics of one pool, operation or the root."""

    kind: ElementKind
    name: str
    parent: str | None
    #: The effective weight (specified, inferred from guarantees, or 1).
    weight: Fraction
    fair_share: DetailedFairShare
    usage_share: Shares
    demand_share: Shares
    limits_share: Shares
    strong_guarantee_share: Shares
    dominant_resource: str
    #: Operations in a FIFO pool: the position in the pool's order, from 0.
    fifo_index: int | None
    starvation: Starvation | None
    #: The integral share added to the guarantee (YTsaurus ``proposed_integral_share``):
    #: an integral pool's own, summed up its ancestors; 0 elsewhere.
    proposed_integral_share: Shares
    #: Burst and relaxed pools only.
    integral: IntegralShares | None

    @property
    def key(self) -> tuple[ElementKind, str]:
        """What ``below_fair_share_since`` is keyed by."""
        return (self.kind, self.name)

    @property
    def dominant_fair_share(self) -> Fraction:
        return self.fair_share.total[self.dominant_resource]

    @property
    def dominant_usage_share(self) -> Fraction:
        return self.usage_share[self.dominant_resource]

    @property
    def dominant_demand_share(self) -> Fraction:
        return self.demand_share[self.dominant_resource]


@dataclass(frozen=True, slots=True)
class FairShareResult:
    resources: tuple[str, ...]
    root: ElementShares
    pools: Mapping[str, ElementShares]
    operations: Mapping[str, ElementShares]
    #: Problems the update worked around, e.g. guarantees overcommitting the tree.
    warnings: tuple[str, ...] = ()

    def element(self, kind: ElementKind, name: str) -> ElementShares:
        if kind is ElementKind.ROOT:
            return self.root
        return (self.pools if kind is ElementKind.POOL else self.operations)[name]


# -- the element tree --------------------------------------------------------------------

#: Elements (pools + operations) up to which ``numeric="auto"`` computes exactly.
EXACT_ELEMENT_LIMIT = 200

#: Float backend: a computed share within this of an exact candidate (demand, usage, limits,
#: guarantee, 0) is reported as that candidate. Shares are fractions of the tree, in [0, 1];
#: the float computation's own error is around 1e-12 even for the largest benchmark trees.
SNAP_EPSILON = 1e-9

Numeric = Literal["auto", "exact", "float"]


@dataclass(slots=True)
class _Element:
    """Per-update working state of one element (mutable only inside one update).

    Usage and demand are kept only as integer numerators over the tree total
    (``_Update.dens``), so that sums are exact and cheap (``_Update.shares`` converts them);
    ``limits`` / ``guarantee`` are in the update's number type (``Fraction`` or ``float``),
    ``exact_*`` always in ``Fraction`` (pools only; operations compute theirs when
    described)."""

    kind: ElementKind
    name: str
    parent: _Element | None
    mode: SchedulingMode = SchedulingMode.FAIR_SHARE
    specified_weight: Fraction | None = None
    pool: PoolSnapshot | None = None
    operation: OperationSnapshot | None = None
    children: list[_Element] = field(default_factory=list)
    #: The children that are pools, in ``children``'s order: the pool-only steps skip the
    #: operations (most elements) without looking at them.
    pools: list[_Element] = field(default_factory=list)
    usage_numerators: tuple[int, ...] = ()
    demand_numerators: tuple[int, ...] = ()
    limits: Vector = ()
    guarantee: Vector = ()
    exact_limits: Vector = ()
    exact_guarantee: Vector = ()
    weight: Fraction = ONE
    fifo_index: int | None = None
    by_fit_factor: Function | None = None
    fitted: Fitted | None = None
    fair_share: Vector = ()
    #: The position in ``_Update.order``.
    index: int = 0
    #: Integral guarantees (pools of a tree that has integral pools): the burst ratio used
    #: (scaled on overcommit) and the flow ratio, both 0 unless the pool is integral; their
    #: sums over the subtree; the integral share added to the guarantee, in the update's
    #: numbers (empty: none); an integral pool's volume after this update and its new ratio.
    burst_ratio: Fraction = ZERO
    flow_ratio: Fraction = ZERO
    total_burst_ratio: Fraction = ZERO
    total_flow_ratio: Fraction = ZERO
    proposed: Vector = ()
    volume: tuple[Fraction, ...] = ()
    last_ratio: Fraction = ZERO


def _share(amount: int, total_amount: int) -> Fraction:
    """YTsaurus's ``FromJobResources``: 0/0 is 0, x/0 is the whole cluster (1)."""
    if total_amount == 0:
        return ZERO if amount == 0 else ONE
    return Fraction(amount, total_amount)


def resource_order(snapshot: TreeSnapshot) -> tuple[str, ...]:
    """Every resource the snapshot mentions: standard ones first, then custom keys by name."""
    keys: set[str] = set(snapshot.total_resources) | {snapshot.main_resource}
    for pool in snapshot.pools:
        keys |= set(pool.strong_guarantee_resources) | set(pool.resource_limits)
    for operation in snapshot.operations:
        keys |= set(operation.job_resources) | set(operation.resource_limits)
    return tuple(r for r in STANDARD_RESOURCES if r in keys) + tuple(
        sorted(keys - set(STANDARD_RESOURCES))
    )


#: ``_hdrf.c``'s element kinds, by kind and mode.
_KERNEL_KINDS = {
    (ElementKind.OPERATION, SchedulingMode.FAIR_SHARE): 0,
    (ElementKind.ROOT, SchedulingMode.FAIR_SHARE): 1,
    (ElementKind.POOL, SchedulingMode.FAIR_SHARE): 1,
    (ElementKind.POOL, SchedulingMode.FIFO): 2,
}


class _Update:
    """One fair-share update over one snapshot, exact or in floats."""

    def __init__(self, snapshot: TreeSnapshot, exact: bool) -> None:
        self.snapshot = snapshot
        self.exact = exact
        self.resources = resource_order(snapshot)
        self.size = len(self.resources)
        self.totals = tuple(snapshot.total_resources.get(r, 0) for r in self.resources)
        #: Denominators of usage / demand numerators: the total, or 1 where it is 0 (then an
        #: operation's numerator is its share, 0 or 1, as ``FromJobResources`` says).
        self.dens = self.totals if all(self.totals) else tuple(t or 1 for t in self.totals)
        self.main = self.resources.index(snapshot.main_resource)
        self.zero: Number = ZERO if exact else 0.0
        self.one: Number = ONE if exact else 1.0
        self.two: Number = OPERATION_FIT_FACTOR_END if exact else 2.0
        self.zeros: Vector = (self.zero,) * self.size
        self.warnings: list[str] = [
            # Accepted (nodes may come later), but silent: user_slots, say, counts only in a
            # tree whose nodes declare it.
            f"pool {pool.name}: resource_limits.{key} limits nothing: no node of the tree "
            f"has {key}"
            for pool in snapshot.pools for key in pool.resource_limits
            if not snapshot.total_resources.get(key)
        ]
        #: The limits share of an element without limits, exact and in the update's numbers.
        full = self.exact_limits_share({})
        self.unlimited = (full, self.numbers(full))
        self.root = self._build()
        #: The elements in tree order (depth first, children in the update's order).
        self.order: list[_Element] = []
        #: The compiled kernel's result: element ``e``'s shares from ``e.index * size``.
        self.flat_shares: list[float] | None = None

    def ratio(self, weight: Fraction, lightest: Fraction) -> Number:
        """A child's weight over its lightest sibling's: how much its suggestion is stretched.
        In floats from the float weights, as the compiled kernel computes it."""
        return weight / lightest if self.exact else float(weight) / float(lightest)

    def number(self, value: Fraction) -> Number:
        return value if self.exact else float(value)

    def numbers(self, vector: Vector) -> Vector:
        return vector if self.exact else tuple(float(x) for x in vector)

    def shares(self, numerators: tuple[int, ...]) -> Vector:
        if self.exact:
            return tuple(map(Fraction, numerators, self.dens))
        return tuple(map(truediv, numerators, self.dens))

    def numerators(self, job: tuple[int, ...], count: int) -> tuple[int, ...]:
        """``count`` jobs of vector ``job`` over ``dens``."""
        # List comprehensions, the cheapest loop in CPython: this runs twice per operation.
        vector = tuple([amount * count for amount in job])
        if self.dens is self.totals:
            return vector
        # Where the tree has none of a resource, any amount of it is the whole (1).
        return tuple(n if t else int(bool(n)) for n, t in zip(vector, self.totals, strict=True))

    def exact_limits_share(self, limits: Resources) -> Vector:
        # min(limits, total) / total; a resource the tree lacks has nothing to give.
        return tuple(
            _share(min(limits.get(r, t), t), t) if t else ZERO
            for r, t in zip(self.resources, self.totals, strict=True)
        )

    def limits_share(self, limits: Resources) -> Vector:
        if self.exact or not limits:
            return self.numbers(self.exact_limits_share(limits))
        return tuple(
            min(limits.get(r, t), t) / t if t else 0.0
            for r, t in zip(self.resources, self.totals, strict=True)
        )

    # -- structure and cumulative attributes ---------------------------------------------

    def _build(self) -> _Element:
        root = _Element(ElementKind.ROOT, ROOT, None)
        pools = {ROOT: root}
        for pool in self.snapshot.pools:
            pools[pool.name] = _Element(
                ElementKind.POOL, pool.name, None, pool.mode, pool.weight, pool=pool
            )
        for pool in self.snapshot.pools:
            element = pools[pool.name]
            element.parent = pools[pool.parent or ROOT]
            element.parent.children.append(element)
            element.parent.pools.append(element)
        unlimited = self.unlimited[1]
        resources = self.resources
        # Operations repeat a few job vectors and counts: each distinct one's numerators are
        # computed once and shared (which also lets later steps convert each once).
        shapes: dict[tuple[tuple[int, ...], int, int], tuple[tuple[int, ...], ...]] = {}
        for operation in self.snapshot.operations:
            parent = pools[operation.pool]
            running = operation.running_job_count
            jobs = running + (operation.pending_job_count if operation.running else 0)
            amounts = operation.job_resources
            shape = (tuple([amounts.get(r, 0) for r in resources]), running, jobs)
            numerators = shapes.get(shape)
            if numerators is None:
                numerators = shapes[shape] = (
                    self.numerators(shape[0], running),
                    self.numerators(shape[0], jobs),
                )
            parent.children.append(
                _Element(
                    ElementKind.OPERATION,
                    operation.id,
                    parent,
                    specified_weight=operation.weight,
                    operation=operation,
                    usage_numerators=numerators[0],
                    demand_numerators=numerators[1],
                    limits=(
                        self.limits_share(operation.resource_limits)
                        if operation.resource_limits
                        else unlimited
                    ),
                    guarantee=self.zeros,
                    weight=operation.weight,
                )
            )
        self._cumulative(root)
        self._infer_guarantees(root, tuple(Fraction(t) for t in self.totals))
        #: Burst and relaxed pools in tree order; empty (the common case) skips every step
        #: of integral guarantees, so such trees are computed exactly as before.
        self.integral_pools = [
            element
            for element in _walk(root, pools_only=True)
            if element.pool is not None
            and element.pool.integral_guarantees.guarantee_type is not _NO_INTEGRAL
        ]
        available: Vector = tuple(ONE for _ in self.resources)
        if self.integral_pools:
            self._integral_ratios(root)
            self._refill_volumes()
            available = self._check_integral_overcommit(root, available)
        self._adjust_guarantees(root, available)
        self._weights(root)
        if self.integral_pools:
            self._burst_shares()
            self._relaxed_shares(root)
        return root

    def solve(self) -> None:
        """Every element's fair share: functions bottom-up, then shares top-down; in floats by
        the compiled kernel when it is built."""
        self.order = list(_walk(self.root))
        if self.exact or kernel is None:
            self._functions(self.root)
            self.distribute(self.root, self.one)
        else:
            self._solve_compiled(kernel)

    def _solve_compiled(self, kernel: ModuleType) -> None:
        """``_hdrf.update`` (which mirrors ``_functions`` and ``distribute``) over the tree
        flattened in tree order, children as indices; the shares stay in one flat list until
        an element is described."""
        order = self.order
        for index, element in enumerate(order):
            element.index = index

        # Columns through map(attrgetter) rather than generator expressions: C-speed loops
        # over every element.
        def column(*names: str) -> Iterator[Any]:
            return map(attrgetter(*names), order)

        counts = list(map(len, column("children")))
        shares = kernel.update(
            self.size,
            bytes(map(_KERNEL_KINDS.__getitem__, column("kind", "mode"))),
            array("i", accumulate(counts, initial=0))[:-1],
            array("i", counts),
            array("i", map(attrgetter("index"), chain.from_iterable(column("children")))),
            array("d", [w.numerator / w.denominator for w in column("weight")]),
            list(column("usage_numerators")),
            list(column("demand_numerators")),
            list(column("limits")),
            list(map(self.guarantee, order)),
            self.dens,
        )
        self.flat_shares = cast(list[float], memoryview(shares).cast("d").tolist())

    def fair_share(self, element: _Element) -> Vector:
        if self.flat_shares is None:
            return element.fair_share
        start = element.index * self.size
        return tuple(self.flat_shares[start : start + self.size])

    def _cumulative(self, element: _Element) -> None:
        """Usage, demand and limits bottom-up; FIFO order of a FIFO pool's operations."""
        children = element.children
        for child in element.pools:
            self._cumulative(child)
        if children:  # column sums of the children's vectors
            usage = zip(*(c.usage_numerators for c in children), strict=True)
            demand = zip(*(c.demand_numerators for c in children), strict=True)
            element.usage_numerators = tuple(map(sum, usage))
            element.demand_numerators = tuple(map(sum, demand))
        else:
            element.usage_numerators = element.demand_numerators = (0,) * self.size
        limits = element.pool.resource_limits if element.pool is not None else {}
        if limits:
            element.exact_limits = self.exact_limits_share(limits)
            element.limits = self.numbers(element.exact_limits)
        else:
            element.exact_limits, element.limits = self.unlimited
        if element.mode is SchedulingMode.FIFO:
            element.children.sort(key=lambda child: self._fifo_key(element, child))
            for index, child in enumerate(element.children):
                child.fifo_index = index
        else:
            element.children.sort(key=attrgetter("kind", "name"))
            element.pools.sort(key=attrgetter("name"))

    @staticmethod
    def _fifo_key(pool: _Element, child: _Element) -> tuple[object, ...]:
        """``HasHigherPriorityInFifoMode``: lexicographic over the pool's sort parameters,
        then the operation id so that equal keys still order deterministically."""
        operation = child.operation
        assert operation is not None and pool.pool is not None  # validated: FIFO holds operations
        key: list[object] = []
        for parameter in pool.pool.fifo_sort_parameters:
            if parameter is FifoSortParameter.WEIGHT:
                key.append(-operation.weight)
            elif parameter is FifoSortParameter.START_TIME:
                key.append(operation.start_time)
            else:
                key.append(operation.pending_job_count)
        key.append(operation.id)
        return tuple(key)

    # -- guarantees (exact, pools only: operations have none) ----------------------------

    def _infer_guarantees(self, parent: _Element, parent_amounts: tuple[Fraction, ...]) -> None:
        """``DetermineInferredStrongGuaranteeResources``: top-down, in absolute amounts."""
        pools = parent.pools
        if not pools:
            return
        explicit = [c.pool.strong_guarantee_resources for c in pools if c.pool is not None]
        amounts: list[list[Fraction]] = [
            [Fraction(e[r]) if e.get(r) else ZERO for r in self.resources] for e in explicit
        ]
        main_total = parent_amounts[self.main]
        for index, resource in enumerate(self.resources):
            if index == self.main:
                continue
            inferred = [k for k, e in enumerate(explicit) if resource not in e]
            for k in inferred:
                main = amounts[k][self.main]
                # Most pools are guaranteed nothing: no rational arithmetic for them.
                amounts[k][index] = (
                    main / main_total * parent_amounts[index] if main and main_total else ZERO
                )
            if parent.kind is ElementKind.ROOT:
                continue
            # Sums skip zero terms (filter): most pools are guaranteed nothing.
            wanted = sum(filter(None, (amounts[k][index] for k in inferred)), ZERO)
            if not wanted:
                continue
            named = set(range(len(pools))).difference(inferred)
            residual = parent_amounts[index] - sum(
                filter(None, (amounts[k][index] for k in named)), ZERO
            )
            if wanted > max(residual, ZERO):
                factor = max(residual, ZERO) / wanted
                for k in inferred:
                    amounts[k][index] *= factor
        for child, child_amounts in zip(pools, amounts, strict=True):
            child.exact_guarantee = tuple(
                a / t if a and t else ZERO for a, t in zip(child_amounts, self.totals, strict=True)
            )
            self._infer_guarantees(child, tuple(child_amounts))

    def _adjust_guarantees(self, parent: _Element, available: Vector) -> None:
        """``AdjustStrongGuarantees``: clamp to limits, then scale children that overrun their
        parent by one common factor (the largest that fits in every resource)."""
        pools = parent.pools
        if not pools and parent.kind is not ElementKind.ROOT:
            return
        # Most pools are guaranteed nothing: no rational arithmetic for them.
        guaranteed = [c for c in pools if any(c.exact_guarantee)]
        for child in guaranteed:
            child.exact_guarantee = vmin(child.exact_guarantee, child.exact_limits)
        children_sum = total((c.exact_guarantee for c in guaranteed), self.size)
        if not dominated(children_sum, available):
            factor = min(a / s for a, s in zip(available, children_sum, strict=True) if s > a)
            self.warnings.append(
                f"strong guarantees of the children of {parent.name} exceed "
                f"{'the tree total' if parent.kind is ElementKind.ROOT else 'its guarantee'}; "
                f"scaled by {factor}"
            )
            for child in guaranteed:
                child.exact_guarantee = scale(child.exact_guarantee, factor)
        if parent.kind is ElementKind.ROOT:
            parent.exact_guarantee = total((c.exact_guarantee for c in guaranteed), self.size)
            parent.guarantee = self.numbers(parent.exact_guarantee)
        for child in pools:
            child.guarantee = self.numbers(child.exact_guarantee)
            self._adjust_guarantees(child, child.exact_guarantee)

    def _weights(self, element: _Element) -> None:
        """``GetWeight``: specified, else multiplier * own / parent's max strong guarantee
        share when the tree infers weights (1 if either is zero), else 1. Operations always
        carry their own weight (set when they are built)."""
        multiplier = self.snapshot.infer_weight_from_guarantees_share_multiplier
        for child in element.pools:
            if child.specified_weight is not None:
                child.weight = child.specified_weight
            elif multiplier is not None:
                # Resource flows count as guarantees here (``GetWeight``); 0 without them.
                own, parents = (
                    max(child.exact_guarantee, default=ZERO) + child.total_flow_ratio,
                    max(element.exact_guarantee, default=ZERO) + element.total_flow_ratio,
                )
                child.weight = Fraction(multiplier * own / parents) if own and parents else ONE
            self._weights(child)

    # -- integral guarantees ---------------------------------------------------------------

    def guarantee(self, element: _Element) -> Vector:
        """What MFFBS guarantees first (YTsaurus ``GetGuaranteeShare``): the strong guarantee
        plus the integral share, in the update's numbers."""
        if not element.proposed:
            return element.guarantee
        return add(element.guarantee, element.proposed)

    def max_ratio(self, amounts: Resources) -> Fraction:
        """``amounts`` as a share of the tree: the largest over the resources it has."""
        return max(
            (
                Fraction(amounts.get(r, 0), t)
                for r, t in zip(self.resources, self.totals, strict=True)
                if t
            ),
            default=ZERO,
        )

    def ratio_volume(self, element: _Element) -> Fraction:
        """``accumulated_resource_ratio_volume``: the least ``volume / total``, share-seconds."""
        return min(
            (v / t for v, t in zip(element.volume, self.totals, strict=True) if t), default=ZERO
        )

    def ratio_by_volume(self, element: _Element) -> Fraction:
        """``GetIntegralShareRatioByVolume``: the share the volume pays for over
        ``smooth_period``."""
        smooth = Fraction(self.snapshot.integral_guarantees.smooth_period, 1000)
        return self.ratio_volume(element) / smooth

    def _integral_ratios(self, element: _Element) -> None:
        """Burst and flow ratios of integral pools, and their sums over every subtree
        (``UpdateCumulativeAttributes``); a pool without a guarantee type has neither."""
        burst = flow = ZERO
        for child in element.pools:
            self._integral_ratios(child)
            burst += child.total_burst_ratio
            flow += child.total_flow_ratio
        pool = element.pool
        if pool is not None and pool.integral_guarantees.guarantee_type is not _NO_INTEGRAL:
            settings = pool.integral_guarantees
            element.burst_ratio = self.max_ratio(settings.burst_guarantee_resources)
            element.flow_ratio = self.max_ratio(settings.resource_flow)
        element.total_burst_ratio = element.burst_ratio + burst
        element.total_flow_ratio = element.flow_ratio + flow

    def _refill_volumes(self) -> None:
        """``UpdateAccumulatedResourceVolume``: over ``elapsed`` seconds each resource's volume
        gains ``total * elapsed * flow ratio`` and loses ``total * elapsed * last share
        ratio``; floored at 0, capped at ``max(old volume, capacity)`` with capacity
        ``total * flow ratio * pool_capacity_saturation_period`` (a volume above a lowered
        capacity drains but never grows). Exact in both backends, then rounded down to a
        resource-microsecond so that stored volumes keep small denominators."""
        settings = self.snapshot.integral_guarantees
        saturation = Fraction(settings.pool_capacity_saturation_period, 1000)
        for element in self.integral_pools:
            assert element.pool is not None
            state = element.pool.integral_state
            old = tuple(
                state.accumulated_volume.get(r, ZERO) if t else ZERO
                for r, t in zip(self.resources, self.totals, strict=True)
            )
            elapsed = state.elapsed
            if elapsed <= 0:
                element.volume = old
                continue
            net = element.flow_ratio - state.last_share_ratio
            volume = []
            for amount, t in zip(old, self.totals, strict=True):
                capacity = t * element.flow_ratio * saturation
                grown = min(max(amount + t * elapsed * net, ZERO), max(amount, capacity))
                volume.append(Fraction(math.floor(grown * VOLUME_RESOLUTION), VOLUME_RESOLUTION))
            element.volume = tuple(volume)

    def _check_integral_overcommit(self, root: _Element, available: Vector) -> Vector:
        """``ValidateAndAdjustSpecifiedGuarantees``'s integral part: strong guarantees plus
        resource flows, or plus burst guarantees, must fit in the tree (YTsaurus's
        ``PoolTreeGuaranteesOvercommit`` alert: here a warning). Overcommitting burst
        guarantees also scales the root's strong guarantees and every burst ratio by one
        common factor, the largest with which they fit; the strong guarantees of the root's
        children are then fitted into what that leaves."""
        strong = total((c.exact_guarantee for c in root.pools), self.size)
        sums = [g for g, t in zip(strong, self.totals, strict=True) if t]
        flow, burst = root.total_flow_ratio, root.total_burst_ratio
        if flow and any(g + flow > 1 for g in sums):
            self.warnings.append(
                f"strong guarantees and resource flows exceed the tree total "
                f"(flow ratio {flow}); resource flows are not scaled"
            )
        if not burst or all(g + burst <= 1 for g in sums):
            return available
        # Exact: the strong guarantee shares are Fractions in both backends.
        factor = Fraction(min(ONE / (g + burst) for g in sums))
        self.warnings.append(
            f"strong guarantees and burst guarantees exceed the tree total (burst ratio "
            f"{burst}); both scaled by {factor}"
        )
        for element in self.integral_pools:
            element.burst_ratio *= factor
        return vmin(available, scale(strong, factor))

    def _headroom(self, element: _Element) -> Vector:
        """Limits minus the strong guarantee: room for an integral share."""
        zero = self.zero
        return tuple(
            max(lim - g, zero) for lim, g in zip(element.limits, element.guarantee, strict=True)
        )

    def _available_limits(self, element: _Element) -> Vector:
        """``GetHierarchicalAvailableLimitsShare``: limits minus guarantees (integral shares
        included), the least over the element and its ancestors below the root."""
        zero = self.zero
        result: Vector = (self.one,) * self.size
        current: _Element | None = element
        while current is not None and current.kind is not ElementKind.ROOT:
            guarantee = self.guarantee(current)
            result = tuple(
                min(a, max(lim - g, zero))
                for a, lim, g in zip(result, current.limits, guarantee, strict=True)
            )
            current = current.parent
        return result

    def _raise_integral(self, element: _Element, delta: Vector) -> None:
        """``IncreaseHierarchicalIntegralShare``: the element and every ancestor guarantee
        ``delta`` more, each within its limits (the root may be overcommitted: part of a strong
        guarantee can serve as a relaxed share)."""
        current: _Element | None = element
        while current is not None:
            raised = add(current.proposed or self.zeros, delta)
            if current.kind is not ElementKind.ROOT:
                raised = vmin(raised, self._headroom(current))
            current.proposed = raised
            current = current.parent

    def _within(self, element: _Element, suggestion: Number) -> Vector:
        """An integral pool's share beyond its strong guarantee at ``suggestion``, with the
        functions just built for it."""
        assert element.fitted is not None
        zero = self.zero
        share = element.fitted.at(suggestion)[1]
        return tuple(max(x - g, zero) for x, g in zip(share, element.guarantee, strict=True))

    def _burst_shares(self) -> None:
        """``UpdateBurstPoolIntegralShares``: a burst pool is guaranteed, on top of its strong
        guarantee, ``min(burst ratio, ratio by volume)`` of every resource (within its and
        its ancestors' room); its integral share is what it would take at suggestion 0 under
        that guarantee, beyond the strong guarantee."""
        for element in self.integral_pools:
            assert element.pool is not None
            if element.pool.integral_guarantees.guarantee_type is not IntegralGuaranteeType.BURST:
                continue
            ratio = self.number(min(element.burst_ratio, self.ratio_by_volume(element)))
            proposed = vmin((ratio,) * self.size, self._available_limits(element))
            element.proposed = vmin(proposed, self._headroom(element))
            self._functions(element)
            element.proposed = ()
            integral = self._within(element, self.zero)
            self._raise_integral(element, integral)
            element.last_ratio = _exact_ratio(max(integral, default=self.zero))

    def _relaxed_shares(self, root: _Element) -> None:
        """``UpdateRelaxedPoolIntegralShares``: what the root's children leave within their
        guarantees (strong and burst, up to demand) is shared among relaxed pools with
        volume: each is capped at ``strong + min(ratio by volume, flow ratio *
        relaxed_share_multiplier_limit)`` and suggested ``min(1, f * ratio / least ratio)``,
        with the one largest ``f`` whose shares beyond the strong guarantees fit in what is
        left. YTsaurus binary-searches ``f``; here it is the exact inverse of the summed
        (monotone, piecewise-linear) excess function, found like a max fit factor."""
        relaxed = [
            element
            for element in self.integral_pools
            if element.pool is not None
            and element.pool.integral_guarantees.guarantee_type is IntegralGuaranteeType.RELAXED
        ]
        if not relaxed:
            return
        zero = self.zero
        left: Vector = (self.one,) * self.size
        for child in root.pools:
            used = vmin(self.guarantee(child), self.shares(child.demand_numerators))
            left = sub(left, used)
        left = tuple(max(x, zero) for x in left)
        default_limit = self.snapshot.integral_guarantees.relaxed_share_multiplier_limit
        chosen: list[tuple[_Element, Fraction]] = []
        for element in relaxed:
            assert element.pool is not None
            ratio = self.ratio_by_volume(element)
            if not ratio:
                continue
            limit = element.pool.integral_guarantees.relaxed_share_multiplier_limit
            cap = self.number(min(ratio, element.flow_ratio * (limit or default_limit)))
            limits = element.limits
            element.limits = vmin(limits, tuple(g + cap for g in element.guarantee))
            self._functions(element)
            element.limits = limits
            chosen.append((element, ratio))
        if not chosen:
            return
        lightest = min(ratio for _, ratio in chosen)
        stretches = [self.ratio(ratio, lightest) for _, ratio in chosen]
        parts = []
        for (element, _), stretch in zip(chosen, stretches, strict=True):
            assert element.fitted is not None
            suggested = element.fitted.by_suggestion.stretched(stretch, self.one)
            parts.append(_excess(suggested, element.guarantee, zero))
        excess = Function.sum(parts)
        low, high = excess(excess.start), excess(excess.end)
        bound = tuple(min(max(a, lo), hi) for a, lo, hi in zip(left, low, high, strict=True))
        fit_factor = fit(excess, bound, bound).at(zero)[0]
        for (element, _), stretch in zip(chosen, stretches, strict=True):
            integral = self._within(element, min(self.one, fit_factor * stretch))
            integral = vmin(integral, self._available_limits(element))
            self._raise_integral(element, integral)
            element.last_ratio = _exact_ratio(max(integral, default=zero))

    # -- functions -----------------------------------------------------------------------

    def _functions(self, element: _Element) -> None:
        """*Fair share by fit factor* of every element, then (``fit``) *max fit factor by
        suggestion* and *fair share by suggestion*, bottom-up."""
        for child in element.children:
            self._functions(child)
        if element.operation is not None:
            element.by_fit_factor = self._operation_by_fit_factor(element)
        elif element.mode is SchedulingMode.FIFO:
            element.by_fit_factor = self._fifo_by_fit_factor(element)
        else:
            element.by_fit_factor = self._fair_share_by_fit_factor(element)
        guarantees, limits = self._bounds(element)
        element.fitted = fit(element.by_fit_factor, guarantees, limits)

    def _operation_by_fit_factor(self, element: _Element) -> Function:
        """On [0, 1] resource r gets ``min(usage[r], f * max usage)``: current usage is covered
        first, equalised across resources; on [1, 2] it grows linearly to demand."""
        usage = self.shares(element.usage_numerators)
        demand = self.shares(element.demand_numerators)
        peak = max(usage, default=self.zero)
        xs: list[Number] = [self.zero]
        ys: list[Vector] = [self.zeros]
        if peak:
            for knee in sorted({u / peak for u in usage if u}):
                xs.append(knee)
                ys.append(tuple(min(u, knee * peak) for u in usage))
        else:
            xs.append(self.one)
            ys.append(usage)
        xs.append(self.two)
        ys.append(demand)
        return Function(tuple(xs), tuple(ys))

    def _fair_share_by_fit_factor(self, element: _Element) -> Function:
        """Child i is suggested ``min(1, f * w_i / w_min)``: weights split the suggestion.
        Children that demand nothing add nothing and are left out of the sum."""
        if not element.children:
            return Function.constant(self.zeros, self.zero, self.one)
        lightest = min(child.weight for child in element.children)
        parts = []
        for child in element.children:
            assert child.fitted is not None
            if not any(child.fitted.ys[-1]):
                continue
            parts.append(
                child.fitted.by_suggestion.stretched(self.ratio(child.weight, lightest), self.one)
            )
        if not parts:
            return Function.constant(self.zeros, self.zero, self.one)
        return Function.sum(parts)

    def _fifo_by_fit_factor(self, element: _Element) -> Function:
        if not element.children:
            return Function.constant(self.zeros, self.zero, self.one)
        pieces = []
        for child in element.children:
            assert child.fitted is not None
            pieces.append(child.fitted.by_suggestion)
        return Function.concatenation(pieces)

    def _bounds(self, element: _Element) -> tuple[Vector, Vector]:
        """Per resource, the guarantee and the limit clamped into the function's range, as
        ``PrepareMaxFitFactorBySuggestion`` narrows them."""
        function = element.by_fit_factor
        assert function is not None
        low, high = function(function.start), function(function.end)
        # The root is guaranteed the whole tree.
        guarantee = (
            (self.one,) * self.size if element.kind is ElementKind.ROOT else self.guarantee(element)
        )
        limits = tuple(
            min(max(lim, lo), hi) for lim, lo, hi in zip(element.limits, low, high, strict=True)
        )
        guarantees = tuple(
            min(max(g, lo), lim) for g, lo, lim in zip(guarantee, low, limits, strict=True)
        )
        return guarantees, limits

    # -- top-down ------------------------------------------------------------------------

    def distribute(self, element: _Element, suggestion: Number) -> None:
        """``ComputeAndSetFairShare``: the element takes FSBS(s) and passes its fit factor
        down. Using the left-continuous MFFBS keeps the children's sum equal to the pool's
        share exactly, so YTsaurus's binary-search repair is never needed."""
        assert element.fitted is not None
        fit_factor, element.fair_share = element.fitted.at(suggestion)
        if not element.children:
            return
        zero, one = self.zero, self.one
        if element.mode is SchedulingMode.FIFO:
            for index, child in enumerate(element.children):
                self.distribute(child, min(max(fit_factor - index, zero), one))
        else:
            lightest = min(child.weight for child in element.children)
            for child in element.children:
                self.distribute(child, min(one, fit_factor * self.ratio(child.weight, lightest)))


# -- starvation ------------------------------------------------------------------------------


def is_below_fair_share(
    fair_share: Vector, usage: Vector, demand: Vector, tolerance: Fraction
) -> bool:
    """``GetStatusImpl``: usage strictly under ``min(fair share * tolerance, demand)`` in every
    resource that is not blocked (blocked: fair share already covers demand); when every
    resource is blocked, one resource under its bound is enough.

    Compared as integer cross-products of the ratios: exact, and several times cheaper than
    ``Fraction`` arithmetic (this runs for every element described)."""
    tn, td = tolerance.as_integer_ratio()
    any_open = blocked_below = False
    for f, u, d in zip(fair_share, usage, demand, strict=True):
        fn, fd = f.as_integer_ratio()
        un, ud = u.as_integer_ratio()
        dn, dd = d.as_integer_ratio()
        # u < min(f * tolerance, d)
        below = un * fd * td < fn * tn * ud and un * dd < dn * ud
        if fn * dd < dn * fd:  # f < d: the resource is open
            if not below:
                return False
            any_open = True
        elif below:
            blocked_below = True
    return any_open or blocked_below


def _starvation(
    operation: OperationSnapshot | None,
    fair_share: Vector,
    usage: Vector,
    demand: Vector,
    settings: StarvationSettings,
    now: float,
    since: float | None,
) -> Starvation:
    tolerance, timeout_ms = settings.tolerance, settings.timeout_ms
    if operation is not None:
        if fair_share == demand:
            # An operation whose whole demand is its fair share must get all of it.
            tolerance = ONE
        # Small operations starve sooner: timeout * min(1, pending jobs / coefficient 1).
        timeout_ms = timeout_ms * min(1, operation.pending_job_count)
    below = is_below_fair_share(fair_share, usage, demand, tolerance)
    if not below:
        return _NOT_BELOW
    start = now if since is None else since
    starving = now > start + timeout_ms / 1000
    return Starvation(
        True, start, StarvationStatus.STARVING if starving else StarvationStatus.NON_STARVING
    )


#: Most elements' starvation: one shared (immutable) value.
_NOT_BELOW = Starvation(False, None, StarvationStatus.NON_STARVING)


def _snap(
    computed: Vector, candidates: Sequence[tuple[Vector, Vector]], known: dict[float, Fraction]
) -> Vector:
    """The float backend's output boundary: per resource, the first exact candidate (demand,
    usage, limit, guarantee; each given with the float the update computed with) within
    ``SNAP_EPSILON``, 0 likewise, else the float's exact value (never outside [0, 1]), from
    ``known`` when an earlier element had the same float (siblings often do)."""
    pairs = cast(Sequence[tuple[Vector, Sequence[float]]], candidates)
    if computed == pairs[0][1]:  # every resource at the first candidate: a satisfied element
        return pairs[0][0]
    snapped: list[Number] = []
    for r, value in enumerate(cast(Sequence[float], computed)):
        for precise, rounded in pairs:
            # Compared as floats: a float minus a Fraction would build a Fraction.
            if abs(value - rounded[r]) <= SNAP_EPSILON:
                snapped.append(precise[r])
                break
        else:
            if abs(value) <= SNAP_EPSILON:
                snapped.append(ZERO)
                continue
            fraction = known.get(value)
            if fraction is None:
                fraction = known[value] = Fraction(min(max(value, 0.0), 1.0))
            snapped.append(fraction)
    return tuple(snapped)


class _Described(Mapping[str, ElementShares]):
    """A read-only name -> :class:`ElementShares` map that describes an element the first time
    it is read. The update itself is done when this is built; describing (exact conversions,
    detailed split, dominant resource, starvation) is per element, so a caller that reads a
    few operations of a large tree does not pay for all of them."""

    __slots__ = ("_cache", "_describe", "_elements")

    def __init__(
        self, elements: dict[str, _Element], describe: Callable[[_Element], ElementShares]
    ) -> None:
        self._elements = elements
        self._describe = describe
        self._cache: dict[str, ElementShares] = {}

    def __getitem__(self, name: str) -> ElementShares:
        shares = self._cache.get(name)
        if shares is None:
            shares = self._cache[name] = self._describe(self._elements[name])
        return shares

    def __iter__(self) -> Iterator[str]:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __contains__(self, name: object) -> bool:
        return name in self._elements

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    # Asking for every value is reading every value: described in one go, collector paused.
    def values(self) -> ValuesView[ElementShares]:
        self._describe_all()
        return super().values()

    def items(self) -> ItemsView[str, ElementShares]:
        self._describe_all()
        return super().items()

    def _describe_all(self) -> None:
        if len(self._cache) == len(self._elements):
            return
        with collector_paused():
            for name, element in self._elements.items():
                if name not in self._cache:
                    self._cache[name] = self._describe(element)


# -- entry point -----------------------------------------------------------------------------


def compute_fair_share(
    snapshot: TreeSnapshot,
    *,
    now: float | None = None,
    below_fair_share_since: Mapping[tuple[ElementKind, str], float] | None = None,
    numeric: Numeric = "auto",
) -> FairShareResult:
    """One fair-share update. With ``now`` (seconds, any epoch) it also evaluates starvation;
    ``below_fair_share_since`` carries each element's ``starving_since`` timestamp from the
    previous update (the result's ``Starvation.below_fair_share_since`` is the next one).

    ``numeric``: ``"exact"`` computes in ``Fraction``; ``"float"`` in floats (by the compiled
    ``kernel`` where it is built), reporting each share as the exact demand / usage / limit /
    guarantee / 0 it is within ``SNAP_EPSILON`` of (else the float's value); ``"auto"``
    (default) is exact up to ``EXACT_ELEMENT_LIMIT`` pools + operations and float above
    (``docs/trees.md``, "Speed"). Pools and operations are described (and starvation
    evaluated) lazily, when the result's maps are read; ``values()`` / ``items()`` describe
    them all at once."""
    validate_snapshot(snapshot)
    if numeric == "auto":
        exact = len(snapshot.pools) + len(snapshot.operations) <= EXACT_ELEMENT_LIMIT
    elif numeric in ("exact", "float"):
        exact = numeric == "exact"
    else:
        raise ValueError(f"numeric must be 'auto', 'exact' or 'float' (got {numeric!r})")
    with collector_paused():
        update = _Update(snapshot, exact)
        update.solve()
    since = below_fair_share_since or {}
    pool_settings: dict[str, StarvationSettings] = {
        pool.name: pool.starvation for pool in snapshot.pools
    }
    # An operation started in the root itself (forbid_immediate_operations_in_root off)
    # starves by the tree's options.
    pool_settings.setdefault(ROOT, snapshot.starvation)
    resources = update.resources
    dens = update.dens
    no_limits = update.unlimited[0]
    nothing = zeros(update.size)

    def shares(vector: Sequence[Number]) -> Shares:
        return MappingProxyType(dict(zip(resources, cast(Sequence[Fraction], vector), strict=True)))

    unlimited_shares, no_shares = shares(no_limits), shares(nothing)
    # Operations of a large tree repeat a few job vectors and counts: each distinct usage or
    # demand is converted once (a Fraction costs a gcd) and its read-only map is shared.
    converted: dict[tuple[int, ...], tuple[Vector, Shares, Vector, int]] = {}

    def exact_shares(numerators: tuple[int, ...]) -> tuple[Vector, Shares, Vector, int]:
        """The shares, as a map, in the update's numbers, and the largest one's index."""
        known = converted.get(numerators)
        if known is None:
            vector = tuple(map(Fraction, numerators, dens))
            known = converted[numerators] = (
                vector,
                shares(vector),
                update.shares(numerators),
                _dominant(numerators, dens),
            )
        return known

    fractions: dict[float, Fraction] = {}
    saturation = Fraction(snapshot.integral_guarantees.pool_capacity_saturation_period, 1000)

    def integral_of(element: _Element) -> IntegralShares | None:
        pool = element.pool
        if pool is None or pool.integral_guarantees.guarantee_type is _NO_INTEGRAL:
            return None
        settings = pool.integral_guarantees
        volume = {
            r: v for r, v, t in zip(resources, element.volume, update.totals, strict=True) if t
        }
        ratio_volume = update.ratio_volume(element)
        burst = settings.guarantee_type is IntegralGuaranteeType.BURST
        return IntegralShares(
            guarantee_type=settings.guarantee_type,
            specified_burst_ratio=update.max_ratio(settings.burst_guarantee_resources),
            specified_resource_flow_ratio=element.flow_ratio,
            burst_ratio=element.burst_ratio,
            total_burst_ratio=element.total_burst_ratio,
            total_resource_flow_ratio=element.total_flow_ratio,
            accumulated_resource_volume=MappingProxyType(volume),
            accumulated_resource_ratio_volume=ratio_volume,
            integral_pool_capacity=element.flow_ratio * saturation,
            estimated_burst_usage_duration_seconds=(
                ratio_volume / (element.burst_ratio - element.flow_ratio)
                if burst and element.burst_ratio > element.flow_ratio
                else None
            ),
            state=IntegralState(MappingProxyType(volume), element.last_ratio),
        )

    def describe(element: _Element) -> ElementShares:
        usage, usage_shares, usage_numbers, usage_dominant = exact_shares(element.usage_numerators)
        demand, demand_shares, demand_numbers, demand_dominant = exact_shares(
            element.demand_numerators
        )
        operation = element.operation
        if operation is not None:
            limits = (
                update.exact_limits_share(operation.resource_limits)
                if operation.resource_limits
                else no_limits
            )
            guarantee = nothing
        else:
            limits, guarantee = element.exact_limits, element.exact_guarantee
        if update.exact:
            fair_share = element.fair_share
        else:
            fair_share = _snap(
                update.fair_share(element),
                (
                    (demand, demand_numbers),
                    (usage, usage_numbers),
                    (limits, element.limits),
                    (guarantee, element.guarantee),
                ),
                fractions,
            )
        starvation = None
        if now is not None and element.kind is not ElementKind.ROOT:
            settings = (
                operation.starvation or pool_settings[operation.pool]
                if operation is not None
                else pool_settings[element.name]
            )
            if operation is not None or snapshot.enable_pool_starvation:
                starvation = _starvation(
                    operation,
                    fair_share,
                    usage,
                    demand,
                    settings,
                    now,
                    since.get((element.kind, element.name)),
                )
        # Identity, not equality: a satisfied operation's share is its demand's very objects.
        total_shares = demand_shares if all(map(is_, fair_share, demand)) else shares(fair_share)
        proposed = (
            nothing
            if not element.proposed
            else element.proposed
            if update.exact
            else tuple(map(_exact_ratio, element.proposed))
        )
        integral_part: Shares = no_shares
        if guarantee is not nothing and any(guarantee):
            within = vmin(fair_share, guarantee)
            strong = shares(within)
            rest = sub(fair_share, within)
        else:  # shares are never negative
            strong, rest = no_shares, fair_share
        if proposed is not nothing and any(proposed):
            integral = vmin(rest, proposed)
            integral_part = shares(integral)
            rest = sub(rest, integral)
        proportional = total_shares if rest is fair_share else shares(rest)
        return ElementShares(
            kind=element.kind,
            name=element.name,
            parent=element.parent.name if element.parent is not None else None,
            weight=element.weight,
            fair_share=DetailedFairShare(
                strong_guarantee=strong,
                integral_guarantee=integral_part,
                weight_proportional=proportional,
                total=total_shares,
            ),
            usage_share=usage_shares,
            demand_share=demand_shares,
            limits_share=unlimited_shares if limits is no_limits else shares(limits),
            strong_guarantee_share=no_shares if guarantee is nothing else shares(guarantee),
            # The largest usage share, or demand share while usage is zero.
            dominant_resource=resources[
                usage_dominant if any(element.usage_numerators) else demand_dominant
            ],
            fifo_index=element.fifo_index,
            starvation=starvation,
            proposed_integral_share=no_shares if proposed is nothing else shares(proposed),
            integral=integral_of(element),
        )

    pools: dict[str, _Element] = {}
    operations: dict[str, _Element] = {}
    for element in update.order:
        if element.kind is ElementKind.POOL:
            pools[element.name] = element
        elif element.kind is ElementKind.OPERATION:
            operations[element.name] = element
    return FairShareResult(
        resources=resources,
        root=describe(update.root),
        pools=_Described(pools, describe),
        operations=_Described(operations, describe),
        warnings=tuple(update.warnings),
    )


def _dominant(numerators: tuple[int, ...], dens: tuple[int, ...]) -> int:
    """The resource with the largest share; ties go to the first resource in YTsaurus's order.
    Shares are numerators over ``dens``, compared by cross-multiplying (integers: exact, and
    much cheaper than ``Fraction`` comparisons)."""
    best = 0
    for r in range(1, len(numerators)):
        if numerators[r] * dens[best] > numerators[best] * dens[r]:
            best = r
    return best


def _exact_ratio(value: Number) -> Fraction:
    """A share ratio the next update consumes, exact: a float's own value, or 0 within
    ``SNAP_EPSILON`` of it (rounding residue)."""
    if isinstance(value, float) and abs(value) <= SNAP_EPSILON:
        return ZERO
    return Fraction(value)


def _excess(function: Function, floor: Vector, zero: Number) -> Function:
    """``x -> max(function(x) - floor, 0)`` per resource: the points where a component crosses
    its floor are added, so the result is piecewise linear on its own points."""
    xs, ys = function.xs, function.ys
    out_x: list[Number] = [xs[0]]
    out_y: list[Vector] = [ys[0]]
    for index in range(1, len(xs)):
        x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
        if x1 > x0:
            crossings = sorted(
                {
                    x0 + (x1 - x0) * (f - a) / (b - a)
                    for a, b, f in zip(y0, y1, floor, strict=True)
                    if a < f < b
                }
            )
            for x in crossings:
                t = (x - x0) / (x1 - x0)
                out_x.append(x)
                out_y.append(tuple(a + (b - a) * t for a, b in zip(y0, y1, strict=True)))
        out_x.append(x1)
        out_y.append(y1)
    return Function(
        tuple(out_x),
        tuple(tuple(max(y - f, zero) for y, f in zip(v, floor, strict=True)) for v in out_y),
    )


def _walk(element: _Element, pools_only: bool = False) -> Iterable[_Element]:
    """The subtree in tree order; ``pools_only`` skips the operations (most elements)."""
    stack = [element]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.pools if pools_only else current.children))


def validate_snapshot(snapshot: TreeSnapshot) -> None:
    """Structural checks the front-end normally guarantees; a broken snapshot is a bug, so
    these raise ``ValueError`` naming what is wrong."""
    names = [pool.name for pool in snapshot.pools]
    if len(set(names)) != len(names) or ROOT in names:
        raise ValueError(f"pool names must be unique and not {ROOT!r}: {names}")
    known = {*names, ROOT}
    parents = {pool.name: pool.parent or ROOT for pool in snapshot.pools}
    for pool in snapshot.pools:
        if parents[pool.name] not in known:
            raise ValueError(f"pool {pool.name!r}: unknown parent {pool.parent!r}")
        seen = {pool.name}
        ancestor = parents[pool.name]
        while ancestor != ROOT:
            if ancestor in seen:
                raise ValueError(f"pool {pool.name!r}: parent chain has a cycle")
            seen.add(ancestor)
            ancestor = parents[ancestor]
        if pool.weight is not None and pool.weight <= 0:
            raise ValueError(f"pool {pool.name!r}: weight must be positive")
    integral = {
        pool.name
        for pool in snapshot.pools
        if pool.integral_guarantees.guarantee_type is not _NO_INTEGRAL
    }
    for name in integral:
        ancestor = parents[name]
        while ancestor != ROOT:
            if ancestor in integral:
                raise ValueError(f"pool {name!r}: integral pools do not nest (in {ancestor!r})")
            ancestor = parents[ancestor]
    if snapshot.integral_guarantees.smooth_period <= 0:
        raise ValueError("integral_guarantees.smooth_period must be positive")
    fifo = {pool.name for pool in snapshot.pools if pool.mode is SchedulingMode.FIFO}
    for pool in snapshot.pools:
        if parents[pool.name] in fifo:
            raise ValueError(f"pool {pool.name!r}: a FIFO pool holds operations only")
    operations = snapshot.operations
    if len(set(map(attrgetter("id"), operations))) != len(operations):
        raise ValueError("operation ids must be unique")

    def least(name: str) -> int:
        return cast(int, min(map(attrgetter(name), operations), default=1))

    # Column checks at C speed (a weight's sign is its numerator's); the loop below only
    # finds the first operation at fault.
    if (
        known.issuperset(map(attrgetter("pool"), operations))
        and least("weight.numerator") > 0
        and min(least("running_job_count"), least("pending_job_count")) >= 0
    ):
        return
    for operation in operations:
        if operation.pool not in known:
            raise ValueError(f"operation {operation.id!r}: unknown pool {operation.pool!r}")
        if operation.weight <= 0:
            raise ValueError(f"operation {operation.id!r}: weight must be positive")
        if min(operation.running_job_count, operation.pending_job_count) < 0:
            raise ValueError(f"operation {operation.id!r}: job counts must be non-negative")


def children_of(result: FairShareResult, parent: str) -> Sequence[ElementShares]:
    """The direct children (pools and operations) of a pool, ``ROOT`` for the root's."""
    return [
        element
        for element in (*result.pools.values(), *result.operations.values())
        if element.parent == parent
    ]


__all__ = [
    "ROOT",
    "STANDARD_RESOURCES",
    "DetailedFairShare",
    "ElementKind",
    "ElementShares",
    "FairShareResult",
    "FifoSortParameter",
    "IntegralGuaranteeType",
    "IntegralGuarantees",
    "IntegralSettings",
    "IntegralShares",
    "IntegralState",
    "OperationSnapshot",
    "PoolSnapshot",
    "SchedulingMode",
    "Starvation",
    "StarvationSettings",
    "StarvationStatus",
    "TreeSnapshot",
    "children_of",
    "compute_fair_share",
    "is_below_fair_share",
    "resource_order",
    "validate_snapshot",
]
