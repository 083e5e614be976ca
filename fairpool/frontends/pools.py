"""Pools & policies (ZenML Pro resource pools): validation and compilation to the quota forest.

One pool becomes a root node holding its capacity; each policy attached to it becomes a leaf
under it with ``guarantee`` = reserved and ``limit`` = limit. A request becomes one placement
per pool its component has a policy on, highest policy priority first.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from fairpool.engine.model import Charge, Node, Placement
from fairpool.errors import InvalidInput, mapping, string, validate_int
from fairpool.frontends.names import (
    DOT_REASON,
    DOT_SEGMENTS,
    MAX_KEYS,
    MAX_NAME,
    SLASH_REASON,
    bounded_text,
    check_key_count,
    check_printing,
)
from fairpool.store.records import Policy, Pool
from fairpool.views import PREEMPTING

#: Keys ZenML treats as unbounded when a pool has no row for them; every other absent key
#: is zero capacity.
UNBOUNDED_WHEN_ABSENT = frozenset({"mcpu", "memory_mb", "step_run"})

#: Seconds a capacity-blocked waiter may be passed by requests behind it that fit, before it
#: holds the free units it needs (so large requests are not starved by small ones).
BACKFILL_AFTER_SECONDS = 300.0


def node_name(pool: str) -> str:
    """How the engine's explanations and queue entries name pool ``pool``."""
    return f"pool {pool}"


def pool_node(pool: Pool) -> Node:
    return Node(
        id=pool.id,
        name=node_name(pool.name),
        capacity=dict(pool.capacity),
        open_keys=UNBOUNDED_WHEN_ABSENT,
        backfill_after=BACKFILL_AFTER_SECONDS,
    )


def policy_node(policy: Policy, pool: Pool, component_name: str) -> Node:
    """A policy's leaf. A pool key the policy omits has reserved 0 and limit = pool total,
    set as such: the pool's capacity alone would enforce it, but a waiter blocked by its own
    component's usage would then be told the pool has no room, not that it is at its limit."""
    return Node(
        id=policy.id,
        name=f"policy {component_name} on {pool.name}",
        parent=pool.id,
        capacity={},
        open_keys=None,
        guarantee={key: policy.reserved.get(key, 0) for key in pool.capacity},
        limit={key: policy.limit.get(key, total) for key, total in pool.capacity.items()},
    )


def placements(
    demand: Mapping[str, int], policies: Iterable[Policy], pools: Mapping[str, Pool]
) -> tuple[Placement, ...]:
    """One placement per policy of the requesting component: higher priority first, then by
    pool name so the order never depends on storage order."""
    ordered = sorted(policies, key=lambda p: (-p.priority, pools[p.pool_id].name))
    return tuple(
        Placement(queue=p.pool_id, charges=(Charge(p.id, dict(demand)),), priority=p.priority)
        for p in ordered
    )


# -- validation --------------------------------------------------------------------------

#: Bounds every backend can store (PostgreSQL columns are INTEGER, BIGINT; names: MAX_NAME), so
#: SQLite and PostgreSQL refuse the same input with the same message.
MAX_AMOUNT = 10**12
MAX_PRIORITY = 1_000_000


def validate_name(
    field: str, value: object, most: int = MAX_NAME, *, printing: bool = True
) -> str:
    """A name or key: non-empty text up to ``most`` characters that prints as itself (a
    newline or an escape sequence in it would forge lines or recolour a reader's terminal).
    ``printing=False`` for one that names something stored already, which may have been
    made before 2026-11-29, when such names were taken."""
    if not string(field, value).strip():
        raise InvalidInput(field, value, "must be a non-empty string")
    text = bounded_text(field, value, most)
    return check_printing(field, text) if printing else text


def validate_filter(field: str, value: str | None) -> str | None:
    """A list's filter as the API's query takes one: text no longer than a name (empty
    allowed), so that a filter no name could match is refused embedded as over HTTP."""
    return value if value is None else bounded_text(field, value, MAX_NAME)


