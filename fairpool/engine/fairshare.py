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

Not implemented (documented in ``docs/trees.md``): integral guarantees (burst / relaxed), the
step function for gang operations, ``best_allocation_share`` (the node-fit cap on an
operation's limits), aggressive starvation, promised-guarantee fair share and priority strong
guarantee adjustment.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from types import MappingProxyType
from typing import Literal, cast

from fairpool.engine.piecewise import (
    ONE,
    ZERO,
    Fitted,
    Function,
    Number,
    Vector,
    dominated,
    fit,
    scale,
    sub,
    total,
    vmin,
    zeros,
)

#: The resources YTsaurus knows, in its enum order: dominant-resource ties go to the first.
#: Other (custom) keys follow in name order.
STANDARD_RESOURCES = ("user_slots", "cpu", "gpu", "memory")

#: The root pool's name, as YTsaurus spells it.
ROOT = "<Root>"

#: An operation's fit factor runs over [0, 2]: usage is covered on [0, 1], demand on [1, 2].
OPERATION_FIT_FACTOR_END = Fraction(2)

Resources = Mapping[str, int]


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


# -- input ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StarvationSettings:
    """Effective starvation options of one element (already inherited pool -> parent -> tree)."""

    #: ``fair_share_starvation_tolerance``, in [0, 1].
    tolerance: Fraction = Fraction(4, 5)
    #: ``fair_share_starvation_timeout`` in milliseconds (YTsaurus units).
    timeout_ms: int = 30_000


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


# -- output --------------------------------------------------------------------------------

Shares = Mapping[str, Fraction]


@dataclass(frozen=True, slots=True)
class DetailedFairShare:
    """The fair share split as YTsaurus's Orchid shows it (no integral part: not implemented)."""

    strong_guarantee: Shares
    weight_proportional: Shares
    total: Shares


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
EXACT_ELEMENT_LIMIT = 2_000

#: Float backend: a computed share within this of an exact candidate (demand, usage, limits,
#: guarantee, 0) is reported as that candidate. Shares are fractions of the tree, in [0, 1];
#: the float computation's own error is around 1e-12 even for the largest benchmark trees.
SNAP_EPSILON = 1e-9

Numeric = Literal["auto", "exact", "float"]


@dataclass(slots=True)
class _Element:
    """Per-update working state of one element (mutable only inside one update).

    Usage and demand are kept as integer numerators over the tree total (``_Update.dens``),
    so that sums are exact and cheap; ``usage`` / ``demand`` / ``limits`` / ``guarantee`` are in
    the update's number type (``Fraction`` or ``float``), ``exact_*`` always in ``Fraction``
    (pools only; operations compute theirs when described)."""

    kind: ElementKind
    name: str
    parent: _Element | None
    mode: SchedulingMode = SchedulingMode.FAIR_SHARE
    specified_weight: Fraction | None = None
    pool: PoolSnapshot | None = None
    operation: OperationSnapshot | None = None
    children: list[_Element] = field(default_factory=list)
    usage_numerators: tuple[int, ...] = ()
    demand_numerators: tuple[int, ...] = ()
    usage: Vector = ()
    demand: Vector = ()
    limits: Vector = ()
    guarantee: Vector = ()
    exact_limits: Vector = ()
    exact_guarantee: Vector = ()
    weight: Fraction = ONE
    fifo_index: int | None = None
    by_fit_factor: Function | None = None
    fitted: Fitted | None = None
    fair_share: Vector = ()


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
        self.dens = tuple(t or 1 for t in self.totals)
        self.main = self.resources.index(snapshot.main_resource)
        self.zero: Number = ZERO if exact else 0.0
        self.one: Number = ONE if exact else 1.0
        self.two: Number = OPERATION_FIT_FACTOR_END if exact else 2.0
        self.zeros: Vector = (self.zero,) * self.size
        self.warnings: list[str] = []
        self.root = self._build()

    def number(self, value: Fraction) -> Number:
        return value if self.exact else float(value)

    def numbers(self, vector: Vector) -> Vector:
        return vector if self.exact else tuple(float(x) for x in vector)

    def shares(self, numerators: tuple[int, ...]) -> Vector:
        if self.exact:
            return tuple(Fraction(n, d) for n, d in zip(numerators, self.dens, strict=True))
        return tuple(n / d for n, d in zip(numerators, self.dens, strict=True))

    def numerators(self, amounts: Resources, count: int) -> tuple[int, ...]:
        return tuple(
            amounts.get(r, 0) * count if t else int(bool(amounts.get(r, 0) * count))
            for r, t in zip(self.resources, self.totals, strict=True)
        )

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
        full = self.exact_limits_share({})
        unlimited = self.numbers(full)
        for operation in self.snapshot.operations:
            parent = pools[operation.pool]
            jobs = operation.running_job_count + (
                operation.pending_job_count if operation.running else 0
            )
            usage = self.numerators(operation.job_resources, operation.running_job_count)
            demand = self.numerators(operation.job_resources, jobs)
            parent.children.append(
                _Element(
                    ElementKind.OPERATION,
                    operation.id,
                    parent,
                    specified_weight=operation.weight,
                    operation=operation,
                    usage_numerators=usage,
                    demand_numerators=demand,
                    usage=self.shares(usage),
                    demand=self.shares(demand),
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
        self._adjust_guarantees(root, tuple(ONE for _ in self.resources))
        self._weights(root)
        self._functions(root)
        return root

    def _cumulative(self, element: _Element) -> None:
        """Usage, demand and limits bottom-up; FIFO order of a FIFO pool's operations."""
        usage = [0] * self.size
        demand = [0] * self.size
        for child in element.children:
            if child.operation is None:
                self._cumulative(child)
            for r, (u, d) in enumerate(
                zip(child.usage_numerators, child.demand_numerators, strict=True)
            ):
                usage[r] += u
                demand[r] += d
        element.usage_numerators = tuple(usage)
        element.demand_numerators = tuple(demand)
        element.usage = self.shares(element.usage_numerators)
        element.demand = self.shares(element.demand_numerators)
        limits = element.pool.resource_limits if element.pool is not None else {}
        element.exact_limits = self.exact_limits_share(limits)
        element.limits = self.numbers(element.exact_limits)
        if element.mode is SchedulingMode.FIFO:
            element.children.sort(key=lambda child: self._fifo_key(element, child))
            for index, child in enumerate(element.children):
                child.fifo_index = index
        else:
            element.children.sort(key=lambda child: (child.kind, child.name))

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
        pools = [c for c in parent.children if c.pool is not None]
        explicit = [c.pool.strong_guarantee_resources for c in pools if c.pool is not None]
        amounts: list[list[Fraction]] = [
            [Fraction(e.get(r, 0)) for r in self.resources] for e in explicit
        ]
        main_total = parent_amounts[self.main]
        for index, resource in enumerate(self.resources):
            if index == self.main:
                continue
            inferred = [k for k, e in enumerate(explicit) if resource not in e]
            for k in inferred:
                amounts[k][index] = (
                    amounts[k][self.main] / main_total * parent_amounts[index]
                    if main_total
                    else ZERO
                )
            if parent.kind is ElementKind.ROOT:
                continue
            residual = parent_amounts[index] - sum(
                (amounts[k][index] for k in range(len(pools)) if k not in inferred), ZERO
            )
            wanted = sum((amounts[k][index] for k in inferred), ZERO)
            if wanted > max(residual, ZERO):
                factor = max(residual, ZERO) / wanted
                for k in inferred:
                    amounts[k][index] *= factor
        for child, child_amounts in zip(pools, amounts, strict=True):
            child.exact_guarantee = tuple(
                _share(0, t) if not t else a / t
                for a, t in zip(child_amounts, self.totals, strict=True)
            )
            self._infer_guarantees(child, tuple(child_amounts))

    def _adjust_guarantees(self, parent: _Element, available: Vector) -> None:
        """``AdjustStrongGuarantees``: clamp to limits, then scale children that overrun their
        parent by one common factor (the largest that fits in every resource)."""
        pools = [c for c in parent.children if c.pool is not None]
        for child in pools:
            child.exact_guarantee = vmin(child.exact_guarantee, child.exact_limits)
        children_sum = total((c.exact_guarantee for c in pools), self.size)
        if not dominated(children_sum, available):
            factor = min(a / s for a, s in zip(available, children_sum, strict=True) if s > a)
            self.warnings.append(
                f"strong guarantees of the children of {parent.name} exceed "
                f"{'the tree total' if parent.kind is ElementKind.ROOT else 'its guarantee'}; "
                f"scaled by {factor}"
            )
            for child in pools:
                child.exact_guarantee = scale(child.exact_guarantee, factor)
        if parent.kind is ElementKind.ROOT:
            parent.exact_guarantee = total((c.exact_guarantee for c in pools), self.size)
            parent.guarantee = self.numbers(parent.exact_guarantee)
        for child in pools:
            child.guarantee = self.numbers(child.exact_guarantee)
            self._adjust_guarantees(child, child.exact_guarantee)

    def _weights(self, element: _Element) -> None:
        """``GetWeight``: specified, else multiplier * own / parent's max strong guarantee
        share when the tree infers weights (1 if either is zero), else 1. Operations always
        carry their own weight (set when they are built)."""
        multiplier = self.snapshot.infer_weight_from_guarantees_share_multiplier
        for child in element.children:
            if child.operation is not None:
                continue
            if child.specified_weight is not None:
                child.weight = child.specified_weight
            elif multiplier is not None:
                own, parents = (
                    max(child.exact_guarantee, default=ZERO),
                    max(element.exact_guarantee, default=ZERO),
                )
                child.weight = Fraction(multiplier * own / parents) if own and parents else ONE
            self._weights(child)

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
        usage, demand = element.usage, element.demand
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
            factor = child.weight / lightest
            parts.append(
                child.fitted.by_suggestion.stretched(
                    factor if self.exact else float(factor), self.one
                )
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
            (self.one,) * self.size if element.kind is ElementKind.ROOT else (element.guarantee)
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
                factor = child.weight / lightest
                self.distribute(
                    child, min(one, fit_factor * (factor if self.exact else float(factor)))
                )


# -- starvation ------------------------------------------------------------------------------


def is_below_fair_share(
    fair_share: Vector, usage: Vector, demand: Vector, tolerance: Fraction
) -> bool:
    """``GetStatusImpl``: usage strictly under ``min(fair share * tolerance, demand)`` in every
    resource that is not blocked (blocked: fair share already covers demand); when every
    resource is blocked, one resource under its bound is enough."""
    bounds = [min(f * tolerance, d) for f, d in zip(fair_share, demand, strict=True)]
    open_resources = [r for r, (f, d) in enumerate(zip(fair_share, demand, strict=True)) if f < d]
    if not open_resources:
        return any(u < b for u, b in zip(usage, bounds, strict=True))
    return all(usage[r] < bounds[r] for r in open_resources)


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
        return Starvation(False, None, StarvationStatus.NON_STARVING)
    start = now if since is None else since
    starving = now > start + timeout_ms / 1000
    return Starvation(
        True, start, StarvationStatus.STARVING if starving else StarvationStatus.NON_STARVING
    )


def _snap(value: Number, candidates: Iterable[Fraction]) -> Fraction:
    """The float backend's output boundary: an exact candidate within ``SNAP_EPSILON``, else
    the float's exact value (never outside [0, 1])."""
    if isinstance(value, Fraction):
        return value
    for candidate in candidates:
        # Compared as floats: a float minus a Fraction would build a Fraction.
        if abs(value - candidate.numerator / candidate.denominator) <= SNAP_EPSILON:
            return candidate
    return Fraction(min(max(value, 0.0), 1.0))


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

    ``numeric``: ``"exact"`` computes in ``Fraction``; ``"float"`` in floats, reporting each
    share as the exact demand / usage / limit / guarantee / 0 it is within ``SNAP_EPSILON`` of
    (else the float's value); ``"auto"`` (default) is exact up to ``EXACT_ELEMENT_LIMIT``
    pools + operations and float above (``docs/trees.md``, "Speed"). Pools and operations are
    described (and starvation evaluated) lazily, when the result's maps are read."""
    validate_snapshot(snapshot)
    if numeric == "auto":
        exact = len(snapshot.pools) + len(snapshot.operations) <= EXACT_ELEMENT_LIMIT
    elif numeric in ("exact", "float"):
        exact = numeric == "exact"
    else:
        raise ValueError(f"numeric must be 'auto', 'exact' or 'float' (got {numeric!r})")
    # The update allocates many short-lived cyclic objects (elements point at their parents);
    # the cyclic collector would walk the growing heap again and again while nothing is
    # garbage yet, so it is paused for the update (about a fifth of the time on large trees).
    collecting = gc.isenabled()
    gc.disable()
    try:
        update = _Update(snapshot, exact)
        update.distribute(update.root, update.one)
    finally:
        if collecting:
            gc.enable()
    since = below_fair_share_since or {}
    pool_settings: dict[str, StarvationSettings] = {
        pool.name: pool.starvation for pool in snapshot.pools
    }
    resources = update.resources
    dens = update.dens
    no_limits = update.exact_limits_share({})

    def shares(vector: Sequence[Number]) -> Shares:
        return MappingProxyType(dict(zip(resources, cast(Sequence[Fraction], vector), strict=True)))

    def describe(element: _Element) -> ElementShares:
        usage = tuple(Fraction(n, d) for n, d in zip(element.usage_numerators, dens, strict=True))
        demand = tuple(Fraction(n, d) for n, d in zip(element.demand_numerators, dens, strict=True))
        operation = element.operation
        if operation is not None:
            limits = (
                update.exact_limits_share(operation.resource_limits)
                if operation.resource_limits
                else no_limits
            )
            guarantee = zeros(update.size)
        else:
            limits, guarantee = element.exact_limits, element.exact_guarantee
        if update.exact:
            fair_share = element.fair_share
        else:
            fair_share = tuple(
                _snap(
                    value,
                    cast(
                        tuple[Fraction, ...], (demand[r], usage[r], limits[r], guarantee[r], ZERO)
                    ),
                )
                for r, value in enumerate(element.fair_share)
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
        strong = vmin(fair_share, guarantee)
        return ElementShares(
            kind=element.kind,
            name=element.name,
            parent=element.parent.name if element.parent is not None else None,
            weight=element.weight,
            fair_share=DetailedFairShare(
                strong_guarantee=shares(strong),
                weight_proportional=shares(sub(fair_share, strong)),
                total=shares(fair_share),
            ),
            usage_share=shares(usage),
            demand_share=shares(demand),
            limits_share=shares(limits),
            strong_guarantee_share=shares(guarantee),
            dominant_resource=resources[_dominant(usage, demand)],
            fifo_index=element.fifo_index,
            starvation=starvation,
        )

    pools: dict[str, _Element] = {}
    operations: dict[str, _Element] = {}
    for element in _walk(update.root):
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


def _dominant(usage: Vector, demand: Vector) -> int:
    """The resource with the largest usage share, or demand share while usage is zero; ties go
    to the first resource in YTsaurus's order."""
    vector = usage if any(usage) else demand
    return max(range(len(vector)), key=lambda r: (vector[r], -r)) if vector else 0


def _walk(element: _Element) -> Iterable[_Element]:
    stack = [element]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


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
    fifo = {pool.name for pool in snapshot.pools if pool.mode is SchedulingMode.FIFO}
    for pool in snapshot.pools:
        if parents[pool.name] in fifo:
            raise ValueError(f"pool {pool.name!r}: a FIFO pool holds operations only")
    ids = [operation.id for operation in snapshot.operations]
    if len(set(ids)) != len(ids):
        raise ValueError("operation ids must be unique")
    for operation in snapshot.operations:
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
