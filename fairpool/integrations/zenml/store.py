"""ZenML's resource-pool store interface, implemented on ZenML's own tables with fairpool's
engine deciding.

ZenML (0.95-0.96) defines ``ResourcePoolsSQLStoreInterface`` and calls it from its SQL store:
CRUD for pools and policies, reads and deletes of requests, ``create_resource_request`` from
``create_run_step`` and ``release_step_run_resources`` from ``update_run_step``. The state
lives in ZenML's tables (``resource_pool*``, ``resource_request*``); every call that changes
it runs one reconcile pass in the same transaction:

    ZenML rows -> fairpool records -> frontends.pools (quota forest, placements)
    -> engine.reconcile (plan) -> ZenML rows (statuses, reasons, allocations, queue, occupied)

Status mapping (fairpool -> ZenML ``ResourceRequestStatus``): queued -> ``pending`` (the step
run shows ``queued``), allocated -> ``allocated``, rejected -> ``rejected``; a preemption makes
the victim ``preempting`` (its step run is set to ``CANCELLING``, ZenML's own mechanism) and it
keeps its units until its step run ends, then it is ``preempted``; a step run that ends while
its request waits -> ``cancelled``; an allocated request whose step run ends -> ``released``.
Retries are ZenML's (``StepRetryConfig``): a retried step run is a new step run with a new
request; nothing is re-queued here.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import update
from sqlmodel import col, select
from zenml.enums import ExecutionStatus, ResourceRequestStatus, StackComponentType
from zenml.exceptions import EntityExistsError, IllegalOperationError
from zenml.models import (
    Page,
    ResourcePoolAllocation,
    ResourcePoolFilter,
    ResourcePoolQueueItem,
    ResourcePoolRequest,
    ResourcePoolResponse,
    ResourcePoolSubjectPolicyFilter,
    ResourcePoolSubjectPolicyRequest,
    ResourcePoolSubjectPolicyResponse,
    ResourcePoolSubjectPolicyUpdate,
    ResourcePoolUpdate,
    ResourceRequestFilter,
    ResourceRequestRequest,
    ResourceRequestResponse,
)
from zenml.utils.time_utils import utc_now
from zenml.zen_stores.resource_pools.store_interface import ResourcePoolsSQLStoreInterface
from zenml.zen_stores.schemas.component_schemas import StackComponentSchema
from zenml.zen_stores.schemas.resource_pool_policy_schemas import (
    ResourcePoolSubjectPolicyResourceSchema,
    ResourcePoolSubjectPolicySchema,
)
from zenml.zen_stores.schemas.resource_pool_schemas import (
    ResourcePoolAllocationSchema,
    ResourcePoolQueueSchema,
    ResourcePoolResourceSchema,
    ResourcePoolSchema,
)
from zenml.zen_stores.schemas.resource_request_schemas import (
    ResourceRequestResourceSchema,
    ResourceRequestSchema,
)
from zenml.zen_stores.sql_zen_store import Session, SqlZenStore

from fairpool.engine.explain import QueueEntry, queue_entries
from fairpool.engine.model import Allocation as EngineAllocation
from fairpool.engine.model import Charge, Node, Placement, Plan, Snapshot
from fairpool.engine.model import Request as EngineRequest
from fairpool.engine.reconcile import reconcile
from fairpool.errors import InvalidInput
from fairpool.frontends import pools as frontend
from fairpool.integrations.zenml import SOURCE  # the implementation-source value
from fairpool.store.records import Policy, Pool

#: A pass that preempts is followed by another (the preemptors wait for their victims);
#: each repetition takes at least one request out of the queue, this only bounds a bug.
_MAX_PASSES = 16

#: Statuses whose request still holds its allocation.
_HOLDING = (ResourceRequestStatus.ALLOCATED.value, ResourceRequestStatus.PREEMPTING.value)
#: What may request resources (``step_run.resource_requester``), so what a policy is for.
_SUBJECT_TYPES = (StackComponentType.ORCHESTRATOR.value, StackComponentType.STEP_OPERATOR.value)

T = TypeVar("T")


def enable(store: Any = None) -> FairpoolResourcePools:
    """Plug fairpool into an in-process ZenML SQL store (default: ``Client().zen_store``).

    Idempotent. A store behind a ZenML server (a REST store) cannot be given one from the
    client: start the server with ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE`` instead.
    """
    if store is None:
        from zenml.client import Client

        store = Client().zen_store
    if not isinstance(store, SqlZenStore):
        raise TypeError(
            "fairpool can only be plugged into an in-process SQL store, not "
            f"{type(store).__name__}: start the ZenML server with "
            f"ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE={SOURCE}"
        )
    current = store._resource_pools
    if isinstance(current, FairpoolResourcePools):
        return current
    return FairpoolResourcePools(store=store)


def _valid(check: Callable[[], T]) -> T:
    """fairpool's validation, raised as ZenML expects (a ValueError: HTTP 400, CLI 'Error:')."""
    try:
        return check()
    except InvalidInput as error:
        raise ValueError(str(error)) from None