#: A pool's description: free text, up to a page of notes.
MAX_DESCRIPTION = 4096


def validate_description(value: object) -> str | None:
    """None (none, or unchanged) or text up to ``MAX_DESCRIPTION`` characters, no NUL."""
    if value is None:
        return None
    return bounded_text("description", value, MAX_DESCRIPTION)


#: The words a canceller gives (``cancel --reason``), up to a paragraph.
MAX_REASON = 1024


def cancel_reason(reason: object) -> str:
    """The reason a request or workload ends cancelled with: the canceller's ``reason``
    (None: nobody said why), so that a wait given up or an interrupt explains itself."""
    if reason is None:
        return "cancelled by user"
    return f"cancelled: {validate_name('reason', reason, MAX_REASON)}"


def validate_addressed_name(field: str, value: object, *, printing: bool = True) -> str:
    """A pool's or component's name: ``validate_name``'s, without "/" (``SLASH_REASON``)."""
    name = validate_name(field, value, printing=printing)
    if "/" in name:
        raise InvalidInput(field, value, f"must not contain {SLASH_REASON}")
    return name


def check_new_addressed_name(field: str, name: str) -> None:
    """A name to be made for a pool or component: not "." or ".." (``DOT_REASON``). Checked
    only where a name is made: one made before 2026-12-02 stays usable."""
    if name in DOT_SEGMENTS:
        raise InvalidInput(field, name, DOT_REASON)


def _amounts(
    field: str, raw: Mapping[str, object], *, allow_zero: bool,
    known: Collection[str] = (),
) -> dict[str, int]:
    """``known``: keys the pool has already, taken as they are (``validate_name``)."""
    check_key_count(field, mapping(field, raw), MAX_KEYS)
    amounts: dict[str, int] = {}
    for key, value in raw.items():
        validate_name(f"{field} key", key, printing=key not in known)
        if key != key.strip():  # "gpu " beside "gpu" would be a second key
            raise InvalidInput(f"{field} key", key, "must not begin or end with whitespace")
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(f"{field}.{key}", value, "must be an integer")
        if value < 0 or (value == 0 and not allow_zero):
            bound = "non-negative" if allow_zero else "positive"
            raise InvalidInput(f"{field}.{key}", value, f"must be a {bound} integer")
        if value > MAX_AMOUNT:
            raise InvalidInput(f"{field}.{key}", value, f"must be at most {MAX_AMOUNT}")
        amounts[key] = value
    return amounts


def validate_demand(raw: Mapping[str, object]) -> dict[str, int]:
    """A request's units: positive integers, at least one key; and ``step_run: 1``, which
    ZenML's server adds to every request, so that a pool's ``step_run`` caps its concurrent
    steps whatever sends them (a plain mapping from the SDK or the API went uncounted)."""
    demand = _amounts("resources", raw, allow_zero=False)
    if not demand:
        raise InvalidInput("resources", dict(raw), "a request must ask for at least one key")
    if demand.setdefault("step_run", 1) != 1:
        raise InvalidInput("resources.step_run", demand["step_run"],
                           "must be 1: a request is one step run")
    return demand


def validate_capacity(raw: Mapping[str, object]) -> dict[str, int]:
    """Capacity on pool creation: positive integers, at least one key."""
    capacity = _amounts("capacity", raw, allow_zero=False)
    if not capacity:
        raise InvalidInput("capacity", dict(raw), "resource pools with no capacity are not allowed")
    return capacity


def apply_capacity_update(current: Mapping[str, int], raw: Mapping[str, object]) -> dict[str, int]:
    """Capacity on pool update: values replace, 0 removes a key; a pool keeps at least one.
    An update that changes nothing is refused: it was answered "Updated"."""
    capacity = dict(current)
    changes = _amounts("capacity", raw, allow_zero=True, known=current)
    if not changes:
        raise InvalidInput("capacity", dict(raw), "names no key to change")
    for key, value in changes.items():
        if value == 0:
            if key not in capacity:
                raise InvalidInput(f"capacity.{key}", value, "is no key of the pool (keys: "
                                   f"{', '.join(sorted(current))}); 0 removes a key")
            del capacity[key]
        else:
            capacity[key] = value
    if not capacity:
        raise InvalidInput("capacity", dict(raw), "a pool must keep at least one resource key")
    return capacity


