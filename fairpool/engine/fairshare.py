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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from itertools import combinations, pairwise
from types import MappingProxyType

from fairpool.engine.piecewise import (
    ONE,
    ZERO,
    Function,
    Vector,
    dominated,
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


@dataclass(slots=True)
class _Element:
    """Per-update working state of one element (mutable only inside one update)."""

    kind: ElementKind
    name: str
    parent: _Element | None
    mode: SchedulingMode = SchedulingMode.FAIR_SHARE
    specified_weight: Fraction | None = None
    pool: PoolSnapshot | None = None
    operation: OperationSnapshot | None = None
    children: list[_Element] = field(default_factory=list)
    usage: Vector = ()
    demand: Vector = ()
    limits: Vector = ()
    guarantee: Vector = ()
    weight: Fraction = ONE
    fifo_index: int | None = None
    by_fit_factor: Function | None = None
    fit_factor_by_suggestion: Function | None = None
    by_suggestion: Function | None = None
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
    """One fair-share update over one snapshot."""

    def __init__(self, snapshot: TreeSnapshot) -> None:
        self.snapshot = snapshot
        self.resources = resource_order(snapshot)
        self.size = len(self.resources)
        self.totals = tuple(snapshot.total_resources.get(r, 0) for r in self.resources)
        self.main = self.resources.index(snapshot.main_resource)
        self.warnings: list[str] = []
        self.root = self._build()

    def vector(self, amounts: Resources) -> Vector:
        return tuple(
            _share(amounts.get(r, 0), t) for r, t in zip(self.resources, self.totals, strict=True)
        )

    def limits_share(self, limits: Resources) -> Vector:
        # min(limits, total) / total; a resource the tree lacks has nothing to give.
        return tuple(
            _share(min(limits.get(r, t), t), t) if t else ZERO
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
        for operation in self.snapshot.operations:
            parent = pools[operation.pool]
            parent.children.append(
                _Element(
                    ElementKind.OPERATION,
                    operation.id,
                    parent,
                    specified_weight=operation.weight,
                    operation=operation,
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
        if element.operation is not None:
            element.usage = self.vector(element.operation.usage)
            element.demand = self.vector(element.operation.demand)
            element.limits = self.limits_share(element.operation.resource_limits)
            element.guarantee = zeros(self.size)
            return
        for child in element.children:
            self._cumulative(child)
        element.usage = total((c.usage for c in element.children), self.size)
        element.demand = total((c.demand for c in element.children), self.size)
        limits = element.pool.resource_limits if element.pool is not None else {}
        element.limits = self.limits_share(limits)
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

    # -- guarantees ----------------------------------------------------------------------

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
            child.guarantee = tuple(
                _share(0, t) if not t else a / t
                for a, t in zip(child_amounts, self.totals, strict=True)
            )
            self._infer_guarantees(child, tuple(child_amounts))
        for child in parent.children:
            if child.operation is not None:
                child.guarantee = zeros(self.size)

    def _adjust_guarantees(self, parent: _Element, available: Vector) -> None:
        """``AdjustStrongGuarantees``: clamp to limits, then scale children that overrun their
        parent by one common factor (the largest that fits in every resource)."""
        for child in parent.children:
            child.guarantee = vmin(child.guarantee, child.limits)
        children_sum = total((c.guarantee for c in parent.children), self.size)
        if not dominated(children_sum, available):
            factor = min(a / s for a, s in zip(available, children_sum, strict=True) if s > a)
            self.warnings.append(
                f"strong guarantees of the children of {parent.name} exceed "
                f"{'the tree total' if parent.kind is ElementKind.ROOT else 'its guarantee'}; "
                f"scaled by {factor}"
            )
            for child in parent.children:
                child.guarantee = scale(child.guarantee, factor)
        if parent.kind is ElementKind.ROOT:
            parent.guarantee = total((c.guarantee for c in parent.children), self.size)
        for child in parent.children:
            self._adjust_guarantees(child, child.guarantee)

    def _weights(self, element: _Element) -> None:
        """``GetWeight``: specified, else multiplier * own / parent's max strong guarantee
        share when the tree infers weights (1 if either is zero), else 1."""
        multiplier = self.snapshot.infer_weight_from_guarantees_share_multiplier
        for child in element.children:
            if child.specified_weight is not None:
                child.weight = child.specified_weight
            elif multiplier is not None:
                own, parents = (
                    max(child.guarantee, default=ZERO),
                    max(element.guarantee, default=ZERO),
                )
                child.weight = multiplier * own / parents if own and parents else ONE
            self._weights(child)

    # -- functions -----------------------------------------------------------------------

    def _functions(self, element: _Element) -> None:
        """The three functions of every element, bottom-up."""
        for child in element.children:
            self._functions(child)
        if element.operation is not None:
            element.by_fit_factor = self._operation_by_fit_factor(element)
        elif element.mode is SchedulingMode.FIFO:
            element.by_fit_factor = self._fifo_by_fit_factor(element)
        else:
            element.by_fit_factor = self._fair_share_by_fit_factor(element)
        element.fit_factor_by_suggestion = self._max_fit_factor_by_suggestion(element)
        element.by_suggestion = self._compose(element)

    def _operation_by_fit_factor(self, element: _Element) -> Function:
        """On [0, 1] resource r gets ``min(usage[r], f * max usage)``: current usage is covered
        first, equalised across resources; on [1, 2] it grows linearly to demand."""
        usage, demand = element.usage, element.demand
        peak = max(usage, default=ZERO)
        xs: list[Fraction] = [ZERO]
        ys: list[Vector] = [zeros(self.size)]
        if peak:
            for knee in sorted({u / peak for u in usage if u}):
                xs.append(knee)
                ys.append(tuple(min(u, knee * peak) for u in usage))
        else:
            xs.append(ONE)
            ys.append(usage)
        xs.append(OPERATION_FIT_FACTOR_END)
        ys.append(demand)
        return Function(tuple(xs), tuple(ys))

    def _fair_share_by_fit_factor(self, element: _Element) -> Function:
        """Child i is suggested ``min(1, f * w_i / w_min)``: weights split the suggestion."""
        if not element.children:
            return Function.constant(zeros(self.size))
        lightest = min(child.weight for child in element.children)
        parts = []
        for child in element.children:
            assert child.by_suggestion is not None
            parts.append(child.by_suggestion.stretched(child.weight / lightest, ONE))
        return Function.sum(parts)

    def _fifo_by_fit_factor(self, element: _Element) -> Function:
        if not element.children:
            return Function.constant(zeros(self.size))
        pieces = []
        for child in element.children:
            assert child.by_suggestion is not None
            pieces.append(child.by_suggestion)
        return Function.concatenation(pieces)

    def _bounds(self, element: _Element) -> tuple[Vector, Vector]:
        """Per resource, the guarantee and the limit clamped into the function's range, as
        ``PrepareMaxFitFactorBySuggestion`` narrows them."""
        function = element.by_fit_factor
        assert function is not None
        low, high = function(function.start), function(function.end)
        # The root is guaranteed the whole tree.
        guarantee = (ONE,) * self.size if element.kind is ElementKind.ROOT else element.guarantee
        limits = tuple(
            min(max(lim, lo), hi) for lim, lo, hi in zip(element.limits, low, high, strict=True)
        )
        guarantees = tuple(
            min(max(g, lo), lim) for g, lo, lim in zip(guarantee, low, limits, strict=True)
        )
        return guarantees, limits

    def _max_fit_factor_by_suggestion(self, element: _Element) -> Function:
        """MFFBS(s): the largest fit factor whose FSBFF stays within
        ``min(guarantee + s, limits)`` in every resource."""
        function = element.by_fit_factor
        assert function is not None
        guarantees, limits = self._bounds(element)

        def per_resource(s: Fraction) -> list[Fraction]:
            return [
                function.max_argument(r, min(guarantees[r] + s, limits[r]))
                for r in range(self.size)
            ]

        def evaluate(s: Fraction) -> Vector:
            return (min(per_resource(s)),)

        # Each resource's inverse bends where its bound meets a value of the function or
        # reaches the limit; the minimum also bends where two resources' inverses cross.
        breaks = {ZERO, ONE}
        for r in range(self.size):
            breaks.add(limits[r] - guarantees[r])
            breaks.update(y[r] - guarantees[r] for y in function.ys)
        ordered = sorted(b for b in breaks if ZERO <= b <= ONE)
        crossings: set[Fraction] = set()
        for low, high in pairwise(ordered):
            third = (high - low) / 3
            a, b = per_resource(low + third), per_resource(high - third)
            for r, q in combinations(range(self.size), 2):
                slope_difference = (b[r] - a[r]) - (b[q] - a[q])
                if slope_difference:
                    crossing = low + third + (a[q] - a[r]) / slope_difference * third
                    if low < crossing < high:
                        crossings.add(crossing)
        return Function.from_breakpoints([*ordered, *crossings], evaluate)

    def _compose(self, element: _Element) -> Function:
        """FSBS = FSBFF after MFFBS; it bends where MFFBS does and where MFFBS passes a
        breakpoint of FSBFF."""
        outer, inner = element.by_fit_factor, element.fit_factor_by_suggestion
        assert outer is not None and inner is not None
        breaks = set(inner.xs)
        for (s0, (f0,)), (s1, (f1,)) in zip(
            zip(inner.xs, inner.ys, strict=True),
            zip(inner.xs[1:], inner.ys[1:], strict=True),
            strict=False,
        ):
            if s0 < s1 and f0 < f1:
                breaks.update(
                    s0 + (x - f0) * (s1 - s0) / (f1 - f0) for x in outer.xs if f0 < x < f1
                )

        def evaluate(s: Fraction) -> Vector:
            return outer(inner(s)[0])

        return Function.from_breakpoints(breaks, evaluate)

    # -- top-down ------------------------------------------------------------------------

    def distribute(self, element: _Element, suggestion: Fraction) -> None:
        """``ComputeAndSetFairShare``: the element takes FSBS(s) and passes its fit factor
        down. Using the left-continuous MFFBS keeps the children's sum equal to the pool's
        share exactly, so YTsaurus's binary-search repair is never needed."""
        assert element.by_suggestion is not None and element.fit_factor_by_suggestion is not None
        element.fair_share = element.by_suggestion(suggestion)
        if not element.children:
            return
        fit_factor = element.fit_factor_by_suggestion(suggestion)[0]
        if element.mode is SchedulingMode.FIFO:
            for index, child in enumerate(element.children):
                self.distribute(child, min(max(fit_factor - index, ZERO), ONE))
        else:
            lightest = min(child.weight for child in element.children)
            for child in element.children:
                self.distribute(child, min(ONE, fit_factor * child.weight / lightest))


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
    element: _Element,
    settings: StarvationSettings,
    now: float,
    since: float | None,
) -> Starvation:
    tolerance, timeout_ms = settings.tolerance, settings.timeout_ms
    operation = element.operation
    if operation is not None:
        if element.fair_share == element.demand:
            # An operation whose whole demand is its fair share must get all of it.
            tolerance = ONE
        # Small operations starve sooner: timeout * min(1, pending jobs / coefficient 1).
        timeout_ms = timeout_ms * min(1, operation.pending_job_count)
    below = is_below_fair_share(element.fair_share, element.usage, element.demand, tolerance)
    if not below:
        return Starvation(False, None, StarvationStatus.NON_STARVING)
    start = now if since is None else since
    starving = now > start + timeout_ms / 1000
    return Starvation(
        True, start, StarvationStatus.STARVING if starving else StarvationStatus.NON_STARVING
    )


# -- entry point -----------------------------------------------------------------------------


def compute_fair_share(
    snapshot: TreeSnapshot,
    *,
    now: float | None = None,
    below_fair_share_since: Mapping[tuple[ElementKind, str], float] | None = None,
) -> FairShareResult:
    """One fair-share update. With ``now`` (seconds, any epoch) it also evaluates starvation;
    ``below_fair_share_since`` carries each element's ``starving_since`` timestamp from the
    previous update (the result's ``Starvation.below_fair_share_since`` is the next one)."""
    validate_snapshot(snapshot)
    update = _Update(snapshot)
    update.distribute(update.root, ONE)
    since = below_fair_share_since or {}
    pool_settings: dict[str, StarvationSettings] = {
        pool.name: pool.starvation for pool in snapshot.pools
    }

    def shares(vector: Vector) -> Shares:
        return MappingProxyType(dict(zip(update.resources, vector, strict=True)))

    def describe(element: _Element) -> ElementShares:
        starvation = None
        if now is not None and element.kind is not ElementKind.ROOT:
            settings = (
                element.operation.starvation or pool_settings[element.operation.pool]
                if element.operation is not None
                else pool_settings[element.name]
            )
            if element.kind is ElementKind.OPERATION or snapshot.enable_pool_starvation:
                starvation = _starvation(
                    element, settings, now, since.get((element.kind, element.name))
                )
        strong = vmin(element.fair_share, element.guarantee)
        return ElementShares(
            kind=element.kind,
            name=element.name,
            parent=element.parent.name if element.parent is not None else None,
            weight=element.weight,
            fair_share=DetailedFairShare(
                strong_guarantee=shares(strong),
                weight_proportional=shares(sub(element.fair_share, strong)),
                total=shares(element.fair_share),
            ),
            usage_share=shares(element.usage),
            demand_share=shares(element.demand),
            limits_share=shares(element.limits),
            strong_guarantee_share=shares(element.guarantee),
            dominant_resource=update.resources[_dominant(element)],
            fifo_index=element.fifo_index,
            starvation=starvation,
        )

    pools: dict[str, ElementShares] = {}
    operations: dict[str, ElementShares] = {}
    for element in _walk(update.root):
        if element.kind is ElementKind.POOL:
            pools[element.name] = describe(element)
        elif element.kind is ElementKind.OPERATION:
            operations[element.name] = describe(element)
    return FairShareResult(
        resources=update.resources,
        root=describe(update.root),
        pools=MappingProxyType(pools),
        operations=MappingProxyType(operations),
        warnings=tuple(update.warnings),
    )


def _dominant(element: _Element) -> int:
    """The resource with the largest usage share, or demand share while usage is zero; ties go
    to the first resource in YTsaurus's order."""
    vector = element.usage if any(element.usage) else element.demand
    return max(range(len(vector)), key=lambda r: (vector[r], -r)) if vector else 0


def _walk(element: _Element) -> Iterable[_Element]:
    yield element
    for child in element.children:
        yield from _walk(child)


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