def _ts(value: datetime) -> float:
    """ZenML stores naive UTC datetimes."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _pool_record(schema: ResourcePoolSchema) -> Pool:
    return Pool(
        id=str(schema.id),
        name=schema.name,
        description=schema.description,
        created_at=schema.created,
        updated_at=schema.updated,
        capacity={r.key: r.total for r in schema.resources},
    )


def _policy_record(schema: ResourcePoolSubjectPolicySchema) -> Policy:
    return Policy(
        id=str(schema.id),
        pool_id=str(schema.pool_id),
        component_id=str(schema.component_id),
        priority=schema.priority,
        created_at=schema.created,
        updated_at=schema.updated,
        reserved={r.key: r.reserved for r in schema.resources},
        limit={r.key: r.limit for r in schema.resources if r.limit is not None},
    )


def _owner(schema: ResourcePoolSubjectPolicySchema) -> str:
    """How messages name a policy: its component's name (its id once ZenML deleted it)."""
    return schema.component.name if schema.component else str(schema.component_id)


def _demand(request: ResourceRequestSchema) -> dict[str, int]:
    return {r.key: r.amount for r in request.requested_resources}


#: The requests holding a live allocation: a subquery, run inside the statement using it.
_HOLDING_IDS = select(ResourcePoolAllocationSchema.request_id).where(
    col(ResourcePoolAllocationSchema.released_at).is_(None)
)


def _stopping(request: ResourceRequestSchema) -> bool:
    """Whether ``request`` is a victim whose step has not ended, holding its units: being
    preempted, or preempted before its step started (loaded only while it holds them)."""
    return request.status in (
        ResourceRequestStatus.PREEMPTING.value, ResourceRequestStatus.PREEMPTED.value
    )


def _component_id(request: ResourceRequestSchema) -> str:
    """'' once ZenML deleted the request's component (SET NULL): no policy names it."""
    return "" if request.component_id is None else str(request.component_id)


@dataclass
class _State:
    """ZenML's rows for one pass, and the engine's snapshot built from them."""

    pools: dict[str, ResourcePoolSchema]
    pool_records: dict[str, Pool]
    policies: dict[str, ResourcePoolSubjectPolicySchema]
    policy_records: dict[str, Policy]
    #: Live allocations by request id.
    allocations: dict[str, ResourcePoolAllocationSchema]
    #: Requests holding a live allocation, and pending ones, by id.
    requests: dict[str, ResourceRequestSchema]
    #: Policies by (pool id, component id).
    by_pool_component: dict[tuple[str, str], Policy]
    snapshot: Snapshot

    @classmethod
    def load(cls, session: Session, now: datetime) -> _State:
        pools = {str(p.id): p for p in session.exec(select(ResourcePoolSchema)).all()}
        policies = {
            str(p.id): p for p in session.exec(select(ResourcePoolSubjectPolicySchema)).all()
        }
        allocations = {
            str(a.request_id): a
            for a in session.exec(
                select(ResourcePoolAllocationSchema).where(
                    col(ResourcePoolAllocationSchema.released_at).is_(None)
                )
            ).all()
        }
        # Live requests, and those preempted before their step started whose step has not
        # ended yet (``_apply_preemptions``): they hold their units until it does.
        requests = {
            str(r.id): r
            for r in session.exec(
                select(ResourceRequestSchema).where(
                    col(ResourceRequestSchema.status).in_(
                        [ResourceRequestStatus.PENDING.value, *_HOLDING]
                    )
                    | (
                        (col(ResourceRequestSchema.status)
                         == ResourceRequestStatus.PREEMPTED.value)
                        & col(ResourceRequestSchema.id).in_(
                            [a.request_id for a in allocations.values()]
                        )
                    )
                )
            ).all()
        }
        pool_records = {pid: _pool_record(p) for pid, p in pools.items()}
        policy_records = {pid: _policy_record(p) for pid, p in policies.items()}

        nodes: dict[str, Node] = {pid: frontend.pool_node(p) for pid, p in pool_records.items()}
        by_component: dict[str, list[Policy]] = defaultdict(list)
        by_pool_component: dict[tuple[str, str], Policy] = {}
        for pid, policy in policy_records.items():
            nodes[pid] = frontend.policy_node(policy, pool_records[policy.pool_id],
                                              _owner(policies[pid]))
            by_component[policy.component_id].append(policy)
            by_pool_component[(policy.pool_id, policy.component_id)] = policy

        engine_allocations = []
        for request_id, allocation in allocations.items():
            request = requests.get(request_id)
            if request is None:
                continue  # its request ended without releasing: nothing to charge
            pool_id = str(allocation.pool_id)
            owner = by_pool_component.get((pool_id, _component_id(request)))
            # A detached policy's allocation still takes units from its pool.
            leaf = owner.id if owner is not None else pool_id
            placement = Placement(
                pool_id,
                (Charge(leaf, _demand(request)),),
                owner.priority if owner is not None else 0,
            )
            engine_allocations.append(
                EngineAllocation(
                    request_id,
                    placement,
                    _ts(allocation.allocated_at),
                    # A preempting victim keeps its units until its step ends; it cannot
                    # be chosen twice.
                    request.preemptible and request.status == ResourceRequestStatus.ALLOCATED,
                )
            )
        # Preemptors wait, out of the queue, until their victims' steps have ended.
        awaiting = {
            str(r.preemption_initiated_by_id)
            for r in requests.values()
            if _stopping(r) and r.preemption_initiated_by_id
        }
        interned: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[Placement, ...]] = {}
        queue = []
        for request_id, request in sorted(
            requests.items(), key=lambda item: (item[1].created, item[0])
        ):
            if request.status != ResourceRequestStatus.PENDING or request_id in awaiting:
                continue
            demand = _demand(request)
            component_id = _component_id(request)
            shape = (component_id, tuple(sorted(demand.items())))
            placements = interned.get(shape)
            if placements is None:
                placements = interned[shape] = frontend.placements(
                    demand, by_component.get(component_id, ()), pool_records
                )
            queue.append(
                EngineRequest(request_id, _ts(request.created), placements, request.preemptible)
            )
        snapshot = Snapshot(_ts(now), nodes, tuple(engine_allocations), tuple(queue))
        return cls(pools, pool_records, policies, policy_records, allocations, requests,
                   by_pool_component, snapshot)