def validate_policy(
    pool: Pool,
    reserved_raw: Mapping[str, object],
    limit_raw: Mapping[str, object],
    priority: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """Per-policy rules: priority >= 0, keys are pool keys, reserved <= limit per key."""
    validate_int("priority", priority, 0, MAX_PRIORITY)
    reserved = _amounts("reserved", reserved_raw, allow_zero=True, known=pool.capacity)
    limit = _amounts("limit", limit_raw, allow_zero=True, known=pool.capacity)
    for field, amounts in (("reserved", reserved), ("limit", limit)):
        for key in amounts:
            if key not in pool.capacity:
                raise InvalidInput(
                    f"{field}.{key}",
                    amounts[key],
                    f"pool {pool.name!r} has no {key!r} (pool keys: "
                    f"{', '.join(sorted(pool.capacity))}); policy keys must be pool keys",
                )
    for key, amount in reserved.items():
        ceiling = limit.get(key, pool.capacity[key])
        if amount > ceiling:
            raise InvalidInput(f"reserved.{key}", amount, f"must be <= limit {ceiling}")
    return reserved, limit


def check_removed_keys(
    capacity: Mapping[str, int],
    policies: Iterable[Policy],
    pool_name: str,
    owner: Callable[[Policy], str],
    update: str = "resource-pool update-policy",
) -> None:
    """A key removed from a pool (capacity 0) that a policy reserves some of is refused,
    naming the policy (``owner``: its component's name) and the way out (``update``: how
    the caller changes a policy)."""
    for policy in policies:
        for key in sorted(policy.reserved.keys() - capacity.keys()):
            if policy.reserved[key]:
                raise InvalidInput(
                    f"capacity.{key}", 0, f"policy {owner(policy)} on pool {pool_name!r} "
                    f"reserves {policy.reserved[key]} {key}: take it out of the policy's reserved "
                    f"first ({update}), or detach the policy")


def policy_within(
    policy: Policy, capacity: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """The policy's reserved and limit on the pool's keys only: policy keys must be pool
    keys, so a removed key leaves its policies too (else adding it back revives old limits)."""
    return (
        {key: amount for key, amount in policy.reserved.items() if key in capacity},
        {key: amount for key, amount in policy.limit.items() if key in capacity},
    )


def allocated_on(pool: str, priority: int, preempted: Sequence[str] = ()) -> str:
    """An allocated request's reason; with the requests preempted for it in the same pass
    (their reasons name it, and its own should name them)."""
    reason = f"allocated on pool {pool} (policy priority {priority})"
    if preempted:
        noun = "request" if len(preempted) == 1 else "requests"
        reason += f"{PREEMPTING}{noun} {', '.join(preempted)}"
    return reason


def reprioritized(pool: str, priority: int, was: int) -> str:
    """An allocated request's reason once its policy's priority changed from ``was``."""
    return f"{allocated_on(pool, priority)}, was {was}"


def check_reserved_total(
    capacity: Mapping[str, int], policies: Iterable[Policy], pool_name: str
) -> None:
    """Sum of reserved over a pool's policies must fit its capacity, per key."""
    totals: dict[str, int] = {}
    for policy in policies:
        for key, amount in policy.reserved.items():
            totals[key] = totals.get(key, 0) + amount
    for key, total in sorted(totals.items()):
        available = capacity.get(key, 0)
        if total > available:
            raise InvalidInput(
                f"reserved.{key}",
                total,
                f"reserved totals on pool {pool_name!r} would exceed its capacity {available}",
            )
