"""The service: every operation is one transaction that changes state, runs a reconcile pass,
applies the engine's plan and records events, so each command answers with the decision made.

Front-end rules (validation, compilation to the quota forest) live in ``frontends.pools``;
the engine decides; this module only loads, calls and writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import shlex
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Literal, TypeVar, cast

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from fairpool import retention
from fairpool.backoff import jittered
from fairpool.engine.collector import collector_paused
from fairpool.engine.explain import QueueEntry, queue_entries
from fairpool.engine.model import Allocation as EngineAllocation
from fairpool.engine.model import Charge, Node, Placement, Plan, Snapshot
from fairpool.engine.model import Request as EngineRequest
from fairpool.engine.reconcile import reconcile
from fairpool.errors import (
    Conflict,
    InvalidInput,
    Later,
    NotFound,
    WouldWait,
    as_ref,
    one_of,
    validate_int,
)
from fairpool.frontends import pools as frontend
from fairpool.frontends.names import (
    MAX_LABEL_VALUE,
    MAX_LABELS,
    bounded_text,
    check_key_count,
    check_printing,
)
from fairpool.group_commit import GroupCommit, Pending
from fairpool.idempotency import validate_key
from fairpool.leases import MAX_LEASE_TTL, MAX_RETRIES
from fairpool.outage import Outage
from fairpool.paging import Page, check_page
from fairpool.store import repo
from fairpool.store.db import (
    Database,
    DatabaseUnreachable,
    default_url,
    fairpool_home,
    read_generation,
)
from fairpool.store.db import generation as db_generation
from fairpool.store.direct import DeferredWriteFailed, send_deferred
from fairpool.store.records import (
    Allocation,
    ApiToken,
    Component,
    ComponentType,
    Policy,
    Pool,
    Request,
    RequestStatus,
    TokenRole,
)
from fairpool.store.schema import as_utc
from fairpool.views import (
    COMPONENT_TYPES,
    MAX_RETENTION,
    POOL_REQUEST_VIEWS,
    REQUEST_STATUSES,
    ComponentView,
    EventView,
    PassSummary,
    PolicyView,
    PoolRequestView,
    PoolView,
    PruneProgress,
    PruneView,
    QueuePlace,
    RequestView,
)

#: A pass that preempts creates retry attempts; they are placed in the same command, within
#: this many extra passes.
_MAX_PASSES = 4

#: A batch on an event loop goes ahead only on a live state it already holds, with at most
#: this many queued requests (a pass over them takes well under a millisecond); else it would
#: wait, or hold the loop.
AT_ONCE_QUEUE_LIMIT = 200

#: SQLite: the turns the event loop takes between a route queueing a write and its batch
#: being taken. A batch holds the loop while it runs, so the requests the loop has read but
#: not yet routed would otherwise wait for the next batch: 3 turns took batches from 2.7 to
#: ~7 operations, and 26-42 % more admissions/s (benchmarks/http.py, 2026-11-25). Not on
#: PostgreSQL, whose batch frees the loop during its round trip: there it only delays the
#: round trip (20-32 % fewer admissions/s uncontended).
GATHER_TURNS = 3


def _same_as_keyed(made: Request, key: str, asked: Mapping[str, object]) -> None:
    """A create repeating ``key`` (its answer was lost, say) must ask what the one that made
    ``made`` asked: another ask under the same key is a client's mistake, refused rather
    than answered with a request it did not ask for."""
    demand = made.demand
    asked_resources = asked.get("resources")
    if "step_run" not in demand and isinstance(asked_resources, Mapping) and (
        asked_resources.get("step_run") == 1
    ):
        # Made before every request got its step_run (2026-11-29): the same ask, resent
        # across the upgrade, was refused as another (helper-92).
        demand = {**demand, "step_run": 1}
    had = {
        "component": made.component_id, "resources": demand,
        "preemptible": made.preemptible, "max_retries": made.max_retries,
        "labels": made.labels, "lease_ttl": made.lease_ttl,
        "token": made.created_by_token_id,
    }
    differs = [field for field, value in asked.items() if had[field] != value]
    if "token" in differs:  # another caller's request: nothing about it is told
        raise Conflict(f"idempotency_key {key!r} is taken by a request another token made; "
                       "use a key of your own")
    if differs:
        raise Conflict(
            f"idempotency_key {key!r} already made request `{made.id}`, which asked otherwise "
            f"({', '.join(differs)}): a create repeated with a key must ask the same"
        )


def _fits_the_loop(state: _State | None) -> bool:
    """Whether a batch starting from ``state`` may run on an event loop's thread."""
    return state is not None and len(state.queued) <= AT_ONCE_QUEUE_LIMIT

# How the writes of a block go: waited for, queued ("later", ``Service.later``), or, for a
# batch on an event loop's thread, "at_once": now, or ``WouldWait`` before anything is written.
_Mode = Literal["wait", "at_once", "later"]
_mode: ContextVar[_Mode] = ContextVar("fairpool_writes", default="wait")


@contextmanager
def _writing(mode: _Mode) -> Iterator[None]:
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


#: Every API token secret starts with this, so that it is recognizable (e.g. by secret scanners).
TOKEN_PREFIX = "fp_"
#: Characters of a secret kept in the clear to recognize it: the prefix and 8 more.
TOKEN_SHOWN = len(TOKEN_PREFIX) + 8


def hash_token(secret: str) -> str:
    """How a token secret is stored and looked up: SHA-256, hex. The secrets are 256 random
    bits, so a salt or a slow hash would add nothing."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _utcnow() -> datetime:
    return datetime.now(UTC)


def open_service(
    home: str | None = None, url: str | None = None, catch_up: bool = False
) -> Service:
    """The embedded default: a SQLite file under ``home`` (else FAIRPOOL_HOME, else the user
    data dir), made if need be. ``catch_up``: see ``Service.catch_up``."""
    if url is None:
        chosen = fairpool_home(home)
        # One line, and a typed error for the SDK: a bare OSError said neither that it was
        # fairpool's home nor where it came from (helper-88).
        try:
            chosen.mkdir(parents=True, exist_ok=True)
        # The path whole: an error line clips a long value to its first 20 characters.
        except FileExistsError:
            raise InvalidInput.from_message("home", f"home: {chosen} is a file, not a folder "
                                            "(--home or FAIRPOOL_HOME)") from None
        except OSError as error:
            raise InvalidInput.from_message("home", f"home: {chosen} cannot be made: "
                                            f"{error.strerror} (--home or FAIRPOOL_HOME)"
                                            ) from None
    return Service(Database.open(default_url(chosen) if url is None else url),
                   catch_up=catch_up)


@dataclass(frozen=True, slots=True)
class _State:
    """Everything a pass (or a view) needs, loaded in one read of the database."""

    pools: dict[str, Pool]
    policies: dict[str, Policy]
    components: dict[str, Component]
    allocations: dict[str, Allocation]
    queued: dict[str, Request]
    #: Live allocations' requests (their demand is what they hold).
    holders: dict[str, Request]

    @classmethod
    def load(cls, conn: Connection) -> _State:
        with collector_paused():  # a fifth of the load at 100k queued: rows, no cycles
            allocations = {a.request_id: a for a in repo.live_allocations(conn)}
            return cls(
                pools={p.id: p for p in repo.list_pools(conn)},
                policies={p.id: p for p in repo.list_policies(conn)},
                components={c.id: c for c in repo.list_components(conn)},
                allocations=allocations,
                queued={r.id: r for r in repo.queued_requests(conn)},
                holders={r.id: r for r in repo.requests_by_id(conn, list(allocations))}
                if allocations
                else {},
            )

    def component_named(self, name: str, kind: ComponentType) -> Component | None:
        return next(
            (c for c in self.components.values() if c.name == name and c.type is kind), None
        )

    def policies_of(self) -> dict[str, list[Policy]]:
        by_component: dict[str, list[Policy]] = defaultdict(list)
        for policy in self.policies.values():
            by_component[policy.component_id].append(policy)
        return by_component

    def snapshot(self, now: datetime) -> Snapshot:
        nodes: dict[str, Node] = {p.id: frontend.pool_node(p) for p in self.pools.values()}
        for policy in self.policies.values():
            pool = self.pools[policy.pool_id]
            name = self.components[policy.component_id].name
            nodes[policy.id] = frontend.policy_node(policy, pool, name)
        allocations = []
        for allocation in self.allocations.values():
            holder = self.holders[allocation.request_id]
            if allocation.pool_id is None or allocation.policy_id is None:
                continue  # its pool or policy is gone; nothing left to charge
            placement = Placement(
                allocation.pool_id,
                (Charge(allocation.policy_id, holder.demand),),
                allocation.priority,
            )
            allocations.append(
                EngineAllocation(
                    allocation.request_id,
                    placement,
                    allocation.allocated_at.timestamp(),
                    holder.preemptible,
                )
            )
        by_component = self.policies_of()
        # One placements tuple per (component, demand): the engine groups identical requests
        # by it.
        interned: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[Placement, ...]] = {}
        queue = []
        for r in self.queued.values():
            shape = (r.component_id, tuple(sorted(r.demand.items())))
            placements = interned.get(shape)
            if placements is None:
                placements = interned[shape] = frontend.placements(
                    r.demand, by_component.get(r.component_id, ()), self.pools
                )
            queue.append(EngineRequest(r.id, r.created_at.timestamp(), placements, r.preemptible))
        return Snapshot(now.timestamp(), nodes, tuple(allocations), tuple(queue))


@dataclass(frozen=True)
class _Passed:
    """A pass's summary, with the plan of its last run (where waiting requests stand)."""

    summary: PassSummary
    plan: Plan

    def entries(self, request_id: str) -> tuple[QueueEntry, ...]:
        """Where ``request_id`` waits after the pass (nothing if it does not)."""
        return self._entries.get(request_id, ())

    @cached_property
    def _entries(self) -> dict[str, tuple[QueueEntry, ...]]:
        """Worked out once for all the answers of its batch: it sorts the whole queue."""
        return queue_entries(self.plan)


