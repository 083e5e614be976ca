"""One reconcile pass: snapshot in, plan out. Pure, deterministic, near-linear.

Order of work (see docs/semantics.md for the rules in prose):

1. Hard rejection: placements that could not fit on an empty system are dropped; a request
   with none left is rejected with one reason per placement.
2. Every remaining (request, placement) pair is a queue entry. Entries are popped in one global
   order - entries that fit their leaf's unused guarantee first (unless the queue node says
   ``guarantee_first=False``), then placement priority (higher first), then oldest, then id,
   then placement index - which is each queue's own order, and tries a request's
   higher-priority placements before its lower ones. Serving guaranteed entries before
   borrowers is what reclaim would enforce anyway (an owner evicts a borrower whatever the
   priorities), so doing it up front never grants units only to take them back.
3. An entry that fits is granted, and the request's other entries disappear. One that is short
   only of capacity may preempt (strictly lower priority, or reclaim of borrowed units by an
   entry within its guarantee; another leaf's units within its own guarantee are never
   taken), unless its queue node says ``preempts=False`` or another of its placements fits
   as things stand. Otherwise it waits,
   with the first failed check as its reason; a waiter blocked past its queue's
   ``backfill_after`` holds the units it needs so that smaller requests stop passing it.
   A victim the snapshot lists in ``requeue`` joins the queue as a request, in queue order;
   one granted back the very placement it held was not preempted after all.

Identical requests form a class; each (class, placement) is a run in time order, merged with
the other runs by a heap. When a run's head waits, the whole run is parked: within a pass only
a preemption frees units, so until one happens under the same root every later member would
wait too. A preemption puts the parked runs back, ahead of it or not (with their share as it
is now: it may have brought a leaf back within its guarantee); so does a grant that makes a
leaf borrow (its running work is no longer protected). A run whose head passed on preempting
because another placement fits is parked until the class finds that other placement full:
then it goes back on the heap, ahead of where the pass is, and is tried as in its turn (holds
taken since are not seen). A pass where nothing fits costs a few operations per run, not per
request; waiting requests are explained with the pass's final state.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from enum import Enum, auto

from fairpool.engine.collector import collector_paused
from fairpool.engine.model import (
    Allocation,
    Check,
    Grant,
    Node,
    Placement,
    Plan,
    Preemption,
    Reason,
    Rejection,
    Request,
    Rule,
    Snapshot,
    WaitingGroup,
)

# Per node, per key: the units a placement adds there (its charges summed up the tree).
Delta = dict[str, dict[str, int]]


def reconcile(snapshot: Snapshot) -> Plan:
    """Decide grants, preemptions, rejections and waits for one pass.

    A preemption frees units that a waiter tried earlier in the pass may fit (one that held
    units for itself, past its queue's ``backfill_after``). So while a round preempts, the
    pass goes on with another round over what it left, its grants kept (never victims: their
    own victims would be wasted); the plans add up. A second pass with nothing new then
    changes nothing. Every round that preempts grants its preemptor, so rounds end."""
    with collector_paused():  # a quarter of a pass at 100,000 queued of one class each
        return _reconciled(snapshot)


def _reconciled(snapshot: Snapshot) -> Plan:
    first = snapshot
    grants: list[Grant] = []
    preemptions: list[Preemption] = []
    rejections: list[Rejection] = []
    kept: frozenset[str] = frozenset()
    while True:
        plan = _Pass(snapshot, kept).run()
        grants += plan.grants
        preemptions += plan.preemptions
        rejections += plan.rejections
        if not plan.preemptions:
            return _stayed(first, Plan(
                tuple(sorted(grants, key=lambda g: g.request_id)), tuple(preemptions),
                tuple(rejections), plan.waiting,
            ))
        snapshot = _after(snapshot, plan)
        kept |= {g.request_id for g in plan.grants}


def _stayed(snapshot: Snapshot, plan: Plan) -> Plan:
    """A victim requeued and granted back the very placement it held was never in the way
    (a later victim freed more than needed): it is not preempted, it keeps running."""
    held = {a.request_id: a.placement for a in snapshot.allocations}
    back = {
        g.request_id for g in plan.grants
        if (r := snapshot.requeue.get(g.request_id)) is not None
        and r.placements[g.placement_index] == held.get(g.request_id)
    }
    if not back:
        return plan
    return replace(
        plan,
        grants=tuple(g for g in plan.grants if g.request_id not in back),
        preemptions=tuple(p for p in plan.preemptions if p.victim_id not in back),
    )


def _after(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """What a round leaves: its victims gone, its grants running, the rest still queued."""
    victims = {p.victim_id for p in plan.preemptions}
    requeued = tuple(snapshot.requeue[v] for v in victims if v in snapshot.requeue)
    by_id = {r.id: r for r in (*snapshot.queue, *requeued)}
    done = {g.request_id for g in plan.grants} | {r.request_id for r in plan.rejections}
    granted = tuple(
        Allocation(g.request_id, by_id[g.request_id].placements[g.placement_index],
                   snapshot.now, by_id[g.request_id].preemptible)
        for g in plan.grants
    )
    return replace(
        snapshot,
        allocations=(*(a for a in snapshot.allocations if a.request_id not in victims), *granted),
        queue=tuple(r for r in (*snapshot.queue, *requeued) if r.id not in done),
    )


class _Forest:
    """Static facts about the nodes, computed once per pass."""

    def __init__(self, nodes: Mapping[str, Node]) -> None:
        self.nodes = nodes
        self._paths: dict[str, tuple[Node, ...]] = {}
        self._deltas: dict[int, Delta] = {}
        self._bounded: dict[tuple[str, str], bool] = {}

    def path(self, node_id: str) -> tuple[Node, ...]:
        """The node and its ancestors, leaf first."""
        found = self._paths.get(node_id)
        if found is None:
            chain = []
            current: str | None = node_id
            while current is not None:
                node = self.nodes[current]
                chain.append(node)
                current = node.parent
            found = self._paths[node_id] = tuple(chain)
        return found

    def root(self, node_id: str) -> str:
        return self.path(node_id)[-1].id

    def delta(self, placement: Placement) -> Delta:
        # Placements live as long as the snapshot, so their identity is a safe cache key.
        found = self._deltas.get(id(placement))
        if found is None:
            found = {}
            for charge in placement.charges:
                for node in self.path(charge.leaf):
                    units = found.setdefault(node.id, {})
                    for key, amount in charge.amounts.items():
                        units[key] = units.get(key, 0) + amount
            self._deltas[id(placement)] = found
        return found

    def bounded(self, leaf: str, key: str) -> bool:
        """Whether ``key`` is metered anywhere from ``leaf`` up (capacity or limit)."""
        cache_key = (leaf, key)
        found = self._bounded.get(cache_key)
        if found is None:
            found = any(n.cap(key) is not None or key in n.limit for n in self.path(leaf))
            self._bounded[cache_key] = found
        return found


def _impossible(forest: _Forest, placement: Placement, preemptible: bool) -> Reason | None:
    """The first reason this placement could not fit even on an empty system."""
    delta = forest.delta(placement)
    over_capacity = _over_capacity(forest, delta)
    # A key the pool lacks first: no reservation can cover it (a policy's keys are its
    # pool's), so "requested > reserved 0" would point to a fix that is refused.
    if over_capacity is not None and over_capacity.bound == 0:
        return over_capacity
    if not preemptible:
        for charge in placement.charges:
            leaf = forest.nodes[charge.leaf]
            for key, amount in charge.amounts.items():
                reserved = leaf.guarantee.get(key, 0)
                if amount > reserved and forest.bounded(charge.leaf, key):
                    # With the seed's fixes: the message was the whole answer to "what now?".
                    more = "more " if reserved else ""
                    return Reason(
                        Check.RESERVED, leaf.name, key, amount, reserved, 0,
                        f"{leaf.name}: {key} requested {amount} > reserved {reserved} "
                        f"(non-preemptible: reserve {more}{key} in the policy, or make the "
                        "request preemptible)",
                    )
    # Capacity before limits: "the pool does not have that many" is the more basic answer.
    if over_capacity is not None:
        return over_capacity
    for node_id, units in delta.items():
        node = forest.nodes[node_id]
        for key, amount in units.items():
            limit = node.limit.get(key)
            if limit is not None and amount > limit:
                return Reason(
                    Check.LIMIT, node.name, key, amount, limit, 0,
                    f"{node.name}: {key} requested {amount} > limit {limit}",
                )
    return None


def _first(failures: list[Reason]) -> Reason:
    """The reason a waiter is given: the first failure, naming the other keys it is short
    of too (``Reason.also_short``)."""
    first = failures[0]
    also = tuple(sorted({f.key for f in failures[1:]} - {first.key}))
    if not also:
        return first
    return replace(first, message=f"{first.message} (also short of {', '.join(also)})",
                   also_short=also)


def _over_capacity(forest: _Forest, delta: Delta) -> Reason | None:
    """The first node whose capacity is below what the placement charges it, on its own."""
    for node_id, units in delta.items():
        node = forest.nodes[node_id]
        for key, amount in units.items():
            cap = node.cap(key)
            if cap is not None and amount > cap:
                detail = (
                    f"has no {key} (zero capacity), requested {amount}"
                    if cap == 0
                    else f"{key} requested {amount} > capacity {cap}"
                )
                return Reason(Check.CAPACITY, node.name, key, amount, cap, 0,
                              f"{node.name}: {detail}")
    return None


class _Wait(Enum):
    """How an entry that did not get its units waits."""

    #: Nothing fits, and preempting here was not possible.
    BLOCKED = auto()
    #: Another of its placements fits: it neither preempts nor holds units here.
    ELSEWHERE = auto()


@dataclass(slots=True)
class _Stretch:
    """Members ``pos`` to ``end`` (excluded) of a run, set aside; ``live`` until put back."""

    number: int
    index: int
    pos: int
    end: int
    #: Why its first member waited (the final state explains it, when it has a reason).
    reason: Reason
    live: bool = True


# (share, -priority, queued_at, request id, class number, placement index, cursor, end):
# the members from the cursor up to end (excluded) of a run.
_HeapEntry = tuple[int, int, float, str, int, int, int, int]
# The order part of a heap entry: all but ``end``.
_Key = tuple[int, int, float, str, int, int, int]


@dataclass(slots=True)
class _Class:
    """Queued requests identical but for id and time, in time order."""

    preemptible: bool
    placements: tuple[Placement, ...]
    members: list[Request] = field(default_factory=list)
    keys: list[tuple[float, str]] = field(default_factory=list)
    possible: list[int] = field(default_factory=list)
    #: Members granted in this pass (so waiting stretches must filter them out).
    granted: int = 0
    unsorted: bool = False


class _Pass:
    def __init__(self, snapshot: Snapshot, kept: frozenset[str] = frozenset()) -> None:
        self.snapshot = snapshot
        #: Granted by an earlier round of this pass: not victims, as this round's grants.
        self.kept = kept
        self.forest = _Forest(snapshot.nodes)
        self.usage: dict[str, dict[str, int]] = defaultdict(dict)
        self.np_usage: dict[str, dict[str, int]] = defaultdict(dict)
        self.held: dict[str, dict[str, int]] = defaultdict(dict)
        # Live preemptible allocations by the nodes they charge: the candidate victims there.
        # Not the grants of this pass, earlier rounds' (``kept``) included: their own victims
        # would be wasted. Filtered out at each search instead, they made every blocked
        # class's search scan them: 100,000 queued requests, each a class, 11.5 s a pass.
        self.running: dict[str, dict[str, Allocation]] = defaultdict(dict)
        self.granted_now: dict[str, Grant] = {}
        self.preemptions: list[Preemption] = []
        self.holders: set[str] = set()
        self.classes: list[_Class] = []
        self.rejections: list[Rejection] = []
        #: Placements that could never fit, of requests with another that can.
        self.ineligible: list[WaitingGroup] = []
        # Stretches of runs set aside, per root (where a preemption puts them back).
        self.parked: dict[str, list[_Stretch]] = defaultdict(list)
        # Those set aside because another placement fits, per class (put back when the class
        # finds another of its placements full).
        self.passed: dict[int, list[_Stretch]] = defaultdict(list)
        # Entries tried again after the placements they passed: (class, placement, cursor).
        self.deferred: set[tuple[int, int, int]] = set()
        # Per holder, the queues and placements it holds units for, and the queue order key
        # of the entry that took the hold.
        self.holds: dict[str, list[tuple[str, Placement, _Key]]] = defaultdict(list)
        self.last_hold: _Key | None = None
        # Each run's entry on the heap: (cursor, share, end); others there are stale.
        self.live: dict[tuple[int, int], tuple[int, int, int]] = {}
        # The runs charging each leaf, and the leaves preemptions freed units on.
        self.runs_at: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.freed: set[str] = set()
        self.groups: list[WaitingGroup] = []
        for allocation in snapshot.allocations:
            self._add(allocation)

    # -- usage bookkeeping -------------------------------------------------------------

    def _apply(self, allocation: Allocation, sign: int) -> None:
        placement = allocation.placement
        for node_id, units in self.forest.delta(placement).items():
            used = self.usage[node_id]
            for key, amount in units.items():
                used[key] = used.get(key, 0) + sign * amount
        if not allocation.preemptible:
            for charge in placement.charges:
                used = self.np_usage[charge.leaf]
                for key, amount in charge.amounts.items():
                    used[key] = used.get(key, 0) + sign * amount

    def _add(self, allocation: Allocation) -> None:
        self._apply(allocation, +1)
        if allocation.preemptible and allocation.request_id not in self.kept:
            for node_id in self.forest.delta(allocation.placement):
                self.running[node_id][allocation.request_id] = allocation

    def _remove(self, allocation: Allocation) -> None:
        self._apply(allocation, -1)
        if allocation.preemptible:
            for node_id in self.forest.delta(allocation.placement):
                del self.running[node_id][allocation.request_id]

    # -- checks ------------------------------------------------------------------------

    def _in_share(self, placement: Placement) -> bool:
        """Whether the placement fits each leaf's unused guarantee on every metered key: it
        goes before borrowers (``_share``), and may reclaim (``_preempt``)."""
        for charge in placement.charges:
            leaf = self.forest.nodes[charge.leaf]
            used = self.usage[charge.leaf]
            for key, amount in charge.amounts.items():
                if self.forest.bounded(charge.leaf, key) and (
                    used.get(key, 0) + amount > leaf.guarantee.get(key, 0)
                ):
                    return False
        return True

    def _share(self, placement: Placement) -> int:
        """The first part of the queue order: 1 when the placement must borrow and its queue
        serves guaranteed entries first, else 0."""
        if self.forest.nodes[placement.queue].guarantee_first and not self._in_share(placement):
            return 1
        return 0

    def _failures(self, placement: Placement, preemptible: bool) -> list[Reason]:
        """Every failed check right now, in explanation order (empty: it fits)."""
        failures: list[Reason] = []
        if not preemptible:
            for charge in placement.charges:
                leaf = self.forest.nodes[charge.leaf]
                used = self.np_usage[charge.leaf]
                for key, amount in charge.amounts.items():
                    reserved = leaf.guarantee.get(key, 0)
                    in_use = used.get(key, 0)
                    if in_use + amount > reserved and self.forest.bounded(charge.leaf, key):
                        failures.append(Reason(
                            Check.RESERVED_IN_USE, leaf.name, key, amount, reserved, in_use,
                            f"{leaf.name}: {key} requested {amount}, non-preemptible use "
                            f"{in_use} of reserved {reserved}",
                        ))
        for node_id, units in self.forest.delta(placement).items():
            node = self.forest.nodes[node_id]
            used = self.usage[node_id]
            held = self.held.get(node_id, {})
            for key, amount in units.items():
                in_use = used.get(key, 0)
                limit = node.limit.get(key)
                if limit is not None and in_use + amount > limit:
                    failures.append(Reason(
                        Check.LIMIT, node.name, key, amount, limit, in_use,
                        f"{node.name}: {key} requested {amount}, in use {in_use} of limit {limit}",
                    ))
                cap = node.cap(key)
                taken = in_use + held.get(key, 0)
                if cap is not None and taken + amount > cap:
                    # Free as in unused; the hold (up to the holder's whole demand, so that
                    # units a preemption frees go to it too) is said apart: on free units,
                    # or, none free, on the next freed. Above a capacity lowered while held:
                    # how far.
                    note = "" if not held.get(key) else (
                        ", held for an older request" if cap > in_use
                        else "; the next freed are held for an older request"
                    )
                    free = f"free {cap - in_use} of" if cap >= in_use else f"in use {in_use} of"
                    failures.append(Reason(
                        Check.CAPACITY, node.name, key, amount, cap, taken,
                        f"{node.name}: {key} requested {amount}, {free} {cap}{note}",
                    ))
        return failures

    def _unreclaimed(self, placement: Placement, reason: Reason) -> Reason:
        """``reason``, saying why the waiter does not reclaim the units it has reserved and
        unused on the key it is short of: it is not within its share on another metered key
        (``_in_share``). Unsaid, a team waited with its reserved GPUs idle (helper-89)."""
        if reason.check is not Check.CAPACITY:
            return reason
        for charge in placement.charges:
            leaf = self.forest.nodes[charge.leaf]
            used = self.usage[charge.leaf]
            amount = charge.amounts.get(reason.key, 0)
            if not amount or used.get(reason.key, 0) + amount > leaf.guarantee.get(reason.key, 0):
                continue
            over = []
            for key in sorted(charge.amounts):
                reserved = leaf.guarantee.get(key, 0)
                if self.forest.bounded(charge.leaf, key) and (
                    used.get(key, 0) + charge.amounts[key] > reserved
                ):
                    over.append(f"its reserved {key} is in use ({used.get(key, 0)} of "
                                f"{reserved})" if reserved else f"it reserves no {key}")
            if over:
                return replace(reason, message=f"{reason.message} ({leaf.name} does not "
                               f"reclaim its unused reserved {reason.key}: {'; '.join(over)})")
        return reason

    def _fits(self, placement: Placement, preemptible: bool) -> bool:
        return not self._failures(placement, preemptible)

    # -- preemption --------------------------------------------------------------------

    def _rule(
        self, waiter: Placement, short_keys: set[str], victim: Allocation, reclaim: bool
    ) -> Rule | None:
        """Which rule, if any, lets ``waiter`` evict ``victim``.

        Units a leaf uses within its own guarantee are protected from other leaves: only a
        victim borrowing on a short key can be taken by another leaf. Without that, a borrower
        with higher priority and a reclaiming owner would evict each other pass after pass.
        """
        waiter_leaves = {c.leaf for c in waiter.charges}
        same_leaf = any(c.leaf in waiter_leaves for c in victim.placement.charges)
        if not same_leaf and not self._borrows(victim.placement, short_keys):
            return None
        if victim.placement.priority < waiter.priority:
            return Rule.PRIORITY
        if not same_leaf and reclaim:
            return Rule.RECLAIM
        return None

    def _borrows(self, placement: Placement, keys: set[str]) -> bool:
        """Whether a leaf of ``placement`` uses more than its guarantee on one of ``keys``."""
        for charge in placement.charges:
            leaf = self.forest.nodes[charge.leaf]
            used = self.usage[charge.leaf]
            for key in keys & charge.amounts.keys():
                if used.get(key, 0) > leaf.guarantee.get(key, 0):
                    return True
        return False

    def _preempt(self, request: Request, placement: Placement, failures: list[Reason]) -> bool:
        """Free room for ``placement`` with the fewest useful victims; False if impossible."""
        by_name = {n.name: n.id for n in self.forest.path(placement.queue)}
        for charge in placement.charges:
            by_name.update((n.name, n.id) for n in self.forest.path(charge.leaf))
        shortage: dict[str, set[str]] = defaultdict(set)
        for failure in failures:
            shortage[by_name[failure.node]].add(failure.key)
        short_keys = {f.key for f in failures}
        # Reclaim is for a waiter within its share as the queue order says (the short keys
        # and every other metered one): one the order put after a borrower, were it let
        # reclaim, would evict that borrower's running work (grants of the pass are not
        # victims). Only a victim on its own leaf changes it, so it is computed again then.
        reclaim = self._in_share(placement)
        waiter_leaves = {c.leaf for c in placement.charges}
        candidates: dict[str, Allocation] = {}
        for node_id, keys in shortage.items():
            for victim in self.running[node_id].values():
                if (
                    (reclaim or victim.placement.priority < placement.priority)
                    and keys & _charged_keys(victim.placement)
                ):
                    candidates[victim.request_id] = victim
        ordered = sorted(
            candidates.values(),
            key=lambda a: (a.placement.priority, -a.allocated_at, _Desc(a.request_id)),
        )
        chosen: list[tuple[Allocation, Rule]] = []
        fits = False
        for victim in ordered:
            rule = self._rule(placement, short_keys, victim, reclaim)
            if rule is None:
                continue
            self._remove(victim)
            chosen.append((victim, rule))
            if any(c.leaf in waiter_leaves for c in victim.placement.charges):
                reclaim = self._in_share(placement)
            if self._fits(placement, request.preemptible):
                fits = True
                break
        if not fits:
            for victim, _ in reversed(chosen):
                self._add(victim)
            return False
        # Give back every victim the waiter turns out not to need (the last one always is).
        kept: list[tuple[Allocation, Rule]] = [chosen[-1]]
        for victim, rule in reversed(chosen[:-1]):
            self._add(victim)
            if self._fits(placement, request.preemptible):
                continue
            self._remove(victim)
            kept.append((victim, rule))
        for victim, rule in reversed(kept):
            self._record_preemption(victim, request, placement, rule)
        return True

    def _record_preemption(
        self, victim: Allocation, request: Request, placement: Placement, rule: Rule
    ) -> None:
        if rule is Rule.PRIORITY:
            why = f"priority {placement.priority} > {victim.placement.priority}"
        else:
            why = "reclaim of borrowed units for a request within its reserved share"
        queue = self.forest.nodes[placement.queue].name
        message = f"preempted by request {request.id} on {queue} ({why})"
        self.preemptions.append(Preemption(victim.request_id, request.id, rule, message))
        self.freed.update(c.leaf for c in victim.placement.charges)

    # -- the pass ----------------------------------------------------------------------

    def run(self) -> Plan:
        self._classify()
        # One run per (class, eligible placement): its members in time order, consumed from a
        # cursor. The heap holds each run's head, keyed by the queue order.
        heap: list[_HeapEntry] = []
        for number, cls in enumerate(self.classes):
            for index in cls.possible:
                self._push(heap, number, index, 0)
        now = self.snapshot.now
        while heap:
            entry = heapq.heappop(heap)
            share, rank, _, _, number, index, pos, end = entry
            if self.live.get((number, index)) != (pos, share, end):
                continue
            del self.live[number, index]
            cls = self.classes[number]
            request = cls.members[pos]
            placement = cls.placements[index]
            if request.id in self.granted_now:
                self._push(heap, number, index, pos + 1, share, end)
                continue
            # In-share turns into borrowing as the pass grants, so re-queue lazily (the other
            # way, after a preemption, see _reshare).
            if share == 0 and self._share(placement):
                self._push(heap, number, index, pos, 1, end)
                continue
            root = self.forest.root(placement.queue)
            preempted = len(self.preemptions)
            # An entry tried again out of turn (it passed on this placement earlier) does not
            # see the holds taken after its turn, as the next pass would not.
            later = self._holds_after(entry[:7])
            self._shift_holds(later, -1)
            tried = self._try(request, index)
            self._shift_holds(later, +1)
            if tried is None:
                cls.granted += 1
                if len(self.preemptions) > preempted:
                    self._unpark(heap, root)
                    self._reshare(heap)
                    self._requeue(heap, self.preemptions[preempted:])
                elif self._exposes(placement):
                    self._unpark(heap, root)
                if request.id in self.holds:
                    self._unhold(heap, request.id)
                self._push(heap, number, index, pos + 1, share, end)
                continue
            reason, wait = tried
            stretch = _Stretch(number, index, pos, end, reason)
            if wait is _Wait.ELSEWHERE:
                # The rest of the run sees the same state, until one of them takes the other
                # placement and leaves the next none: see _retry_passed.
                self.parked[root].append(stretch)
                self.passed[number].append(stretch)
                continue
            if self._retry_passed(heap, number, index, pos):
                # Its earlier placements first, where it may preempt or hold now, as the
                # next pass would try them; then this one again.
                self._push(heap, number, index, pos, share, end)
                continue
            queue = self.forest.nodes[placement.queue]
            if (
                reason.check is Check.CAPACITY
                and queue.backfill_after is not None
                and queue.id not in self.holders
                and now - request.queued_at >= queue.backfill_after
            ):
                self._hold(placement, +1)
                self.holders.add(queue.id)
                self.holds[request.id].append((queue.id, placement, entry[:7]))
                self.last_hold = max(entry[:7], self.last_hold or entry[:7])
                self._wait(number, index, pos, pos + 1, reason, (share, rank), request.id)
                self._push(heap, number, index, pos + 1, share, end)
                continue
            # Until units are freed under this root (only a preemption does that within a
            # pass), the rest of this run waits too: park it instead of testing each member.
            self.parked[root].append(stretch)
        for parked in self.parked.values():
            for stretch in parked:
                if not stretch.live:
                    continue
                number, index, pos, end = stretch.number, stretch.index, stretch.pos, stretch.end
                reason = stretch.reason
                cls = self.classes[number]
                placement = cls.placements[index]
                # Explain with the pass's final state (what they wait for now), but for
                # holds taken behind them in the queue: those keep nothing from them.
                share = self._share(placement)
                later = self._holds_after(
                    (share, -placement.priority, *cls.keys[pos], number, index, pos)
                )
                self._shift_holds(later, -1)
                failures = self._failures(placement, cls.preemptible)
                self._shift_holds(later, +1)
                self._wait(number, index, pos, end, _first(failures) if failures else reason,
                           (share, -placement.priority))
        grants = tuple(sorted(self.granted_now.values(), key=lambda g: g.request_id))
        waiting = (*self.groups, *self.ineligible)
        return Plan(grants, tuple(self.preemptions), tuple(self.rejections), waiting)

    def _unpark(self, heap: list[_HeapEntry], root: str) -> None:
        """Units were freed under ``root`` (a preemption): the runs parked there go back on
        the heap from where they stopped, those ranked ahead of the preemptor too, since the
        victims may free more than it takes. Preemptions are finite, so unparking ends."""
        for stretch in self.parked.pop(root, []):
            self._put_back(heap, stretch)

    def _put_back(self, heap: list[_HeapEntry], stretch: _Stretch) -> None:
        if stretch.live:
            stretch.live = False
            # Its share as things are now: a preemption may have freed its leaf's guarantee.
            self._push(heap, stretch.number, stretch.index, stretch.pos, None, stretch.end)

    def _reshare(self, heap: list[_HeapEntry]) -> None:
        """Victims freed their leaves' guarantee: a borrower waiting there may fit it now, and
        then goes before the borrowers (as it would in the next pass)."""
        for leaf in self.freed:
            for run in self.runs_at.get(leaf, ()):
                found = self.live.get(run)
                if found is not None and found[1] == 1:
                    pos, _, end = found
                    if not self._share(self.classes[run[0]].placements[run[1]]):
                        self._push(heap, *run, pos, 0, end)
        self.freed.clear()

    def _retry_passed(self, heap: list[_HeapEntry], number: int, index: int, pos: int) -> bool:
        """A member of class ``number`` found placement ``index`` full: the same members
        set aside elsewhere because this one fitted go back on the heap. Whether member
        ``pos`` was one of them (then it is tried there first, once)."""
        mine = False
        for stretch in self.passed.pop(number, []):
            mine = mine or (stretch.live and stretch.pos <= pos < stretch.end)
            self._put_back(heap, stretch)
        if not mine or (number, index, pos) in self.deferred:
            return False
        self.deferred.add((number, index, pos))
        return True

    def _shift_holds(self, placements: list[Placement], sign: int) -> None:
        """Take the holds of ``placements`` out (-1), or put them back (+1)."""
        for placement in placements:
            self._hold(placement, sign)

    def _holds_after(self, key: _Key) -> list[Placement]:
        if self.last_hold is None or key > self.last_hold:
            return []  # in turn: every hold was taken before it
        return [p for held in self.holds.values() for _, p, at in held if at > key]

    def _unhold(self, heap: list[_HeapEntry], request_id: str) -> None:
        """A holder got units: the units it held go back to the others, who may fit now."""
        for queue_id, placement, _ in self.holds.pop(request_id):
            self._hold(placement, -1)
            self.holders.discard(queue_id)
            self._unpark(heap, self.forest.root(queue_id))

    def _requeue(self, heap: list[_HeapEntry], preemptions: list[Preemption]) -> None:
        """Victims that queue again join the pass as requests of their own, where the queue
        order puts them: one outranking a waiter not yet decided goes before it."""
        for preemption in preemptions:
            request = self.snapshot.requeue.get(preemption.victim_id)
            if request is None:
                continue
            cls = _Class(request.preemptible, request.placements, [request],
                         [(request.queued_at, request.id)])
            if self._enter(cls):
                for index in cls.possible:
                    self._push(heap, len(self.classes) - 1, index, 0)

    def _wait(
        self,
        number: int,
        index: int,
        start: int,
        end: int,
        reason: Reason,
        rank: tuple[int, int],
        holder: str | None = None,
    ) -> None:
        cls = self.classes[number]
        members = tuple(cls.keys[start:end])
        if cls.granted:
            members = tuple(m for m in members if m[1] not in self.granted_now)
        if members:
            placement = cls.placements[index]
            queue = self.forest.nodes[placement.queue].name
            reason = self._unreclaimed(placement, reason)
            self.groups.append(WaitingGroup(queue, index, reason, members, rank, holder))

    def _classify(self) -> None:
        """Group requests alike (same placements on every metered key, same preemptibility)
        into classes.

        Front-ends share one placements tuple between requests of one shape, so grouping costs
        a dictionary lookup per request; equal tuples that are distinct objects still group.
        """
        by_object: dict[tuple[bool, int], _Class] = {}
        by_shape: dict[tuple[object, ...], _Class] = {}
        for request in self.snapshot.queue:
            fast = (request.preemptible, id(request.placements))
            cls = by_object.get(fast)
            if cls is None:
                shape = (request.preemptible,
                         tuple(_shape(p, self.forest) for p in request.placements))
                cls = by_shape.get(shape)
                if cls is None:
                    cls = by_shape[shape] = _Class(request.preemptible, request.placements)
                by_object[fast] = cls
            key = (request.queued_at, request.id)
            # Callers usually list the queue in time order already; sort only when not.
            if cls.keys and key < cls.keys[-1]:
                cls.unsorted = True
            cls.members.append(request)
            cls.keys.append(key)
        for cls in by_shape.values():
            if cls.unsorted:
                cls.members.sort(key=_time_order)
                cls.keys = [(r.queued_at, r.id) for r in cls.members]
            self._enter(cls)

    def _enter(self, cls: _Class) -> bool:
        """Rule out the class's placements that could never fit: with none left its members
        are rejected (False), else it joins the pass's classes."""
        reasons = []
        for index, placement in enumerate(cls.placements):
            reason = _impossible(self.forest, placement, cls.preemptible)
            if reason is None:
                cls.possible.append(index)
            else:
                reasons.append((index, placement, reason))
        if not cls.possible:
            only = tuple(r for _, _, r in reasons)
            self.rejections.extend(Rejection(r.id, only) for r in cls.members)
            return False
        self.classes.append(cls)
        number = len(self.classes) - 1
        for index in cls.possible:
            for charge in cls.placements[index].charges:
                self.runs_at[charge.leaf].append((number, index))
        for index, placement, reason in reasons:
            name = self.forest.nodes[placement.queue].name
            self.ineligible.append(WaitingGroup(
                name, index, reason, tuple(cls.keys), eligible=False,
            ))
        return True

    def _push(
        self,
        heap: list[_HeapEntry],
        number: int,
        index: int,
        pos: int,
        share: int | None = None,
        end: int | None = None,
    ) -> None:
        """Put a run's next member on the heap (nothing when the run, or stretch, is done)."""
        cls = self.classes[number]
        if end is None:
            end = len(cls.members)
        if pos >= end:
            return
        placement = cls.placements[index]
        if share is None:
            share = self._share(placement)
        self.live[number, index] = (pos, share, end)
        heapq.heappush(
            heap, (share, -placement.priority, *cls.keys[pos], number, index, pos, end)
        )

    def _try(self, request: Request, index: int) -> tuple[Reason, _Wait] | None:
        """Grant the entry (None) or say why it waits, and how."""
        placement = request.placements[index]
        failures = self._failures(placement, request.preemptible)
        if failures:
            if any(
                self._fits(p, request.preemptible)
                for i, p in enumerate(request.placements)
                if i != index
            ):
                return failures[0], _Wait.ELSEWHERE  # explained where it waits
            if (
                any(f.check is not Check.CAPACITY for f in failures)
                or not self.forest.nodes[placement.queue].preempts
                or not self._preempt(request, placement, failures)
            ):
                return _first(failures), _Wait.BLOCKED
        # Used, and no candidate victim (``running``).
        self._apply(Allocation(request.id, placement, self.snapshot.now, request.preemptible),
                    +1)
        self.granted_now[request.id] = Grant(request.id, index)
        return None

    def _exposes(self, placement: Placement) -> bool:
        """Whether granting ``placement`` made one of its leaves borrow, so that the leaf's
        running work, protected within its guarantee until then, may be preempted by the
        waiters parked before it (which then get their turn again)."""
        for charge in placement.charges:
            leaf = self.forest.nodes[charge.leaf]
            used = self.usage[charge.leaf]
            for key, amount in charge.amounts.items():
                if not self.forest.bounded(charge.leaf, key):
                    continue  # nothing meters it: borrowing it preempts nobody (``_shape``)
                guarantee = leaf.guarantee.get(key, 0)
                if used.get(key, 0) - amount <= guarantee < used.get(key, 0) and (
                        self.running.get(charge.leaf)):
                    return True
        return False

    def _hold(self, placement: Placement, sign: int) -> None:
        for node_id, units in self.forest.delta(placement).items():
            held = self.held[node_id]
            for key, amount in units.items():
                held[key] = held.get(key, 0) + sign * amount


def _charged_keys(placement: Placement) -> AbstractSet[str]:
    if len(placement.charges) == 1:
        return placement.charges[0].amounts.keys()
    keys: set[str] = set()
    for charge in placement.charges:
        keys.update(charge.amounts)
    return keys


def _shape(placement: Placement, forest: _Forest) -> tuple[object, ...]:
    """Placements of one shape get the same verdict in the same state. Only the keys metered
    on a charge's path (``_Forest.bounded``) are its shape: every check reads those alone, so
    amounts of an unmetered key (ZenML's ``memory_mb`` on a pool that does not declare it)
    make no difference; with every request's own memory, each was a class of its own, and a
    pass at 100k queued took 21 s, not 0.23 (helper-81). (Equal amounts listed in another
    key order make another shape: only a cache miss, never a wrong verdict.)"""
    return (
        placement.queue,
        placement.priority,
        tuple((c.leaf, tuple((key, amount) for key, amount in c.amounts.items()
                             if forest.bounded(c.leaf, key)))
              for c in placement.charges),
    )


class _Desc:
    """Reverses string order inside a sort key (newest id first on equal times)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __lt__(self, other: _Desc) -> bool:
        return self.value > other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _time_order(request: Request) -> tuple[float, str]:
    return (request.queued_at, request.id)


__all__ = ["reconcile"]