class FairpoolResourcePools(ResourcePoolsSQLStoreInterface):
    """ZenML resource pools, decided by fairpool's engine."""

    def __init__(self, store: SqlZenStore) -> None:
        super().__init__(store)
        # One pass at a time in this process; across processes the database lock taken at
        # the start of each write transaction serializes them (see ``_transaction``).
        self._lock = threading.RLock()

    # -- transactions --------------------------------------------------------------------

    @contextmanager
    def _transaction(self, session: Session | None = None) -> Iterator[Session]:
        """A write transaction that runs alone: this process's lock, then a write on every
        pool-resource row, which takes SQLite's write lock (and MySQL's row locks) before
        anything is read, so two processes never decide on the same state."""
        with self._lock:
            if session is None:
                with Session(self.store.engine) as own:
                    self._lock_rows(own)
                    yield own
                    own.commit()
            else:
                self._lock_rows(session)
                yield session
                session.commit()

    @staticmethod
    def _lock_rows(session: Session) -> None:
        session.execute(
            update(ResourcePoolResourceSchema).values(
                occupied=ResourcePoolResourceSchema.occupied
            )
        )

    # -- the pass ------------------------------------------------------------------------

    def _pass(self, session: Session) -> None:
        """Decide and write: preemptions first (each followed by a new pass, since their
        preemptors wait for the victims), then grants, rejections and waiting reasons."""
        self._end_orphans(session)
        self._stop_started(session)
        for _ in range(_MAX_PASSES):
            now = utc_now()
            state = _State.load(session, now)
            plan = reconcile(state.snapshot)
            if plan.preemptions:
                self._apply_preemptions(session, state, plan)
                session.flush()
                continue
            self._apply(session, state, plan, now)
            break
        session.flush()
        self._write_occupied(session)

    def _end_orphans(self, session: Session) -> None:
        """Requests whose step run was deleted (with its pipeline run: ZenML sets their
        ``step_run_id`` to NULL; a request is always made for a step run): nothing will
        release them, so they end here, their units back."""
        ended = {
            ResourceRequestStatus.PENDING.value: (ResourceRequestStatus.CANCELLED, "cancelled"),
            ResourceRequestStatus.ALLOCATED.value: (ResourceRequestStatus.RELEASED, "released"),
        }
        for request in session.exec(
            select(ResourceRequestSchema).where(
                col(ResourceRequestSchema.step_run_id).is_(None),
                col(ResourceRequestSchema.status).in_([*ended, *_HOLDING])
                | col(ResourceRequestSchema.id).in_(_HOLDING_IDS),
            )
        ).all():
            status, word = ended.get(request.status, (ResourceRequestStatus.PREEMPTED, ""))
            reason = (f"{word}: its step run was deleted" if word
                      else f"{request.status_reason}; its step run was deleted")
            self._end(session, request, status, reason)

    @staticmethod
    def _stop_started(session: Session) -> None:
        """A victim preempted before its step started (``_apply_preemptions``) whose launcher
        had seen the grant just before: its step runs. It is stopped as a running victim is
        (CANCELLING), and is preempting again until its step ends."""
        for request in session.exec(
            select(ResourceRequestSchema).where(
                col(ResourceRequestSchema.status) == ResourceRequestStatus.PREEMPTED.value,
                col(ResourceRequestSchema.id).in_(_HOLDING_IDS),
            )
        ).all():
            step_run = request.step_run
            if step_run is None or step_run.status == ExecutionStatus.QUEUED.value or (
                ExecutionStatus(step_run.status).is_finished
            ):
                continue
            if step_run.status != ExecutionStatus.CANCELLING.value:
                step_run.status = ExecutionStatus.CANCELLING.value
                session.add(step_run)
            request.status = ResourceRequestStatus.PREEMPTING.value
            request.updated = utc_now()
            session.add(request)

    def _apply_preemptions(self, session: Session, state: _State, plan: Plan) -> None:
        for preemption in plan.preemptions:
            victim = state.requests[preemption.victim_id]
            victim.status = ResourceRequestStatus.PREEMPTING.value
            victim.status_reason = preemption.message
            victim.preemption_initiated_by_id = UUID(preemption.preemptor_id)
            victim.updated = utc_now()
            session.add(victim)
            step_run = victim.step_run
            if step_run is None:
                # No step to wait for: the units go back at once.
                self._end(session, victim, ResourceRequestStatus.PREEMPTED, preemption.message)
            elif step_run.status == ExecutionStatus.QUEUED.value:
                # Granted, but its launcher has not seen it yet (it sets RUNNING when it
                # does). Its launcher waits on through "preempting", and so would the
                # preemptor, for ever: preempted now, the launcher fails the step at its next
                # poll. The units stay held until the step run ends (its release), in case
                # the launcher saw the grant just before.
                victim.status = ResourceRequestStatus.PREEMPTED.value
            elif not ExecutionStatus(step_run.status).is_finished:
                # ZenML's way to stop a step: heartbeat-enabled steps are interrupted, the
                # dynamic runner's monitor publishes CANCELLED; see docs/zenml.md.
                step_run.status = ExecutionStatus.CANCELLING.value
                session.add(step_run)

    def _apply(self, session: Session, state: _State, plan: Plan, now: datetime) -> None:
        by_id = {r.id: r for r in state.snapshot.queue}
        for grant in plan.grants:
            request = state.requests[grant.request_id]
            placement = by_id[grant.request_id].placements[grant.placement_index]
            pool = state.pools[placement.queue]
            session.add(
                ResourcePoolAllocationSchema(
                    pool_id=pool.id, request_id=request.id, allocated_at=now
                )
            )
            request.status = ResourceRequestStatus.ALLOCATED.value
            request.status_reason = frontend.allocated_on(pool.name, placement.priority)
            request.updated = now
            session.add(request)
        for rejection in plan.rejections:
            request = state.requests[rejection.request_id]
            message = "; ".join(r.message for r in rejection.reasons)
            if not message:
                component = request.component
                who = f"{component.type} `{component.name}`" if component else "its component"
                message = f"{who} has no policy on any resource pool"
            request.status = ResourceRequestStatus.REJECTED.value
            request.status_reason = message
            request.updated = now
            session.add(request)
        granted = {g.request_id for g in plan.grants}
        reasons: dict[str, list[str]] = defaultdict(list)
        queued: dict[tuple[str, str], int] = {}
        for group in plan.waiting:
            if not group.eligible:
                continue
            for _, request_id in group.members:
                if request_id in granted:
                    continue
                reasons[request_id].append(group.reason.message)
                placement = by_id[request_id].placements[group.placement_index]
                queued[(placement.queue, request_id)] = placement.priority
        for request_id, messages in reasons.items():
            message = "waiting: " + "; ".join(messages)
            request = state.requests[request_id]
            if request.status_reason != message:
                request.status_reason = message
                session.add(request)
        # Requests waiting for their victims are queued on their victims' pools (one that
        # preempted on its first pass has no queue row yet), and say whom they wait for
        # (their reason was the one they had before they preempted). A victim whose
        # preemptor was deleted has none (ZenML's SET NULL): it stays preempting until its
        # step ends.
        victims: dict[str, list[str]] = defaultdict(list)
        for request in state.requests.values():
            initiator = request.preemption_initiated_by_id
            preemptor = state.requests.get(str(initiator))
            if _stopping(request) and preemptor is not None:
                victims[str(initiator)].append(str(request.id))
                pool_id = str(state.allocations[str(request.id)].pool_id)
                policy = state.by_pool_component.get((pool_id, _component_id(preemptor)))
                queued[(pool_id, str(initiator))] = policy.priority if policy else 0
        for preemptor_id, stopping in victims.items():
            preemptor = state.requests[preemptor_id]
            message = ("waiting for the steps of the requests it preempted to end: "
                       + _short(stopping))
            if preemptor.status_reason != message:
                preemptor.status_reason = message
                session.add(preemptor)
        self._write_queue(session, queued, state)

    @staticmethod
    def _queue_rows(session: Session, request_id: UUID) -> list[ResourcePoolQueueSchema]:
        return list(
            session.exec(
                select(ResourcePoolQueueSchema).where(
                    ResourcePoolQueueSchema.request_id == request_id
                )
            ).all()
        )

    @staticmethod
    def _write_queue(
        session: Session, wanted: Mapping[tuple[str, str], int], state: _State
    ) -> None:
        """``resource_pool_queue``: one row per (pool, waiting request), which ZenML's pool
        model counts as ``queue_length``."""
        existing = {
            (str(q.pool_id), str(q.request_id)): q
            for q in session.exec(select(ResourcePoolQueueSchema)).all()
        }
        for key, stale in existing.items():
            if key not in wanted:
                session.delete(stale)
        for (pool_id, request_id), priority in wanted.items():
            row = existing.get((pool_id, request_id))
            if row is None:
                session.add(
                    ResourcePoolQueueSchema(
                        pool_id=UUID(pool_id),
                        request_id=UUID(request_id),
                        priority=priority,
                        request_created=state.requests[request_id].created,
                    )
                )
            elif row.priority != priority:
                row.priority = priority
                session.add(row)

    @staticmethod
    def _write_occupied(session: Session) -> None:
        """``resource_pool_resource.occupied``: units held by live allocations, per key."""
        occupied: dict[tuple[str, str], int] = defaultdict(int)
        for allocation in session.exec(
            select(ResourcePoolAllocationSchema).where(
                col(ResourcePoolAllocationSchema.released_at).is_(None)
            )
        ).all():
            for key, amount in _demand(allocation.request).items():
                occupied[(str(allocation.pool_id), key)] += amount
        for row in session.exec(select(ResourcePoolResourceSchema)).all():
            value = occupied.get((str(row.pool_id), row.key), 0)
            if row.occupied != value:
                row.occupied = value
                session.add(row)

    def _end(
        self,
        session: Session,
        request: ResourceRequestSchema,
        status: ResourceRequestStatus,
        reason: str,
    ) -> None:
        """Give back a request's units (if any) and set its final status."""
        now = utc_now()
        allocation = session.exec(
            select(ResourcePoolAllocationSchema).where(
                ResourcePoolAllocationSchema.request_id == request.id
            )
        ).first()
        if allocation is not None and allocation.released_at is None:
            allocation.released_at = now
            session.add(allocation)
        for row in self._queue_rows(session, request.id):
            session.delete(row)
        request.status = status.value
        request.status_reason = reason
        request.updated = now
        session.add(request)

    # -- hooks called by ZenML's SQL store ---------------------------------------------------

    def create_resource_request(
        self, session: Session, resource_request: ResourceRequestRequest
    ) -> ResourceRequestResponse | None:
        """Called by ``create_run_step`` with ZenML's request map (``step_run: 1`` included):
        insert the request and decide it at once. None when its component has no policy:
        pooling does not apply to its stack, and the step runs as without fairpool (a
        rejection failed every dynamic pipeline of such a stack at its first step)."""
        if session.exec(
            select(ResourcePoolSubjectPolicySchema.id).where(
                ResourcePoolSubjectPolicySchema.component_id == resource_request.component_id
            )
        ).first() is None:
            return None
        with self._transaction(session):
            schema = ResourceRequestSchema.from_request(resource_request)
            session.add(schema)
            session.flush()
            for key, amount in resource_request.requested_resources.items():
                session.add(
                    ResourceRequestResourceSchema(request_id=schema.id, key=key, amount=amount)
                )
            session.flush()
            try:
                frontend.validate_demand(resource_request.requested_resources)
            except InvalidInput as error:
                schema.status = ResourceRequestStatus.REJECTED.value
                schema.status_reason = str(error)
                session.add(schema)
            self._pass(session)
            request_id = schema.id
        session.refresh(schema)
        model = self._request_model(session, request_id, hydrate=True)
        return model

    def release_step_run_resources(self, session: Session, step_run_id: UUID) -> None:
        """Called when a step run finishes or goes to RETRYING: give its units back. A step
        run without a request (static pipelines, steps without a requester) is a no-op."""
        request = session.exec(
            select(ResourceRequestSchema).where(
                ResourceRequestSchema.step_run_id == step_run_id
            )
        ).first()
        if request is None:
            return
        with self._transaction(session):
            session.refresh(request)
            status = ResourceRequestStatus(request.status)
            step_status = request.step_run.status if request.step_run else "gone"
            if status == ResourceRequestStatus.ALLOCATED:
                self._end(session, request, ResourceRequestStatus.RELEASED,
                          f"released: step run {step_status}")
            elif status == ResourceRequestStatus.PREEMPTING or (
                status == ResourceRequestStatus.PREEMPTED
                and session.exec(
                    _HOLDING_IDS.where(ResourcePoolAllocationSchema.request_id == request.id)
                ).first() is not None
            ):
                self._end(session, request, ResourceRequestStatus.PREEMPTED,
                          f"{request.status_reason}; step run {step_status}")
            elif status == ResourceRequestStatus.PENDING:
                self._end(session, request, ResourceRequestStatus.CANCELLED,
                          f"cancelled: step run {step_status} before allocation")
            else:
                return  # already final
            self._pass(session)

    # -- pools -----------------------------------------------------------------------------

    def create_resource_pool(self, resource_pool: ResourcePoolRequest) -> ResourcePoolResponse:
        name = _valid(lambda: frontend.validate_name("name", resource_pool.name))
        capacity = _valid(lambda: frontend.validate_capacity(resource_pool.capacity))
        with self._transaction() as session:
            self.store._set_request_user_id(request_model=resource_pool, session=session)
            existing = session.exec(
                select(ResourcePoolSchema).where(ResourcePoolSchema.name == name)
            ).first()
            if existing is not None:
                raise EntityExistsError(f"A resource pool named `{name}` already exists.")
            schema = ResourcePoolSchema.from_request(resource_pool)
            session.add(schema)
            session.flush()
            for key, total in capacity.items():
                session.add(ResourcePoolResourceSchema(pool_id=schema.id, key=key, total=total))
            self._pass(session)
            pool_id = schema.id
        return self.get_resource_pool(pool_id)

    def get_resource_pool(
        self, resource_pool_id: UUID, hydrate: bool = True
    ) -> ResourcePoolResponse:
        with Session(self.store.engine) as session:
            schema = self.store._get_schema_by_id(
                resource_id=resource_pool_id, schema_class=ResourcePoolSchema, session=session
            )
            entries = self._entries(session) if hydrate else {}
            return self._pool_model(session, schema, hydrate, entries)

    def list_resource_pools(
        self, filter_model: ResourcePoolFilter, hydrate: bool = False
    ) -> Page[ResourcePoolResponse]:
        with Session(self.store.engine) as session:
            entries = self._entries(session) if hydrate else {}

            def convert(schema: ResourcePoolSchema) -> ResourcePoolResponse:
                return self._pool_model(session, schema, hydrate, entries)

            return self.store.filter_and_paginate(
                session=session,
                query=select(ResourcePoolSchema),
                table=ResourcePoolSchema,
                filter_model=filter_model,
                custom_schema_to_model_conversion=convert,
                hydrate=hydrate,
            )

    def update_resource_pool(
        self, resource_pool_id: UUID, update: ResourcePoolUpdate
    ) -> ResourcePoolResponse:
        with self._transaction() as session:
            schema = self.store._get_schema_by_id(
                resource_id=resource_pool_id, schema_class=ResourcePoolSchema, session=session
            )
            if update.capacity is not None:
                record = _pool_record(schema)
                capacity = _valid(
                    lambda: frontend.apply_capacity_update(record.capacity, update.capacity or {})
                )
                policies = {str(p.id): p for p in schema.policies}
                records = [_policy_record(p) for p in policies.values()]
                # As fairpool's service: a removed key a policy reserves is named as removed,
                # before the totals (which would blame the reserve).
                _valid(lambda: frontend.check_removed_keys(
                    capacity, records, schema.name, lambda policy: _owner(policies[policy.id]),
                    "Client().update_resource_pool_subject_policy"))
                _valid(lambda: frontend.check_reserved_total(capacity, records, schema.name))
                # Policy keys must be pool keys, as in fairpool's service: a removed key leaves
                # the policies too (a reserve on it was refused above), or adding it back would
                # revive their old limits on it.
                for policy in schema.policies:
                    stale = [r for r in policy.resources if r.key not in capacity]
                    for policy_row in stale:
                        session.delete(policy_row)
                    if stale:
                        policy.updated = utc_now()
                        session.add(policy)
                rows = {r.key: r for r in schema.resources}
                for key, row in rows.items():
                    if key not in capacity:
                        session.delete(row)
                for key, total in capacity.items():
                    if key in rows:
                        rows[key].total = total
                        session.add(rows[key])
                    else:
                        session.add(
                            ResourcePoolResourceSchema(pool_id=schema.id, key=key, total=total)
                        )
            schema.update(update)
            session.add(schema)
            session.flush()
            self._pass(session)
        return self.get_resource_pool(resource_pool_id)

    def delete_resource_pool(self, resource_pool_id: UUID) -> None:
        with self._transaction() as session:
            schema = self.store._get_schema_by_id(
                resource_id=resource_pool_id, schema_class=ResourcePoolSchema, session=session
            )
            live = self._live_allocations(session, pool_id=schema.id)
            if live:
                raise IllegalOperationError(
                    f"Resource pool `{schema.name}` has {len(live)} live allocation(s) "
                    f"({_short(a.request_id for a in live)}): wait for their steps to finish "
                    "or delete the requests first."
                )
            session.delete(schema)
            session.flush()
            self._pass(session)

    # -- policies ----------------------------------------------------------------------------

    def create_resource_pool_subject_policy(
        self, policy: ResourcePoolSubjectPolicyRequest
    ) -> ResourcePoolSubjectPolicyResponse:
        with self._transaction() as session:
            self.store._set_request_user_id(request_model=policy, session=session)
            pool = self.store._get_schema_by_id(
                resource_id=policy.pool_id, schema_class=ResourcePoolSchema, session=session
            )
            # An unknown component is a KeyError (404), as an unknown pool is; not the
            # foreign key's IntegrityError at the insert (a 500).
            component = self.store._get_schema_by_id(
                resource_id=policy.component_id, schema_class=StackComponentSchema,
                session=session,
            )
            if component.type not in _SUBJECT_TYPES:
                raise ValueError(
                    f"component_id: a policy's subject is an orchestrator or a step operator, "
                    f"not {component.type} `{component.name}`"
                )
            if any(p.component_id == policy.component_id for p in pool.policies):
                raise EntityExistsError(
                    f"Component `{policy.component_id}` already has a policy on resource pool "
                    f"`{pool.name}`: detach it first."
                )
            record = _pool_record(pool)
            reserved, limit = _valid(
                lambda: frontend.validate_policy(
                    record, policy.reserved or {}, policy.limit or {}, policy.priority
                )
            )
            now = utc_now()
            candidate = Policy("", record.id, str(policy.component_id), policy.priority, now, now,
                               reserved, limit)
            _valid(
                lambda: frontend.check_reserved_total(
                    record.capacity,
                    [*(_policy_record(p) for p in pool.policies), candidate],
                    pool.name,
                )
            )
            schema = ResourcePoolSubjectPolicySchema.from_request(policy)
            session.add(schema)
            session.flush()
            self._write_policy_resources(session, schema.id, reserved, limit)
            session.flush()
            self._pass(session)
            policy_id = schema.id
        return self.get_resource_pool_subject_policy(policy_id)

    @staticmethod
    def _write_policy_resources(
        session: Session, policy_id: UUID, reserved: Mapping[str, int], limit: Mapping[str, int]
    ) -> None:
        for key in sorted(set(reserved) | set(limit)):
            session.add(
                ResourcePoolSubjectPolicyResourceSchema(
                    policy_id=policy_id, key=key, reserved=reserved.get(key, 0),
                    limit=limit.get(key),
                )
            )

    def get_resource_pool_subject_policy(
        self, policy_id: UUID, hydrate: bool = True
    ) -> ResourcePoolSubjectPolicyResponse:
        with Session(self.store.engine) as session:
            schema = self.store._get_schema_by_id(
                resource_id=policy_id,
                schema_class=ResourcePoolSubjectPolicySchema,
                session=session,
            )
            return schema.to_model(include_metadata=hydrate, include_resources=True)

    def list_resource_pool_subject_policies(
        self, filter_model: ResourcePoolSubjectPolicyFilter, hydrate: bool = False
    ) -> Page[ResourcePoolSubjectPolicyResponse]:
        with Session(self.store.engine) as session:
            return self.store.filter_and_paginate(
                session=session,
                query=select(ResourcePoolSubjectPolicySchema),
                table=ResourcePoolSubjectPolicySchema,
                filter_model=filter_model,
                hydrate=hydrate,
            )

    def update_resource_pool_subject_policy(
        self, policy_id: UUID, update: ResourcePoolSubjectPolicyUpdate
    ) -> ResourcePoolSubjectPolicyResponse:
        with self._transaction() as session:
            schema = self.store._get_schema_by_id(
                resource_id=policy_id,
                schema_class=ResourcePoolSubjectPolicySchema,
                session=session,
            )
            current = _policy_record(schema)
            pool = schema.pool
            record = _pool_record(pool)
            reserved_raw = update.reserved if update.reserved is not None else current.reserved
            limit_raw = update.limit if update.limit is not None else current.limit
            reserved, limit = _valid(
                lambda: frontend.validate_policy(record, reserved_raw, limit_raw, update.priority)
            )
            others = [_policy_record(p) for p in pool.policies if p.id != schema.id]
            candidate = Policy(current.id, current.pool_id, current.component_id,
                               update.priority, current.created_at, utc_now(), reserved, limit)
            _valid(
                lambda: frontend.check_reserved_total(
                    record.capacity, [*others, candidate], pool.name
                )
            )
            for row in list(schema.resources):
                session.delete(row)
            session.flush()
            # The deleted rows stay in the loaded collection, and adding the policy below
            # would cascade to them (SQLAlchemy refuses a deleted instance: a 500).
            session.expire(schema, ["resources"])
            self._write_policy_resources(session, schema.id, reserved, limit)
            if update.priority != current.priority:  # as fairpool's service words it
                reason = frontend.reprioritized(pool.name, update.priority, current.priority)
                now = utc_now()
                for allocation in self._held_under(session, schema):
                    allocation.request.status_reason = reason
                    allocation.request.updated = now
                    session.add(allocation.request)
            schema.update(update)
            session.add(schema)
            session.flush()
            self._pass(session)
        return self.get_resource_pool_subject_policy(policy_id)

    def delete_resource_pool_subject_policy(self, policy_id: UUID) -> None:
        with self._transaction() as session:
            schema = self.store._get_schema_by_id(
                resource_id=policy_id,
                schema_class=ResourcePoolSubjectPolicySchema,
                session=session,
            )
            live = self._held_under(session, schema)
            if live:
                raise IllegalOperationError(
                    f"The policy of component `{schema.component.name}` on resource pool "
                    f"`{schema.pool.name}` has {len(live)} live allocation(s) "
                    f"({_short(a.request_id for a in live)}): wait for their steps to finish "
                    "or delete the requests first."
                )
            session.delete(schema)
            session.flush()
            self._pass(session)

    # -- requests ------------------------------------------------------------------------------

    def get_resource_request(
        self, resource_request_id: UUID, hydrate: bool = True
    ) -> ResourceRequestResponse:
        """Also the launcher's poll target: a pending request gets a pass first, so time-based
        decisions (a waiter that now holds units) are made while someone is waiting."""
        with Session(self.store.engine) as session:
            schema = self.store._get_schema_by_id(
                resource_id=resource_request_id,
                schema_class=ResourceRequestSchema,
                session=session,
            )
            pending = schema.status == ResourceRequestStatus.PENDING
        if pending:
            with self._transaction() as session:
                self._pass(session)
        with Session(self.store.engine) as session:
            return self._request_model(session, resource_request_id, hydrate)

    def list_resource_requests(
        self, filter_model: ResourceRequestFilter, hydrate: bool = False
    ) -> Page[ResourceRequestResponse]:
        with Session(self.store.engine) as session:
            return self.store.filter_and_paginate(
                session=session,
                query=select(ResourceRequestSchema),
                table=ResourceRequestSchema,
                filter_model=filter_model,
                hydrate=hydrate,
            )

    def delete_resource_request(self, resource_request_id: UUID) -> None:
        """Delete a request (its units go back). A step waiting for it fails: ZenML's launcher
        reports the request as deleted."""
        with self._transaction() as session:
            schema = self.store._get_schema_by_id(
                resource_id=resource_request_id,
                schema_class=ResourceRequestSchema,
                session=session,
            )
            for other in session.exec(
                select(ResourceRequestSchema).where(
                    ResourceRequestSchema.preemption_initiated_by_id == schema.id
                )
            ).all():
                other.preemption_initiated_by_id = None
                session.add(other)
            session.delete(schema)
            session.flush()
            self._pass(session)

    # -- views ---------------------------------------------------------------------------------

    def _request_model(
        self, session: Session, request_id: UUID, hydrate: bool
    ) -> ResourceRequestResponse:
        schema = self.store._get_schema_by_id(
            resource_id=request_id, schema_class=ResourceRequestSchema, session=session
        )
        return schema.to_model(include_metadata=hydrate, include_resources=hydrate)

    @staticmethod
    def _live_allocations(
        session: Session, pool_id: UUID
    ) -> list[ResourcePoolAllocationSchema]:
        return list(
            session.exec(
                select(ResourcePoolAllocationSchema)
                .where(ResourcePoolAllocationSchema.pool_id == pool_id)
                .where(col(ResourcePoolAllocationSchema.released_at).is_(None))
            ).all()
        )

    @classmethod
    def _held_under(
        cls, session: Session, policy: ResourcePoolSubjectPolicySchema
    ) -> list[ResourcePoolAllocationSchema]:
        """The live allocations of the policy's component in its pool."""
        return [a for a in cls._live_allocations(session, policy.pool_id)
                if a.request.component_id == policy.component_id]

    @staticmethod
    def _entries(session: Session) -> dict[str, tuple[QueueEntry, ...]]:
        """Queue positions as the engine sees them now (read only, nothing written)."""
        state = _State.load(session, utc_now())
        return queue_entries(reconcile(state.snapshot))

    def _pool_model(
        self,
        session: Session,
        schema: ResourcePoolSchema,
        hydrate: bool,
        entries: Mapping[str, tuple[QueueEntry, ...]],
    ) -> ResourcePoolResponse:
        model = schema.to_model(include_metadata=hydrate, include_resources=True)
        if not hydrate or model.metadata is None:
            return model
        priorities = {p.component_id: p.priority for p in schema.policies}
        active = []
        for allocation in sorted(
            self._live_allocations(session, schema.id),
            key=lambda a: (a.allocated_at, str(a.request_id)),
        ):
            request = allocation.request
            active.append(
                ResourcePoolAllocation(
                    request=request.to_model(include_metadata=True, include_resources=True),
                    priority=priorities.get(request.component_id) if request.component_id
                    else None,
                    allocated_at=allocation.allocated_at,
                )
            )
        node_name = f"pool {schema.name}"
        positions: list[tuple[int, str]] = []
        for request_id, found in entries.items():
            for entry in found:
                if entry.queue == node_name and entry.position > 0:
                    positions.append((entry.position, request_id))
        # Requests waiting for their victims are not in the engine's queue: they come first.
        waiting_rows = {
            str(q.request_id): q for q in schema.queue_items
        }
        ahead = sorted(
            (q.request_created, rid)
            for rid, q in waiting_rows.items()
            if rid not in entries
        )
        ordered = [rid for _, rid in ahead] + [rid for _, rid in sorted(positions)]
        queued = []
        for request_id in ordered:
            waiting = session.get(ResourceRequestSchema, UUID(request_id))
            if waiting is None or waiting.status != ResourceRequestStatus.PENDING:
                continue
            queued.append(
                ResourcePoolQueueItem(
                    request=waiting.to_model(include_metadata=True, include_resources=True),
                    priority=priorities.get(waiting.component_id, 0)
                    if waiting.component_id else 0,
                )
            )
        model.metadata.active_requests = active
        model.metadata.queued_requests = queued
        return model


def _short(ids: Any) -> str:
    return ", ".join(str(i)[:8] for i in ids)