@dataclass(slots=True)
class _Tx:
    """One write transaction (a batch of operations), and what it knows of the requests
    without reading them again.

    ``state`` is the live state as of now in the transaction: the operations that change
    requests (``tracked``) keep it current, so the pass and the answers read nothing more.
    Any other operation, or a failed one, makes the transaction forget it (it is then loaded
    again when needed).
    """

    conn: Connection
    state: _State | None = None
    #: The requests the transaction took out of the live state (released, cancelled,
    #: rejected, expired), as they now are, with their allocation.
    finished: dict[str, tuple[Request, Allocation | None]] = field(default_factory=dict)
    #: Its events, in order, written together at its end: one statement for all of them.
    events: list[repo.EventRow] = field(default_factory=list)
    #: The requests it created.
    created: list[str] = field(default_factory=list)
    #: Those whose lease it let expire outside a pass (a heartbeat's): the pass counts them.
    expired: list[str] = field(default_factory=list)
    #: Those of them whose rows are not written yet (still queued, in ``state``), with their
    #: idempotency keys. Each row is written once, with the status the pass decided
    #: (``Service._decide``), or as it stands before anything reads the database
    #: (``Service._write_new``): not inserted queued and then updated.
    unwritten: dict[str, str | None] = field(default_factory=dict)

    def event(
        self,
        kind: str,
        message: str,
        now: datetime,
        *,
        request_id: str | None = None,
        pool_id: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.events.append(repo.event_row(kind, message, now, request_id, pool_id, data))

    def live(self) -> _State:
        if self.state is None:
            self.state = _State.load(self.conn)
        return self.state

    def forget(self) -> None:
        # New requests are only in the state until written: before an untracked operation.
        assert not self.unwritten, "new requests would be lost with the state"
        self.state = None
        self.finished.clear()

    def known(self, request_id: str) -> tuple[Request, Allocation | None] | None:
        """The request and its allocation as they now are, if the transaction knows them."""
        if self.state is None:
            return None
        if request_id in self.state.queued:
            return self.state.queued[request_id], None
        if request_id in self.state.holders:
            return self.state.holders[request_id], self.state.allocations[request_id]
        return self.finished.get(request_id)


T = TypeVar("T")
#: Builds an operation's answer once the pass has run, in the same transaction.
Answer = Callable[[_Tx, _Passed], T]


@dataclass(frozen=True, slots=True)
class _Operation:
    """A write: its change (returning how to answer), whether a pass must follow it, and
    whether it keeps the transaction's live state current (``_Tx``)."""

    change: Callable[[_Tx], Answer[Any]]
    passes: bool = True
    tracked: bool = False


@dataclass(slots=True)
class _Run:
    """What a batch's transaction did, settled once it has committed (``Service._settle``)."""

    outcomes: list[tuple[Pending[_Operation], Any, Exception | None]] = field(
        default_factory=list
    )
    passed: _Passed | None = None
    #: The operation whose change raised, if one did.
    failed: Pending[_Operation] | None = None
    generation: int = 0
    kept: _State | None = None
    #: The views of the requests the pass took out of the queue, for ``on_pass``.
    dequeued: dict[str, RequestView] = field(default_factory=dict)


#: The most requests ``Service.wait`` remembers its last pass for.
_WAITS_KEPT = 1000


class Service:
    def __init__(
        self, db: Database, clock: Callable[[], datetime] = _utcnow, catch_up: bool = False
    ) -> None:
        self.db = db
        self.clock = clock
        #: Embedded (the CLI and the SDK without a server): nobody runs passes between
        #: commands, so a read of requests, pools or components first runs the pass a server's
        #: tick would have run by now, when one is due (``_catch_up``).
        self.catch_up = catch_up
        #: A client's (``catch_up``) waits ride out the database out of reach for a while.
        self._outage = Outage("database") if catch_up else None
        #: Per request a wait left queued, the generation its last pass left (``wait``).
        self._passed_at: dict[str, int] = {}
        #: Called with every committed pass's summary and the views of the requests it took
        #: out of the queue (``PassSummary.dequeued``) as committed: the server's metrics and
        #: long-poll wake-ups, which answer with those views instead of reading them. After
        #: the commit, on the thread that ran the batch.
        self.on_pass: Callable[[PassSummary, Mapping[str, RequestView]], None] | None = None
        #: Called after every write batch with where it ran ("loop": on a server's event
        #: loop, ``drive_writes_on``; "thread") and how many operations it held (metrics).
        self.on_batch: Callable[[str, int], None] | None = None
        self._writes: GroupCommit[_Operation] = GroupCommit(
            self._batch_on_thread, self._batch_on_loop
        )
        #: The live state as the last batch committed it, with the store's generation then:
        #: the next batch starts from it instead of loading it when nobody wrote in between
        #: (another process, or a write that does not track the state). Only batches touch it.
        self._committed: tuple[int, _State] | None = None

    def close(self) -> None:
        self._writes.close()
        self.db.close()

    def drive_writes_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """A server's running event loop leads the writes queued ``later`` from now on
        (``_batch_on_loop``), until ``stop_driving``. On SQLite a batch is taken
        ``GATHER_TURNS`` turns after its first write, and a thread checkpoints the WAL
        meanwhile, not the writes, which would stall the loop (``Database.checkpoint_apart``)."""
        self._writes.drive_on(loop, GATHER_TURNS if self.db.embedded else 0)
        self.db.checkpoint_apart()

    async def stop_driving(self) -> None:
        """On that loop, before it stops: its write in flight ends, and its connection
        closes; a thread leads them from now on, and the writes checkpoint again."""
        await self._writes.stop_driving()
        await self.db.close_async()
        await asyncio.get_running_loop().run_in_executor(None, self.db.checkpoint_with_writes)

    @contextmanager
    def later(self) -> Iterator[None]:
        """Writes in the block are queued, not waited for: ``Later`` is raised, before
        anything is written, with the future of the write's answer. For a server's event
        loop, which awaits it; only for methods whose write is their last step (the busy
        routes' create, release, cancel, heartbeat), since the rest of the method is skipped."""
        with _writing("later"):
            yield

    # -- pools -------------------------------------------------------------------------

    def create_pool(
        self, name: str, capacity: Mapping[str, object], description: str | None = None
    ) -> PoolView:
        frontend.check_new_addressed_name("name", frontend.validate_addressed_name("name", name))
        amounts = frontend.validate_capacity(capacity)
        frontend.validate_description(description)

        def change(tx: _Tx) -> Answer[PoolView]:
            conn = tx.conn
            if any(p.name == name for p in repo.list_pools(conn)):
                raise Conflict(f"a resource pool named `{name}` already exists")
            pool_id = repo.insert_pool(conn, name, description, amounts, self.clock()).id
            return lambda tx, _: self._pool_view(tx.conn, pool_id)

        return self._write(change)

    def update_pool(
        self,
        ref: str,
        capacity: Mapping[str, object] | None = None,
        description: str | None = None,
    ) -> PoolView:
        frontend.validate_description(description)

        def change(tx: _Tx) -> Answer[PoolView]:
            conn = tx.conn
            pool = repo.get_pool(conn, ref)
            now = self.clock()
            if capacity is not None:
                new_capacity = frontend.apply_capacity_update(pool.capacity, capacity)
                policies = repo.list_policies(conn, pool_id=pool.id)
                frontend.check_removed_keys(
                    new_capacity, policies, pool.name,
                    lambda policy: repo.get_component(conn, policy.component_id).name,
                )
                frontend.check_reserved_total(new_capacity, policies, pool.name)
                for policy in policies:
                    kept = frontend.policy_within(policy, new_capacity)
                    if kept != (policy.reserved, policy.limit):
                        repo.update_policy(conn, policy.id, now, reserved=kept[0], limit=kept[1])
                repo.set_pool_capacity(conn, pool.id, new_capacity, now)
            if description is not None:
                repo.update_pool_description(conn, pool.id, description, now)
            return lambda tx, _: self._pool_view(tx.conn, pool.id, detail=True)

        return self._write(change)

    def delete_pool(self, ref: str) -> None:
        def change(tx: _Tx) -> Answer[None]:
            conn = tx.conn
            pool = repo.get_pool(conn, ref)
            live = repo.live_allocations(conn, pool_id=pool.id)
            if live:
                raise Conflict(
                    f"resource pool `{pool.name}` has {len(live)} live allocation(s) "
                    f"({_ids(a.request_id for a in live)}): release or cancel them first"
                )
            repo.delete_pool(conn, pool.id)
            tx.event(
                "pool_deleted", f"pool {pool.name} deleted", self.clock(), pool_id=pool.id
            )
            return lambda tx, _: None

        self._write(change)

    def _catch_up(self) -> None:
        """With ``catch_up``: a pass when a lease ran out, else its units would show
        allocated until the next write (a server's tick releases them within a second).
        One small read when none did."""
        if self.catch_up:
            with self.db.read(statement=True) as conn:
                due = repo.lease_expired(conn, self.clock())
            if due:
                self.reconcile()

    def get_pool(self, ref: str) -> PoolView:
        self._catch_up()
        with self.db.read() as conn:
            return self._pool_view(conn, repo.get_pool(conn, ref).id, detail=True)

    def list_pools(self) -> list[PoolView]:
        self._catch_up()
        with self.db.read() as conn:
            state = _State.load(conn)
            entries = queue_entries(reconcile(state.snapshot(self.clock())))
            return [self._pool_view_of(state, entries, pool) for pool in _by_name(state.pools)]

    def pool_requests(self, ref: str, view: PoolRequestView = "all") -> list[RequestView]:
        one_of("view", view, POOL_REQUEST_VIEWS)  # a typo must not list nothing
        detail = self.get_pool(ref)
        rows: list[RequestView] = []
        if view in ("active", "all"):
            rows += detail.active_requests
        if view in ("queued", "all"):
            rows += detail.queued_requests
        return rows

    # -- policies ----------------------------------------------------------------------

    def attach_policy(
        self,
        pool_ref: str,
        component: str,
        component_type: str = "orchestrator",
        priority: int = 0,
        reserved: Mapping[str, object] | None = None,
        limit: Mapping[str, object] | None = None,
    ) -> PolicyView:
        kind = _component_type(component_type)
        frontend.validate_addressed_name("component", component, printing=False)

        def change(tx: _Tx) -> Answer[PolicyView]:
            conn = tx.conn
            pool = repo.get_pool(conn, pool_ref)
            reserved_amounts, limit_amounts = frontend.validate_policy(
                pool, reserved or {}, limit or {}, priority
            )
            now = self.clock()
            found = _component(conn, component, kind)
            if found is None:  # a new name prints as itself; one stored earlier is taken
                check_printing("component", component)
                frontend.check_new_addressed_name("component", component)
            component_id = (found or repo.insert_component(conn, component, kind, now)).id
            existing = repo.list_policies(conn, pool_id=pool.id)
            if any(p.component_id == component_id for p in existing):
                raise Conflict(
                    f"{kind} `{component}` already has a policy on resource pool `{pool.name}`: "
                    "change it in place (update-policy), or detach it first"
                )
            candidate = Policy(
                id="",
                pool_id=pool.id,
                component_id=component_id,
                priority=priority,
                created_at=now,
                updated_at=now,
                reserved=reserved_amounts,
                limit=limit_amounts,
            )
            frontend.check_reserved_total(pool.capacity, [*existing, candidate], pool.name)
            policy_id = repo.insert_policy(
                conn, pool.id, component_id, priority, reserved_amounts, limit_amounts, now
            ).id
            return lambda tx, _: self._policy_view(
                state := _State.load(tx.conn), state.policies[policy_id]
            )

        return self._write(change)

    def update_policy(
        self,
        pool_ref: str,
        component: str,
        component_type: str = "orchestrator",
        priority: int | None = None,
        reserved: Mapping[str, object] | None = None,
        limit: Mapping[str, object] | None = None,
    ) -> PolicyView:
        """Change a policy in place, in use or not: what is given replaces what it had
        (``reserved`` and ``limit`` each as a whole map). Allocations keep their units, as
        when a pool shrinks (a limit never picks victims); the pass that follows decides the
        queue by the new policy."""
        kind = _component_type(component_type)
        if priority is None and reserved is None and limit is None:
            raise InvalidInput.from_message(
                "policy", "policy: nothing to update: give a priority, reserved or limit")

        def change(tx: _Tx) -> Answer[PolicyView]:
            conn = tx.conn
            pool = repo.get_pool(conn, pool_ref)
            policy = _policy_of(conn, pool, component, kind)
            new_reserved, new_limit = frontend.validate_policy(
                pool,
                policy.reserved if reserved is None else reserved,
                policy.limit if limit is None else limit,
                policy.priority if priority is None else priority,
            )
            others = [p for p in repo.list_policies(conn, pool_id=pool.id) if p.id != policy.id]
            frontend.check_reserved_total(
                pool.capacity,
                [*others, replace(policy, reserved=new_reserved, limit=new_limit)],
                pool.name,
            )
            now = self.clock()
            repo.update_policy(conn, policy.id, now, priority=priority,
                               reserved=new_reserved, limit=new_limit)
            if priority is not None and priority != policy.priority:
                repo.reprioritize_allocations(conn, policy.id, priority)
                # Its holders' reasons told the old priority: they tell the new one, and
                # their histories when it changed.
                reason = frontend.reprioritized(pool.name, priority, policy.priority)
                for allocation in _held_under(conn, policy):
                    repo.set_request_reason(conn, allocation.request_id, reason, now)
                    tx.event("reprioritized", reason, now,
                             request_id=allocation.request_id, pool_id=pool.id)
            return lambda tx, _: self._policy_view(
                state := _State.load(tx.conn), state.policies[policy.id]
            )

        return self._write(change)

    def detach_policy(
        self, pool_ref: str, component: str, component_type: str = "orchestrator"
    ) -> None:
        kind = _component_type(component_type)
        as_ref(component)  # refused before the pool is looked up, as over HTTP

        def change(tx: _Tx) -> Answer[None]:
            conn = tx.conn
            pool = repo.get_pool(conn, pool_ref)
            policy = _policy_of(conn, pool, component, kind)
            live = _held_under(conn, policy)
            if live:
                raise Conflict(
                    f"policy of {kind} `{component}` on `{pool.name}` has {len(live)} live "
                    f"allocation(s) ({_ids(a.request_id for a in live)}): "
                    "release or cancel them first"
                )
            repo.delete_policy(conn, policy.id)
            return lambda tx, _: None

        self._write(change)

    def list_policies(
        self,
        pool_ref: str | None = None,
        component: str | None = None,
        component_type: str | None = None,
    ) -> list[PolicyView]:
        kind = _component_type(component_type) if component_type is not None else None
        frontend.validate_filter("component", component)
        frontend.validate_filter("pool", pool_ref)
        with self.db.read() as conn:
            state = _State.load(conn)
            pool_id = repo.get_pool(conn, pool_ref).id if pool_ref is not None else None
            _known_component(state, component)
            views = []
            for policy in state.policies.values():
                owner = state.components[policy.component_id]
                if pool_id is not None and policy.pool_id != pool_id:
                    continue
                if component is not None and owner.name != component:
                    continue
                if kind is not None and owner.type != kind:
                    continue
                views.append(self._policy_view(state, policy))
            return sorted(views, key=lambda v: (v.pool, -v.priority, v.component))

    # -- components --------------------------------------------------------------------

    def list_components(self, component_type: str | None = None) -> list[ComponentView]:
        """Every component (of ``component_type``), by name then type."""
        kind = _component_type(component_type) if component_type is not None else None
        self._catch_up()
        with self.db.read() as conn:
            state = _State.load(conn)
        pools: dict[str, list[str]] = defaultdict(list)
        for policy in state.policies.values():
            pools[policy.component_id].append(state.pools[policy.pool_id].name)
        allocated = Counter(r.component_id for r in state.holders.values())
        queued = Counter(r.component_id for r in state.queued.values())
        return [
            ComponentView(c.id, c.name, c.type.value, sorted(pools[c.id]), allocated[c.id],
                          queued[c.id], c.created_at)
            for c in sorted(state.components.values(), key=lambda c: (c.name, c.type.value))
            if kind is None or c.type is kind
        ]

    # -- requests ----------------------------------------------------------------------

    def create_request(
        self,
        component: str,
        component_type: str = "orchestrator",
        demand: Mapping[str, int] | None = None,
        preemptible: bool = True,
        max_retries: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: int | None = None,
        *,
        created_by: str | None = None,
        idempotency_key: str | None = None,
    ) -> RequestView:
        """A new request, decided at once. With ``lease_ttl`` (seconds) its allocation is
        released when no heartbeat renews it for that long (the holder died). ``created_by``:
        the id of the API token it was submitted with (its owner). ``idempotency_key``: when a
        request was already created with it, that request is answered and nothing is made."""
        kind = _component_type(component_type)
        # Only looked up (a request needs its component's policy): one stored earlier is taken.
        frontend.validate_addressed_name("component", component, printing=False)
        amounts = frontend.validate_demand(demand or {})
        validate_int("max_retries", max_retries, 0, MAX_RETRIES)
        if lease_ttl is not None:
            validate_int("lease_ttl", lease_ttl, 1, MAX_LEASE_TTL)
        if labels is not None and not isinstance(labels, Mapping):  # as the API's schema says
            raise InvalidInput("labels", labels, "must be a mapping")
        check_key_count("labels", labels or {}, MAX_LABELS)
        for key, value in (labels or {}).items():
            frontend.validate_name("labels key", key)
            if not isinstance(value, str):
                raise InvalidInput(f"labels.{key}", value, "must be a string")
            bounded_text(f"labels.{key}", value, MAX_LABEL_VALUE)
        idempotency_key = validate_key(idempotency_key)

        def change(tx: _Tx) -> Answer[RequestView]:
            conn = tx.conn
            if idempotency_key is not None:
                self._write_new(tx)  # an earlier create in this batch may have used the key
                made = repo.find_request_by_key(conn, idempotency_key)
                if made is not None:
                    named = tx.live().component_named(component, kind)
                    asked = {
                        "component": named.id if named is not None else None,
                        "resources": amounts, "preemptible": preemptible,
                        "max_retries": max_retries, "labels": dict(labels or {}),
                        "lease_ttl": lease_ttl, "token": created_by,
                    }
                    _same_as_keyed(repo.get_request(conn, made), idempotency_key, asked)
                    return lambda tx, _: self._request_view(tx.conn, made)
            state = tx.live()
            found = state.component_named(component, kind)
            if found is None:
                # A command to run as it stands but for its POOL and N (it named no
                # priority, which is required, nor a step operator's type: helper-83).
                typed = "" if kind is ComponentType.ORCHESTRATOR else f" -t {kind.value}"
                raise NotFound(
                    f"no {kind} named `{component}`: attach a policy first (fairpool "
                    f"resource-pool attach-policy POOL {shlex.quote(component)}{typed} "
                    "--priority N)"
                )
            request = repo.new_request(
                found.id,
                amounts,
                self.clock(),
                preemptible=preemptible,
                max_retries=max_retries,
                labels=dict(labels or {}),
                lease_ttl=lease_ttl,
                created_by_token_id=created_by,
            )
            tx.event(
                "created", "request created", self.clock(), request_id=request.id
            )
            _put_in_order(state.queued, request.id, request, _queue_order)
            tx.created.append(request.id)
            tx.unwritten[request.id] = idempotency_key
            return lambda tx, done: self._request_view_after(tx, done, request.id)

        return self._heard(self._write(change, tracked=True))

    def get_request(self, ref: str) -> RequestView:
        self._catch_up()
        with self.db.read() as conn:
            return self._heard(self._request_view(conn, ref))

    def request_events(self, ref: str) -> list[EventView]:
        """Request ``ref``'s history, oldest first. The log outlives the request: a deleted
        one's, ``deleted`` last, is found by its whole id."""
        self._catch_up()
        with self.db.read() as conn:
            request_id, events = repo.request_events(conn, ref)
            names = repo.pool_names(conn, {e.pool_id for e in events if e.pool_id is not None})
        return [
            EventView(at=as_utc(e.at), kind=e.kind, request_id=request_id,
                      pool=names.get(e.pool_id) if e.pool_id is not None else None,
                      message=e.message, data=e.data)
            for e in events
        ]

    def _heard(self, request: RequestView) -> RequestView:
        if self._outage is not None:
            self._outage.hear(request)
        return request

    def decided_request(self, ref: str, wait: bool = True) -> tuple[str, RequestView | None]:
        """The id of request ``ref`` and, unless it still waits, its view, without the
        engine run a waiting request's view costs. First its status alone, one statement
        (``Database.read(statement=True)``): when ``ref`` is the whole id of a request that
        still waits, what most long-polls ask, that is all. Else one small read. Without
        ``wait``: ``WouldWait`` where a read would wait (``Database.read``)."""
        with self.db.read(wait=wait, statement=True) as conn:
            status = repo.request_status(conn, ref)
        if status is RequestStatus.QUEUED:
            return ref, None
        return self.read_decided(ref, wait)

    def read_decided(self, ref: str, wait: bool = True) -> tuple[str, RequestView | None]:
        """``decided_request`` after its first statement, for a request not known to wait
        (its status told otherwise, or ``ref`` is a prefix): one small read."""
        with self.db.read(wait=wait) as conn:
            request = repo.get_request(conn, ref)
            if request.status is RequestStatus.QUEUED:
                return request.id, None
            return request.id, self._decided_view(conn, request)

    async def still_queued(self, request_id: str) -> bool:
        """PostgreSQL, on an event loop: whether the request whose whole id is
        ``request_id`` still waits, by ``decided_request``'s first statement, its round trip
        awaited on the loop (``Database.scalar_async``) rather than on a worker thread."""
        return await repo.request_status_async(self.db, request_id) is RequestStatus.QUEUED

    def list_requests(
        self, status: str | None = None, component: str | None = None, pool: str | None = None
    ) -> list[RequestView]:
        """Every request the filters match, oldest first (``request_page``)."""
        return list(self.request_page(status, component, pool).items)

    def request_page(
        self,
        status: str | None = None,
        component: str | None = None,
        pool: str | None = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        after: str | None = None,
        created_by: str | None = None,
    ) -> Page[RequestView]:
        """Requests ``offset`` to ``offset + limit`` (``limit`` None: to the end), after the
        cursor ``after`` if given (a page's ``next``), of those with ``status``, of
        ``component`` (any type), allocated in or queued on ``pool``, made with token
        ``created_by``; oldest first, and how many match (``repo.request_page``)."""
        if status is not None:
            one_of("status", status, REQUEST_STATUSES)
        frontend.validate_filter("component", component)
        frontend.validate_filter("pool", pool)
        cursor = check_page(limit, offset, after)
        self._catch_up()
        with self.db.read() as conn:
            state = _State.load(conn)
            pool_name = repo.get_pool(conn, pool).name if pool is not None else None
            _known_component(state, component)
            entries = queue_entries(reconcile(state.snapshot(self.clock())))
            ids, total, end = repo.request_page(
                conn,
                status=RequestStatus(status) if status is not None else None,
                component_ids=[c.id for c in state.components.values() if c.name == component]
                if component is not None
                else None,
                pool_name=pool_name,
                queued_there=_waiting_on(entries, pool_name) if pool_name is not None else (),
                created_by=created_by,
                limit=limit,
                offset=offset,
                after=cursor,
            )
            held = repo.allocations_and_retries(conn, ids)
            views = tuple(
                _view(state.components, request, *held[request.id], entries.get(request.id, ()))
                for request in repo.requests_by_id(conn, ids)
            )
        return Page(views, total, limit, offset, str(end) if end else None)

    def wait(self, ref: str, seconds: float) -> RequestView:
        """The request once it leaves the queue, or as it stands after ``seconds``.

        Polls with capped backoff (other processes' releases reach us only through the
        file). Each poll passes when the store changed since this wait's last pass, or that
        pass decided something: a pass after a pass can still decide (a grant in one pass
        may make a preemption possible only in the next: semantics.md's fixed-point
        exception). Otherwise it only reads (a lease that ran out passes: ``_catch_up``):
        a pass at every poll was a write, ~3 a second for each idle waiter (helper-78); none
        at all left a waiter queued that the next pass would grant (helper-82). Holds no
        transaction while sleeping. A client's wait polls on through a database out of
        reach, for up to ``WAIT_OUTAGE`` (``Outage``).
        """
        deadline = time.monotonic() + seconds
        delay = 0.1
        # The store's generation after a pass that decided nothing, kept from one call to
        # the next: the CLI and the SDK wait in slices.
        passed_at = self._passed_at.pop(ref, None)
        while True:
            try:
                if passed_at is None or self._generation() != passed_at:
                    summary, made = self._write(
                        lambda tx: lambda tx, done: (done.summary, db_generation(tx.conn)),
                        tracked=True)
                    decided = summary.granted or summary.preempted or summary.rejected or (
                        summary.expired)
                    passed_at = None if decided else made
                request = self.get_request(ref)
            except DatabaseUnreachable as error:
                if self._outage is None:
                    raise
                request = self._outage.unheard(ref, error)
            left = deadline - time.monotonic()
            if request.status != RequestStatus.QUEUED.value or left <= 0:
                if request.status == RequestStatus.QUEUED.value and passed_at is not None:
                    if len(self._passed_at) >= _WAITS_KEPT:  # the oldest: waited for no more
                        self._passed_at.pop(next(iter(self._passed_at)))
                    self._passed_at[ref] = passed_at
                return request
            time.sleep(min(left, jittered(delay)))
            delay = min(delay * 2, 2.0)

    def _generation(self) -> int:
        with self.db.read(statement=True) as conn:
            return read_generation(conn)

    def heartbeat(self, ref: str) -> RequestView:
        """The holder is alive: renew the lease of an allocated request. Any status is
        answered, so a holder learns of a preemption at its next heartbeat."""
        def change(tx: _Tx) -> Answer[RequestView]:
            request = self._request(tx, ref)
            # A lease that ran out is not revived. A server runs no pass here (heartbeats
            # are frequent) unless leases expired (the batch then runs one: see
            # ``_run_changes``). Embedded no tick follows, so the heartbeat runs one, as
            # every other write does.
            if self._expire_leases(tx, tx.expired, self.clock()):
                request = self._request(tx, request.id)
            if request.status is RequestStatus.ALLOCATED and request.lease_ttl is not None:
                expires = as_utc(self.clock() + timedelta(seconds=request.lease_ttl))
                repo.renew_lease(tx.conn, request.id, expires)
                allocations = tx.live().allocations
                allocations[request.id] = replace(
                    allocations[request.id], lease_expires_at=expires
                )
            request_id = request.id
            return lambda tx, done: self._request_view_after(tx, done, request_id)

        return self._write(change, passes=self.catch_up, tracked=True)

    def release_request(self, ref: str) -> RequestView:
        def change(tx: _Tx) -> Answer[RequestView]:
            request = self._request(tx, ref)
            if request.status is not RequestStatus.ALLOCATED:
                hint = ": use cancel" if request.status is RequestStatus.QUEUED else ""
                raise Conflict(
                    f"request {request.id} is {request.status.value}, not allocated{hint}"
                )
            self._finish(tx, request, RequestStatus.RELEASED, "released by its holder")
            return lambda tx, done: self._request_view_after(tx, done, request.id)

        return self._write(change, tracked=True)

    def cancel_request(self, ref: str, reason: str | None = None) -> RequestView:
        """Withdraw a queued or allocated request; ``reason`` (the canceller's words) is
        kept as its reason."""
        why = frontend.cancel_reason(reason)

        def change(tx: _Tx) -> Answer[RequestView]:
            request = self._request(tx, ref)
            if request.status not in (RequestStatus.QUEUED, RequestStatus.ALLOCATED):
                raise Conflict(f"request {request.id} is already {request.status.value}")
            self._finish(tx, request, RequestStatus.CANCELLED, why)
            return lambda tx, done: self._request_view_after(tx, done, request.id)

        return self._write(change, tracked=True)

    def delete_request(self, ref: str) -> None:
        def change(tx: _Tx) -> Answer[None]:
            conn = tx.conn
            request = repo.get_request(conn, ref)
            now = self.clock()
            if request.status is RequestStatus.ALLOCATED:
                repo.release_allocation(conn, request.id, now)
            repo.delete_request(conn, request.id)
            tx.event(
                "deleted",
                f"request deleted ({request.status.value})",
                now,
                request_id=request.id,
            )
            return lambda tx, _: None

        self._write(change)

    def prune(
        self,
        older_than: int,
        *,
        dry_run: bool = False,
        batches: int | None = None,
        progress: PruneProgress | None = None,
    ) -> PruneView:
        """Delete what ended more than ``older_than`` seconds ago (``retention.prune``):
        finished requests and their history, finished workloads and operations; ``batches``:
        in at most that many transactions."""
        validate_int("older_than", older_than, 0, MAX_RETENTION)
        before = self.clock() - timedelta(seconds=older_than)
        return retention.prune(
            self.db, before, dry_run=dry_run, batches=batches, progress=progress
        )

    def check_admin(self) -> None:
        """Nothing: the embedded store has no tokens (``RemoteService.check_admin``)."""

    def reconcile(self) -> PassSummary:
        return self._write(lambda tx: lambda tx, done: done.summary, tracked=True)

    def tick(self) -> PassSummary | None:
        """A server's periodic pass, when one could change anything (``repo.pass_due``);
        else one small read and None. Every tick wrote before, an idle server too, which
        also left every other replica's kept state stale (``generation``)."""
        with self.db.read(statement=True) as conn:
            due = repo.pass_due(conn, self.clock())
        return self.reconcile() if due else None

    # -- API tokens --------------------------------------------------------------------

    def create_token(
        self, role: str, components: Iterable[str] = (), name: str | None = None
    ) -> tuple[ApiToken, str]:
        """A new token and its secret, which is stored only hashed: shown now or never.
        A submitter names the components it may create requests for; an admin names none."""
        try:
            kind = TokenRole(role)
        except ValueError:
            raise InvalidInput(
                "role", role, f"must be one of {', '.join(r.value for r in TokenRole)}"
            ) from None
        allowed = sorted({frontend.validate_addressed_name("component", c) for c in components})
        if kind is TokenRole.SUBMITTER and not allowed:
            raise InvalidInput.from_message(
                "component",
                "component: a submitter token needs at least one --component, naming what it "
                "may create requests for",
            )
        if kind is TokenRole.ADMIN and allowed:
            raise InvalidInput(
                "component", allowed[0], "an admin token may use every component: give none"
            )
        if name is not None:
            frontend.validate_name("name", name)
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.write() as conn:
            token = repo.insert_token(
                conn, name, kind, allowed, secret[:TOKEN_SHOWN], hash_token(secret), self.clock()
            )
        return token, secret

    def list_tokens(self) -> list[ApiToken]:
        with self.db.read() as conn:
            return repo.list_tokens(conn)

    def revoke_token(self, ref: str) -> tuple[ApiToken, bool]:
        """Revoke a token at once: (the token, whether this revoked it). Revoking it again
        changes nothing. ``ref``: its id or id prefix; or, what a user holds when a token
        leaked, its secret or the secret's first characters (``token list``'s prefix)."""
        with self.db.write() as conn:
            if not ref.startswith(TOKEN_PREFIX):
                token = repo.get_token(conn, ref)
            elif len(ref) > TOKEN_SHOWN:
                found = repo.token_by_hash(conn, hash_token(ref))
                if found is None:  # the secret is not said back: it may be a live one's
                    raise NotFound("no token has that secret (not shown)")
                token = found
            else:
                token = repo.token_by_prefix(conn, ref)
            if token.revoked_at is not None:
                return token, False
            repo.revoke_token(conn, token.id, self.clock())
            return repo.get_token(conn, token.id), True

    def authenticate(self, secret: str) -> ApiToken | None:
        """The token with this secret, revoked or not; None if there is none."""
        with self.db.read() as conn:
            return repo.token_by_hash(conn, hash_token(secret))

    # -- writes ------------------------------------------------------------------------

    def _write(
        self,
        change: Callable[[_Tx], Answer[T]],
        passes: bool = True,
        tracked: bool = False,
    ) -> T:
        """One write operation: ``change`` (raising rolls it back alone), a reconcile pass
        unless ``passes`` is False, then the answer ``change`` returned is built. Operations
        from other threads waiting at the same time share the transaction and the pass.
        ``tracked``: ``change`` keeps the transaction's live state current (see ``_Tx``)."""
        operation = _Operation(change, passes, tracked)
        if _mode.get() == "later":
            raise Later(self._writes.submit_later(operation))
        return cast(T, self._writes.submit(operation))

    def _run_batch(self, batch: list[Pending[_Operation]]) -> None:
        """One transaction for the whole batch. An operation whose change fails is undone
        alone: the transaction is rolled back, that operation fails, and the others run again
        in a new one (no savepoint per operation: failures are rare, savepoints are not)."""
        work = list(batch)
        defer = not self.db.embedded
        while work:
            try:
                failed = self._attempt(work, defer)
            except DeferredWriteFailed:
                defer = False  # again, writing as it goes, to learn whose write fails
                continue
            if failed is None:
                return
            work.remove(failed)

    def _attempt(
        self, batch: list[Pending[_Operation]], defer: bool
    ) -> Pending[_Operation] | None:
        """Run ``batch``; the operation whose change raised (rolled back, failed), if any.

        ``defer``: PostgreSQL sends the writes together (``Database.write``), and when the
        batch starts from the state the last one committed, BEGIN, the lock and the
        generation go with them: the state is then only believed current until they are
        sent. A change that fails on it sends them first, so that it fails only if the
        state was current. If a write sent fails (or the state was not current),
        ``DeferredWriteFailed`` is raised and no operation is settled."""
        run = _Run()
        at_once = _mode.get() == "at_once"
        committed, self._committed = self._committed, None  # the batch changes it in place
        try:
            last_seen = committed[0] if committed is not None and defer else None
            with self.db.write(wait=not at_once, defer=defer, last_seen=last_seen) as conn:
                self._run_changes(run, conn, batch, committed, believed=last_seen is not None)
        except DeferredWriteFailed:
            raise
        except BaseException as error:
            if at_once and isinstance(error, WouldWait):
                self._committed = committed  # left as it was: nothing was written
                raise
            if run.failed is not None and isinstance(error, Exception):
                run.failed.fail(error)
                return run.failed
            for pending in batch:
                pending.fail(error)
            return None
        self._settle(run)
        return None

    def _batch_on_thread(self, batch: list[Pending[_Operation]]) -> None:
        self._run_batch(batch)
        self._ran("thread", batch)

    def _ran(self, where: str, batch: list[Pending[_Operation]]) -> None:
        if self.on_batch is not None:
            self.on_batch(where, len(batch))

    async def _batch_on_loop(self, batch: list[Pending[_Operation]]) -> None:
        """A batch led on a server's event loop (``drive_writes_on``): the operations its
        routes queued while the loop was busy (the last batch included) share one
        transaction, run on the loop when it need not wait, else on a thread.

        SQLite: the batch runs at once on the loop's thread, told not to wait: with no other
        write of this process running, the SQLite lock free (BEGIN IMMEDIATE, no busy
        timeout), the live state held and at most ``AT_ONCE_QUEUE_LIMIT`` queued. Otherwise
        ``WouldWait`` is raised before anything is written, and it runs on a thread that
        may wait (the operations a failed attempt already settled stay settled)."""
        if not self.db.embedded:
            await self._postgresql_batch_on_loop(batch)
            return
        try:
            with _writing("at_once"):
                self._run_batch(batch)
        except WouldWait:
            unsettled = [pending for pending in batch if not pending.done]
            await asyncio.get_running_loop().run_in_executor(
                None, self._batch_on_thread, unsettled
            )
            return
        self._ran("loop", batch)

    async def _postgresql_batch_on_loop(self, batch: list[Pending[_Operation]]) -> None:
        """PostgreSQL, led on a server's event loop: the batch runs on the loop, from the
        state the last batch committed, and its one round trip is awaited
        (``Database.write_async``), so no thread waits for it nor hands the answers back.
        Anything else (no such state, more than ``AT_ONCE_QUEUE_LIMIT`` queued, whose pass
        would hold the loop, a read inside the transaction, another writer of this process,
        a change or a write that fails) runs it again on a thread, as ``_run_batch`` does,
        where failures are told apart; nothing was committed. An ``OperationalError`` (a
        lost connection, whose COMMIT may have taken effect; the lock's timeout) fails the
        batch here, as it would there."""
        run = _Run()
        committed, self._committed = self._committed, None
        try:
            if committed is None or not _fits_the_loop(committed[1]):
                raise WouldWait("the live state is to be loaded, or the queue is long")
            async with self.db.write_async(committed[0]) as conn:
                self._run_changes(run, conn, batch, committed, believed=True)
        except OperationalError as error:
            for pending in batch:
                pending.fail(error)
            self._ran("loop", batch)
            return
        except Exception:
            await asyncio.get_running_loop().run_in_executor(None, self._batch_on_thread, batch)
            return
        self._settle(run)
        self._ran("loop", batch)

    def _run_changes(
        self,
        run: _Run,
        conn: Connection,
        batch: list[Pending[_Operation]],
        committed: tuple[int, _State] | None,
        believed: bool,
    ) -> None:
        """In the batch's transaction: the changes, the pass, the answers and the events,
        recorded in ``run`` for ``_settle`` once committed. ``believed``: the state is only
        believed current until the queued writes are sent (see ``_attempt``)."""
        run.generation = generation = db_generation(conn)
        fresh = committed is not None and committed[0] == generation - 1
        tx = _Tx(conn, committed[1] if fresh and committed is not None else None)
        if _mode.get() == "at_once" and not _fits_the_loop(tx.state):
            raise WouldWait("the live state is to be loaded, or the queue is long")
        answers: list[tuple[Pending[_Operation], Answer[Any]]] = []
        for pending in batch:
            try:
                if not pending.work.tracked:  # it may read or change any row
                    self._write_new(tx)
                answers.append((pending, pending.work.change(tx)))
            except DeferredWriteFailed:  # an earlier operation's write, perhaps
                raise
            except Exception:
                if believed and not conn.invalidated:  # a lost connection: its error stands
                    send_deferred(conn)  # DeferredWriteFailed if the state was stale
                run.failed = pending
                raise
            if not pending.work.tracked:
                tx.forget()
        # Leases expired outside a pass free units: a pass grants them now, and counts them.
        if tx.expired or any(p.work.passes for p, _ in answers):
            run.passed = self._pass(tx)
        else:
            run.passed = _Passed(PassSummary(), Plan())
        for pending, answer in answers:
            try:
                run.outcomes.append((pending, answer(tx, run.passed), None))
            except (DeferredWriteFailed, WouldWait):  # a read where none can be made: on a thread
                raise
            except Exception as error:  # reads only: the others still commit
                run.outcomes.append((pending, None, error))
        if self.on_pass is not None:  # someone may be waiting for them: no read then
            for request_id in run.passed.summary.dequeued():
                run.dequeued[request_id] = self._request_view_after(tx, run.passed, request_id)
        repo.insert_events(conn, tx.events)
        run.kept = tx.state

    def _settle(self, run: _Run) -> None:
        """The batch has committed: its answers go out, its state is kept for the next."""
        for pending, result, refused in run.outcomes:
            if refused is None:
                pending.succeed(result)
            else:
                pending.fail(refused)
        if run.kept is not None:
            self._committed = (run.generation, run.kept)
        if run.passed is not None and self.on_pass is not None and (
            run.passed.summary.expired or any(p.work.passes for p, _, _ in run.outcomes)
        ):
            self.on_pass(run.passed.summary, run.dequeued)

    # -- the pass ----------------------------------------------------------------------

    def _pass(self, tx: _Tx) -> _Passed:
        """Run the engine and apply its plan, again while preemptions create retries; then
        write the rows of the new requests left queued (only creates leave any, and they
        pass)."""
        started = time.perf_counter()
        summary = PassSummary(expired=list(tx.expired))
        waiting = 0
        plan = Plan()
        for _ in range(_MAX_PASSES):
            now = self.clock()
            # The same moment as the grants: a waiter given the expired units was stamped
            # allocated before their holder released them (helper-92).
            self._expire_leases(tx, summary.expired, now)
            state = tx.live()
            if not state.queued:  # nothing waits: nothing to grant, reject or preempt for
                break
            with collector_paused():  # as for the engine: half of a pass at 100k queued
                snapshot = state.snapshot(now)
                plan = reconcile(snapshot)
                retried = self._apply(tx, state, snapshot, plan, now, summary)
            waiting = len(snapshot.queue) - len(plan.grants) - len(plan.rejections)
            if not retried:
                break
        self._write_new(tx)
        result = PassSummary(
            summary.granted,
            summary.preempted,
            summary.rejected,
            summary.retried,
            summary.expired,
            waiting,
            round(time.perf_counter() - started, 6),
            summary.waits,
            list(tx.created),
        )
        return _Passed(result, plan)

    def _expire_leases(self, tx: _Tx, expired: list[str], now: datetime) -> bool:
        """Release the live allocations whose lease ran out by ``now``, adding them to
        ``expired``; whether there were any."""
        conn, state = tx.conn, tx.live()
        found = [
            a for a in state.allocations.values()
            if a.lease_expires_at is not None and a.lease_expires_at < now
        ]
        for allocation in found:
            request = state.holders.pop(allocation.request_id)
            del state.allocations[request.id]
            why = f"lease expired: no heartbeat for {request.lease_ttl} s; units returned"
            repo.release_allocation(conn, request.id, now)
            released = self._decide(tx, request, RequestStatus.RELEASED, why, now)
            tx.event("lease_expired", why, now, request_id=request.id,
                              pool_id=allocation.pool_id)
            tx.finished[request.id] = (released, replace(allocation, released_at=as_utc(now)))
            expired.append(request.id)
        return bool(found)

    def _apply(
        self,
        tx: _Tx,
        state: _State,
        snapshot: Snapshot,
        plan: Plan,
        now: datetime,
        summary: PassSummary,
    ) -> int:
        """Write the plan, and keep ``state`` current; returns how many retry attempts it
        queued."""
        conn = tx.conn
        retried = 0
        victims: dict[str, list[str]] = defaultdict(list)
        for preemption in plan.preemptions:
            victims[preemption.preemptor_id].append(preemption.victim_id)
            victim = state.holders.pop(preemption.victim_id)
            pool_id = state.allocations.pop(victim.id).pool_id
            repo.release_allocation(conn, victim.id, now)
            self._decide(
                tx, victim, RequestStatus.PREEMPTED, preemption.message, now,
                preempted_by_id=preemption.preemptor_id,
            )
            tx.event(
                "preempted",
                preemption.message,
                now,
                request_id=victim.id,
                pool_id=pool_id,
                data={"rule": preemption.rule.value, "by": preemption.preemptor_id},
            )
            summary.preempted.append(victim.id)
            if victim.attempt <= victim.max_retries:
                retry = repo.insert_request(
                    conn,
                    victim.component_id,
                    victim.demand,
                    now,
                    preemptible=victim.preemptible,
                    max_retries=victim.max_retries,
                    labels=victim.labels,
                    attempt=victim.attempt + 1,
                    previous_attempt_id=victim.id,
                    lease_ttl=victim.lease_ttl,
                    created_by_token_id=victim.created_by_token_id,
                )
                tx.event(
                    "retried",
                    f"attempt {victim.attempt + 1} of {victim.max_retries + 1} after preemption",
                    now,
                    request_id=retry.id,
                    data={"previous_attempt_id": victim.id},
                )
                _put_in_order(state.queued, retry.id, retry, _queue_order)
                summary.retried.append(retry.id)
                retried += 1
        snapshot_requests = {r.id: r for r in snapshot.queue}
        for grant in plan.grants:
            request = state.queued.pop(grant.request_id)
            placement = snapshot_requests[request.id].placements[grant.placement_index]
            policy = state.policies[placement.charges[0].leaf]
            pool = state.pools[policy.pool_id]
            lease = request.lease_ttl
            message = frontend.allocated_on(pool.name, policy.priority, victims.get(request.id, ()))
            # The request's row first: a new one is written only now.
            state.holders[request.id] = self._decide(
                tx, request, RequestStatus.ALLOCATED, message, now
            )
            allocation = repo.insert_allocation(
                conn, request.id, pool.id, policy.id, pool.name, policy.priority, now,
                lease_expires_at=now + timedelta(seconds=lease) if lease else None,
            )
            tx.event(
                "allocated", message, now, request_id=request.id, pool_id=pool.id
            )
            _put_in_order(state.allocations, request.id, allocation, _allocation_order)
            summary.granted.append(request.id)
            summary.waits.append(max(0.0, (now - request.created_at).total_seconds()))
        for rejection in plan.rejections:
            request = state.queued.pop(rejection.request_id)
            message = "; ".join(r.message for r in rejection.reasons) or (
                f"{state.components[request.component_id].type.value} "
                f"`{state.components[request.component_id].name}` has no policy on any pool"
            )
            rejected = self._decide(tx, request, RequestStatus.REJECTED, message, now)
            tx.event("rejected", message, now, request_id=request.id)
            tx.finished[request.id] = (rejected, None)
            summary.rejected.append(request.id)
        # Only a changed reason is written, so a long idle queue costs no writes.
        granted = {g.request_id for g in plan.grants}
        reasons: dict[str, list[tuple[int, str]]] = {}
        for group in plan.waiting:
            if group.eligible:
                entry = (group.placement_index, group.reason.message)
                for _, request_id in group.members:
                    if (found := reasons.get(request_id)) is None:
                        reasons[request_id] = [entry]
                    else:
                        found.append(entry)
        # Each message composed once for all the requests that wait for the same reasons:
        # composed for each, they were most of a pass at 100,000 queued that changed nothing.
        composed: dict[tuple[tuple[int, str], ...], str] = {}
        for request_id, entries in reasons.items():
            if request_id in granted:
                continue
            # In placement order (its pools by policy priority), not the order the pass
            # emitted them in, which a preemption earlier in the pass changes.
            key = tuple(entries) if len(entries) == 1 else tuple(sorted(entries))
            if (reason := composed.get(key)) is None:
                reason = composed[key] = "waiting: " + "; ".join(text for _, text in key)
            request = state.queued[request_id]
            if request.status_reason != reason:
                if request_id not in tx.unwritten:  # else its row is written with it
                    repo.set_request_reason(conn, request_id, reason, now)
                state.queued[request_id] = repo.with_reason(request, reason, now)
        return retried

    def _finish(self, tx: _Tx, request: Request, status: RequestStatus, why: str) -> None:
        """End a queued or allocated request."""
        conn, state = tx.conn, tx.live()
        now = self.clock()
        allocation = None
        if request.status is RequestStatus.ALLOCATED:
            repo.release_allocation(conn, request.id, now)
            del state.holders[request.id]
            allocation = replace(state.allocations.pop(request.id), released_at=as_utc(now))
        else:
            del state.queued[request.id]
        finished = self._decide(tx, request, status, why, now)
        tx.event(status.value, why, now, request_id=request.id)
        tx.finished[request.id] = (finished, allocation)

    def _request(self, tx: _Tx, ref: str) -> Request:
        """The request ``ref`` names (id or unique id prefix), as it now is."""
        known = tx.known(as_ref(ref))
        if known is not None:
            return known[0]
        self._write_new(tx)  # a prefix may name one of them
        return repo.get_request(tx.conn, ref)

    @classmethod
    def _decide(
        cls,
        tx: _Tx,
        request: Request,
        status: RequestStatus,
        why: str,
        now: datetime,
        preempted_by_id: str | None = None,
    ) -> Request:
        """Move ``request`` to ``status`` in the database: its whole row, when the transaction
        created it and has not written it yet; the request as it now is."""
        if preempted_by_id in tx.unwritten:  # a row naming it (a foreign key) comes after it
            cls._write_new(tx)
        decided = repo.with_status(request, status, why, now, preempted_by_id)
        if request.id in tx.unwritten:
            repo.write_request(tx.conn, decided, tx.unwritten.pop(request.id))
        else:
            repo.set_request_status(tx.conn, request.id, status, why, now, preempted_by_id)
        return decided

    @staticmethod
    def _write_new(tx: _Tx) -> None:
        """Write the rows of the requests the transaction created and has not written (all
        still queued): before anything that may read them, and at the end of its pass."""
        if not tx.unwritten:
            return
        queued = tx.live().queued
        for request_id, idempotency_key in tx.unwritten.items():
            repo.write_request(tx.conn, queued[request_id], idempotency_key)
        tx.unwritten.clear()

    # -- views -------------------------------------------------------------------------

    def _pool_view(self, conn: Connection, pool_id: str, detail: bool = False) -> PoolView:
        state = _State.load(conn)
        entries = queue_entries(reconcile(state.snapshot(self.clock())))
        return self._pool_view_of(state, entries, state.pools[pool_id], conn if detail else None)

    def _pool_view_of(
        self,
        state: _State,
        entries: Mapping[str, tuple[QueueEntry, ...]],
        pool: Pool,
        conn: Connection | None = None,
    ) -> PoolView:
        # Every key held, those the pool no longer has included (a key removed while held:
        # its units stay held until released, and shown: ``tpu 3/0``), but for the keys a
        # pool without them does not count.
        occupied = dict.fromkeys(pool.capacity, 0)
        active = [a for a in state.allocations.values() if a.pool_id == pool.id]
        for allocation in active:
            for key, amount in state.holders[allocation.request_id].demand.items():
                if key in occupied or key not in frontend.UNBOUNDED_WHEN_ABSENT:
                    occupied[key] = occupied.get(key, 0) + amount
        queued: list[tuple[int, str]] = []
        for request_id, found in entries.items():
            for entry in found:
                if entry.queue == frontend.node_name(pool.name) and entry.position > 0:
                    queued.append((entry.position, request_id))
        queued.sort()
        policies: tuple[PolicyView, ...] = ()
        active_views: tuple[RequestView, ...] = ()
        queued_views: tuple[RequestView, ...] = ()
        if conn is not None:
            policies = tuple(
                sorted(
                    (
                        self._policy_view(state, p)
                        for p in state.policies.values()
                        if p.pool_id == pool.id
                    ),
                    key=lambda v: (-v.priority, v.component),
                )
            )
            active_views = tuple(
                self._request_view_of(
                    conn, state.components, state.holders[a.request_id], (), "active"
                )
                for a in sorted(active, key=lambda a: (a.allocated_at, a.request_id))
            )
            queued_views = tuple(
                self._request_view_of(
                    conn, state.components, state.queued[r], entries[r], "queued"
                )
                for _, r in queued
            )
        return PoolView(
            id=pool.id,
            name=pool.name,
            description=pool.description,
            capacity=dict(pool.capacity),
            occupied=occupied,
            queue_length=len(queued),
            created=pool.created_at,
            updated=pool.updated_at,
            policies=policies,
            active_requests=active_views,
            queued_requests=queued_views,
        )

    def _policy_view(self, state: _State, policy: Policy) -> PolicyView:
        pool = state.pools[policy.pool_id]
        owner = state.components[policy.component_id]
        return PolicyView(
            id=policy.id,
            pool=pool.name,
            pool_id=pool.id,
            component=owner.name,
            component_type=owner.type.value,
            priority=policy.priority,
            reserved=dict(policy.reserved),
            limit=dict(policy.limit),
            effective_reserved={k: policy.reserved.get(k, 0) for k in pool.capacity},
            effective_limit={k: policy.limit.get(k, v) for k, v in pool.capacity.items()},
            created=policy.created_at,
        )

    def _request_view(self, conn: Connection, ref: str) -> RequestView:
        """Request ``ref``'s view (an id, or a unique id prefix)."""
        request = repo.get_request(conn, ref)
        if request.status is not RequestStatus.QUEUED:
            return self._decided_view(conn, request)
        state = _State.load(conn)
        found = queue_entries(reconcile(state.snapshot(self.clock()))).get(request.id, ())
        return self._request_view_of(conn, state.components, request, found)

    def _decided_view(self, conn: Connection, request: Request) -> RequestView:
        """The view of a request that no longer waits: only a waiting request needs the whole
        state (its queue positions), and of the components only its own."""
        owner = repo.get_component(conn, request.component_id)
        return self._request_view_of(conn, {owner.id: owner}, request, ())

    def _request_view_after(self, tx: _Tx, done: _Passed, request_id: str) -> RequestView:
        """A request's view right after its operation and the pass, which already knows where
        a waiting request stands: no second load and engine run, and no read at all when the
        transaction knows the request (a batch on PostgreSQL's event loop could not read).
        A waiting request the pass did not place ran no pass (a heartbeat's, on a server):
        where it stands is then the engine's answer on the live state."""
        known = tx.known(request_id)
        if known is None:
            request = repo.get_request(tx.conn, request_id)
            allocation, retried_as_id = repo.allocation_and_retry(tx.conn, request_id)
        else:
            # Only a preempted request has a retry, and the transaction does not know those.
            (request, allocation), retried_as_id = known, None
        entries = done.entries(request_id)
        if request.status is RequestStatus.QUEUED and not entries:
            entries = queue_entries(reconcile(tx.live().snapshot(self.clock()))).get(
                request_id, ())
        return _view(tx.live().components, request, allocation, retried_as_id, entries)

    def _request_view_of(
        self,
        conn: Connection,
        components: Mapping[str, Component],
        request: Request,
        entries: tuple[QueueEntry, ...],
        pool_state: str | None = None,
    ) -> RequestView:
        allocation, retried_as_id = repo.allocation_and_retry(conn, request.id)
        return _view(components, request, allocation, retried_as_id, entries, pool_state)


def _view(
    components: Mapping[str, Component],
    request: Request,
    allocation: Allocation | None,
    retried_as_id: str | None,
    entries: tuple[QueueEntry, ...],
    pool_state: str | None = None,
) -> RequestView:
    owner = components[request.component_id]
    queue = tuple(
        QueuePlace(
            e.queue.removeprefix("pool "),
            e.position,
            e.reason.message,
            e.reason.check.value,
            e.holding,
        )
        for e in entries
    )
    return RequestView(
        id=request.id,
        status=request.status.value,
        status_reason=request.status_reason,
        component=owner.name,
        component_type=owner.type.value,
        resources=dict(request.demand),
        preemptible=request.preemptible,
        max_retries=request.max_retries,
        attempt=request.attempt,
        previous_attempt_id=request.previous_attempt_id,
        retried_as_id=retried_as_id,
        preempted_by_id=request.preempted_by_id,
        labels=dict(request.labels),
        pool=allocation.pool_name if allocation else None,
        priority=allocation.priority if allocation else None,
        created=request.created_at,
        updated=request.updated_at,
        allocated_at=allocation.allocated_at if allocation else None,
        released_at=allocation.released_at if allocation else None,
        lease_ttl=request.lease_ttl,
        lease_expires_at=allocation.lease_expires_at if allocation else None,
        queue=queue,
        state=pool_state,
    )


R = TypeVar("R")


def _put_in_order(
    records: dict[str, R], key: str, record: R, order: Callable[[R], tuple[datetime, str]]
) -> None:
    """Add ``record`` where a load would have put it (loads sort by ``order``): at the end,
    unless it sorts before the last one (e.g. several granted at the same moment)."""
    last = next(reversed(records.values()), None)
    records[key] = record
    if last is not None and order(record) < order(last):
        ordered = sorted(records.items(), key=lambda item: order(item[1]))
        records.clear()
        records.update(ordered)


def _queue_order(request: Request) -> tuple[datetime, str]:
    return request.created_at, request.id


def _allocation_order(allocation: Allocation) -> tuple[datetime, str]:
    return allocation.allocated_at, allocation.request_id


def _held_under(conn: Connection, policy: Policy) -> list[Allocation]:
    """The live allocations granted under ``policy``."""
    return [a for a in repo.live_allocations(conn, pool_id=policy.pool_id)
            if a.policy_id == policy.id]


def _policy_of(conn: Connection, pool: Pool, component: str, kind: ComponentType) -> Policy:
    """``component``'s policy on ``pool``."""
    found = _component(conn, component, kind)
    policy = next((p for p in repo.list_policies(conn, pool_id=pool.id)
                   if found is not None and p.component_id == found.id), None)
    if policy is None:
        raise NotFound.of_policy(kind, component, pool.name)
    return policy


def _component(conn: Connection, name: str, kind: ComponentType) -> Component | None:
    try:
        return repo.get_component_by_name(conn, name, kind)
    except NotFound:
        return None


def _waiting_on(entries: Mapping[str, tuple[QueueEntry, ...]], pool: str) -> list[str]:
    """The requests that wait on pool ``pool`` (by the engine's queue entries): not those
    it can never serve (position 0), as the pool's own view of its queue."""
    queue = frontend.node_name(pool)
    return [id_ for id_, places in entries.items()
            if any(p.queue == queue and p.position > 0 for p in places)]


def _known_component(state: _State, name: str | None) -> None:
    """A list's component filter that names no component: a typo, said as one rather than
    answered with an empty list (components are known from their first policy, and kept)."""
    if name is not None and all(c.name != name for c in state.components.values()):
        raise NotFound.of("component", name)


def _component_type(value: str) -> ComponentType:
    return ComponentType(one_of("component_type", value, COMPONENT_TYPES))


def _by_name(pools: Mapping[str, Pool]) -> list[Pool]:
    return sorted(pools.values(), key=lambda p: p.name)


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(i[:8] for i in ids)
