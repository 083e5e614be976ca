"""Queries: plain functions on a transaction's connection, returning frozen records.

Functions never open or commit transactions; the caller's ``Database.read()`` or
``Database.write()`` block decides what is atomic. Lists load their resource maps with one
extra query for the whole list, never one per record. Lookups raise ``NotFound`` (except
``allocation_and_retry``: most requests have no allocation; and ``request_status``, whose
caller then looks the reference up as a prefix), and so do updates and deletes of a missing
row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    BindParameter,
    Column,
    ColumnElement,
    Connection,
    RowMapping,
    Select,
    Table,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    tuple_,
    update,
)

from fairpool.errors import AmbiguousReference, NotFound, as_ref
from fairpool.ids import new_id
from fairpool.paging import Cursor
from fairpool.store import schema
from fairpool.store.direct import Direct, check_found
from fairpool.store.records import (
    Allocation,
    ApiToken,
    Component,
    ComponentType,
    Event,
    Policy,
    Pool,
    Request,
    RequestStatus,
    TokenRole,
)
from fairpool.store.schema import as_utc, by_code_point

if TYPE_CHECKING:
    from fairpool.store.db import Database

Amounts = Mapping[str, int]

# Ids per IN list: far below SQLite's 32766 and PostgreSQL's 65535 bound parameters.
_BATCH = 10_000

T = TypeVar("T")


def batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in slices of ``_BATCH``: each fits one IN list on either database."""
    return (items[start : start + _BATCH] for start in range(0, len(items), _BATCH))


def resolve_id(
    connection: Connection,
    table: Table,
    ref: str,
    what: str,
    among: ColumnElement[bool] | None = None,
) -> str:
    """The id of the one row of ``table`` whose id is ``ref``, or else starts with it;
    ``among``: only rows matching it count (the others might as well not exist)."""
    ref = as_ref(ref)
    scope = true() if among is None else among
    if connection.execute(select(table.c.id).where(table.c.id == ref, scope)).first() is not None:
        return ref
    # A ref longer than an id starts none: not asked (SQLite refuses a LIKE pattern of 50,000
    # bytes, an outage's 503 over HTTP, helper-96).
    if ref and len(ref) <= schema.ID_LENGTH:
        # Ids are lower case; LIKE would be case-sensitive on PostgreSQL.
        prefix = table.c.id.startswith(ref.lower(), autoescape=True)
        matches: Sequence[str] = connection.scalars(
            select(table.c.id).where(prefix, scope).limit(2)
        ).all()
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise AmbiguousReference.of(what, ref)
    raise NotFound.of(what, ref)


# Updates by id run on the DBAPI cursor; the SET clause comes from the parameters' names.
_UPDATE_BY_ID = {
    table: Direct(update(table).where(table.c.id == bindparam("_id")))
    for table in schema.metadata.tables.values()
    if "id" in table.c
}


def _update(connection: Connection, table: Table, id_: str, what: str, **values: Any) -> None:
    _UPDATE_BY_ID[table].execute(connection, {"_id": id_, **values}, must_change=(what, id_))


def _delete(connection: Connection, table: Table, id_: str, what: str) -> None:
    result = connection.execute(delete(table).where(table.c.id == id_))
    check_found(result.rowcount, what, id_)


def _amounts_by_owner(
    connection: Connection,
    statement: Select[Any],
    parameters: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, int]]:
    by_owner: defaultdict[str, dict[str, int]] = defaultdict(dict)
    for owner, key, amount in connection.execute(statement, parameters):
        by_owner[owner][key] = amount
    return by_owner


# Components


def insert_component(
    connection: Connection, name: str, type_: ComponentType, now: datetime
) -> Component:
    component = Component(id=new_id(), name=name, type=type_, created_at=as_utc(now))
    connection.execute(
        insert(schema.component).values(
            id=component.id, name=name, type=type_.value, created_at=component.created_at
        )
    )
    return component


_COMPONENT_BY_NAME = select(schema.component).where(
    schema.component.c.name == bindparam("name"), schema.component.c.type == bindparam("type")
)
_COMPONENT_BY_ID = select(schema.component).where(schema.component.c.id == bindparam("id"))


def get_component_by_name(connection: Connection, name: str, type_: ComponentType) -> Component:
    found = {"name": as_ref(name), "type": type_.value}
    return _component(connection, _COMPONENT_BY_NAME, found, f"{type_.value} component {name!r}")


def get_component(connection: Connection, component_id: str) -> Component:
    return _component(connection, _COMPONENT_BY_ID, {"id": component_id},
                      f"component {component_id!r}")


def _component(
    connection: Connection, statement: Any, parameters: dict[str, str], what: str
) -> Component:
    row = connection.execute(statement, parameters).mappings().first()
    if row is None:
        raise NotFound(f"no {what}")
    return Component.from_row(row)


_COMPONENTS = select(schema.component).order_by(
    by_code_point(schema.component.c.name), schema.component.c.type
)


def list_components(connection: Connection) -> list[Component]:
    rows = connection.execute(_COMPONENTS).mappings()
    return [Component.from_row(row) for row in rows]


def delete_component(connection: Connection, component_id: str) -> None:
    """Its policies go with it; a component that has requests cannot be deleted."""
    _delete(connection, schema.component, component_id, "component")


# Pools


def _pool_statements(where: ColumnElement[bool]) -> tuple[Select[Any], Select[Any]]:
    """The pools matching ``where``, and their capacity rows."""
    table, resource = schema.pool, schema.pool_resource
    statement = select(table).where(where).order_by(by_code_point(table.c.name))
    capacity = (
        select(resource.c.pool_id, resource.c.key, resource.c.total)
        .where(resource.c.pool_id.in_(statement.with_only_columns(table.c.id)))
        .order_by(resource.c.pool_id, by_code_point(resource.c.key))
    )
    return statement, capacity


_ALL_POOLS = _pool_statements(true())


def _pools(
    connection: Connection, statements: tuple[Select[Any], Select[Any]]
) -> list[Pool]:
    statement, capacity_statement = statements
    capacity = _amounts_by_owner(connection, capacity_statement)
    rows = connection.execute(statement).mappings()
    return [Pool.from_row(row, capacity.get(row["id"], {})) for row in rows]


def _write_capacity(connection: Connection, pool_id: str, capacity: Amounts) -> None:
    resource = schema.pool_resource
    connection.execute(delete(resource).where(resource.c.pool_id == pool_id))
    if capacity:
        connection.execute(
            insert(resource),
            [{"pool_id": pool_id, "key": key, "total": total} for key, total in capacity.items()],
        )


def insert_pool(
    connection: Connection,
    name: str,
    description: str | None,
    capacity: Amounts,
    now: datetime,
) -> Pool:
    now = as_utc(now)
    pool = Pool(
        id=new_id(),
        name=name,
        description=description,
        created_at=now,
        updated_at=now,
        capacity=dict(capacity),
    )
    connection.execute(
        insert(schema.pool).values(
            id=pool.id, name=name, description=description, created_at=now, updated_at=now
        )
    )
    _write_capacity(connection, pool.id, capacity)
    return pool


def get_pool(connection: Connection, ref: str) -> Pool:
    """The pool named ``ref``, else with id ``ref``, else whose id alone starts with ``ref``."""
    table = schema.pool
    pool_id = connection.scalar(select(table.c.id).where(table.c.name == as_ref(ref)))
    if pool_id is None:
        pool_id = resolve_id(connection, table, ref, "resource pool")
    return _pools(connection, _pool_statements(table.c.id == pool_id))[0]


def list_pools(connection: Connection) -> list[Pool]:
    """All pools, by name."""
    return _pools(connection, _ALL_POOLS)


def set_pool_capacity(
    connection: Connection, pool_id: str, capacity: Amounts, now: datetime
) -> None:
    """Replace the pool's whole capacity map."""
    _update(connection, schema.pool, pool_id, "resource pool", updated_at=now)
    _write_capacity(connection, pool_id, capacity)


def update_pool_description(
    connection: Connection, pool_id: str, description: str | None, now: datetime
) -> None:
    _update(connection, schema.pool, pool_id, "resource pool", description=description,
            updated_at=now)


def delete_pool(connection: Connection, pool_id: str) -> None:
    """Its capacity and policies go with it; its allocations keep ``pool_name``."""
    _delete(connection, schema.pool, pool_id, "resource pool")


# Policies


def _policy_statements(where: ColumnElement[bool]) -> tuple[Select[Any], Select[Any]]:
    """The policies matching ``where``, and their resource rows."""
    table, resource = schema.policy, schema.policy_resource
    statement = select(table).where(where).order_by(table.c.created_at, table.c.id)
    resources = (
        select(resource.c.policy_id, resource.c.key, resource.c.reserved, resource.c.limit)
        .where(resource.c.policy_id.in_(statement.with_only_columns(table.c.id)))
        .order_by(resource.c.policy_id, by_code_point(resource.c.key))
    )
    return statement, resources


_ALL_POLICIES = _policy_statements(true())


def _policies(
    connection: Connection, statements: tuple[Select[Any], Select[Any]]
) -> list[Policy]:
    statement, resources_statement = statements
    reserved: defaultdict[str, dict[str, int]] = defaultdict(dict)
    limit: defaultdict[str, dict[str, int]] = defaultdict(dict)
    resources = connection.execute(resources_statement)
    for policy_id, key, reserved_units, limit_units in resources:
        reserved[policy_id][key] = reserved_units
        if limit_units is not None:
            limit[policy_id][key] = limit_units
    rows = connection.execute(statement).mappings()
    return [
        Policy.from_row(row, reserved.get(row["id"], {}), limit.get(row["id"], {})) for row in rows
    ]


def _write_policy_resources(connection: Connection, policy: Policy) -> None:
    resource = schema.policy_resource
    connection.execute(delete(resource).where(resource.c.policy_id == policy.id))
    if policy.reserved:
        connection.execute(
            insert(resource),
            [
                {
                    "policy_id": policy.id,
                    "key": key,
                    "reserved": reserved,
                    "limit": policy.limit.get(key),
                }
                for key, reserved in policy.reserved.items()
            ],
        )


def _with_every_key(reserved: Amounts, limit: Amounts) -> dict[str, int]:
    """``reserved`` plus 0 for the keys only ``limit`` names: they share one row per key."""
    return {key: reserved.get(key, 0) for key in sorted(reserved.keys() | limit.keys())}


def insert_policy(
    connection: Connection,
    pool_id: str,
    component_id: str,
    priority: int,
    reserved: Amounts,
    limit: Amounts,
    now: datetime,
) -> Policy:
    """A key only in ``limit`` is stored (and read back) with 0 reserved."""
    now = as_utc(now)
    policy = Policy(
        id=new_id(),
        pool_id=pool_id,
        component_id=component_id,
        priority=priority,
        created_at=now,
        updated_at=now,
        reserved=_with_every_key(reserved, limit),
        limit=dict(limit),
    )
    connection.execute(
        insert(schema.policy).values(
            id=policy.id,
            pool_id=pool_id,
            component_id=component_id,
            priority=priority,
            created_at=now,
            updated_at=now,
        )
    )
    _write_policy_resources(connection, policy)
    return policy


def get_policy(connection: Connection, policy_id: str) -> Policy:
    policies = _policies(connection, _policy_statements(schema.policy.c.id == policy_id))
    if not policies:
        raise NotFound.of("policy", policy_id)
    return policies[0]


def update_policy(
    connection: Connection,
    policy_id: str,
    now: datetime,
    *,
    priority: int | None = None,
    reserved: Amounts | None = None,
    limit: Amounts | None = None,
) -> Policy:
    """Change what is given; ``reserved`` and ``limit`` each replace their whole map."""
    current = get_policy(connection, policy_id)
    new_limit = current.limit if limit is None else dict(limit)
    policy = replace(
        current,
        priority=current.priority if priority is None else priority,
        updated_at=as_utc(now),
        reserved=_with_every_key(current.reserved if reserved is None else reserved, new_limit),
        limit=new_limit,
    )
    _update(
        connection,
        schema.policy,
        policy_id,
        "policy",
        priority=policy.priority,
        updated_at=policy.updated_at,
    )
    _write_policy_resources(connection, policy)
    return policy


def delete_policy(connection: Connection, policy_id: str) -> None:
    _delete(connection, schema.policy, policy_id, "policy")


def list_policies(
    connection: Connection, pool_id: str | None = None, component_id: str | None = None
) -> list[Policy]:
    """Oldest first."""
    table = schema.policy
    if pool_id is None and component_id is None:
        return _policies(connection, _ALL_POLICIES)
    where: ColumnElement[bool] = true()
    if pool_id is not None:
        where = where & (table.c.pool_id == pool_id)
    if component_id is not None:
        where = where & (table.c.component_id == component_id)
    return _policies(connection, _policy_statements(where))


# Requests


def _demand_statement(statement: Select[Any]) -> Select[Any]:
    """The demand rows of the requests ``statement`` selects."""
    resource = schema.request_resource
    return (
        select(resource.c.request_id, resource.c.key, resource.c.amount)
        .where(resource.c.request_id.in_(statement.with_only_columns(schema.request.c.id)))
        .order_by(resource.c.request_id, by_code_point(resource.c.key))
    )


def _requests(
    connection: Connection,
    statement: Select[Any],
    demand_statement: Select[Any] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> list[Request]:
    """Requests selected by ``statement`` (over the request table), with their demand;
    a prebuilt statement comes with its prebuilt ``demand_statement`` and ``parameters``."""
    if demand_statement is None:
        demand_statement = _demand_statement(statement)
    demand = _amounts_by_owner(connection, demand_statement, parameters)
    rows = connection.execute(statement, parameters).mappings()
    return [Request.from_row(row, demand.get(row["id"], {})) for row in rows]


_REQUEST_BY_ID = select(schema.request).where(schema.request.c.id == bindparam("id"))
_REQUEST_BY_ID_DEMAND = _demand_statement(_REQUEST_BY_ID)
_QUEUE = (
    select(schema.request)
    .where(schema.request.c.status == RequestStatus.QUEUED.value)
    .order_by(schema.request.c.created_at, schema.request.c.id)
)
_QUEUE_DEMAND = _demand_statement(_QUEUE)
# By primary key: a join on the live allocations would scan every request ever made.
_REQUESTS_BY_ID = (
    select(schema.request)
    .where(schema.request.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(schema.request.c.created_at, schema.request.c.id)
)
_REQUESTS_BY_ID_DEMAND = (
    select(
        schema.request_resource.c.request_id,
        schema.request_resource.c.key,
        schema.request_resource.c.amount,
    )
    .where(schema.request_resource.c.request_id.in_(bindparam("ids", expanding=True)))
    .order_by(schema.request_resource.c.request_id, by_code_point(schema.request_resource.c.key))
)


_INSERT_REQUEST = Direct(insert(schema.request))
_INSERT_REQUEST_RESOURCE = Direct(insert(schema.request_resource))


def new_request(
    component_id: str,
    demand: Amounts,
    now: datetime,
    *,
    preemptible: bool,
    max_retries: int = 0,
    labels: Mapping[str, str] | None = None,
    attempt: int = 1,
    previous_attempt_id: str | None = None,
    lease_ttl: int | None = None,
    created_by_token_id: str | None = None,
) -> Request:
    """A new queued request, not written yet (``write_request``)."""
    now = as_utc(now)
    return Request(
        id=new_id(),
        component_id=component_id,
        status=RequestStatus.QUEUED,
        status_reason=None,
        preemptible=preemptible,
        max_retries=max_retries,
        attempt=attempt,
        previous_attempt_id=previous_attempt_id,
        preempted_by_id=None,
        labels=dict(labels or {}),
        created_at=now,
        updated_at=now,
        finished_at=None,
        demand=dict(demand),
        lease_ttl=lease_ttl,
        created_by_token_id=created_by_token_id,
    )


def write_request(
    connection: Connection, request: Request, idempotency_key: str | None = None
) -> None:
    """Insert a new request's row, as it stands (its status may already be decided), and its
    demand's."""
    _INSERT_REQUEST.execute(
        connection,
        {
            "id": request.id,
            "component_id": request.component_id,
            "status": request.status.value,
            "status_reason": request.status_reason,
            "preemptible": request.preemptible,
            "max_retries": request.max_retries,
            "attempt": request.attempt,
            "previous_attempt_id": request.previous_attempt_id,
            "preempted_by_id": request.preempted_by_id,
            "labels": request.labels,
            "created_at": request.created_at,
            "updated_at": request.updated_at,
            "finished_at": request.finished_at,
            "lease_ttl": request.lease_ttl,
            "created_by_token_id": request.created_by_token_id,
            "idempotency_key": idempotency_key,
        },
    )
    if request.demand:
        _INSERT_REQUEST_RESOURCE.execute_many(
            connection,
            [
                {"request_id": request.id, "key": key, "amount": amount}
                for key, amount in request.demand.items()
            ],
        )


def insert_request(
    connection: Connection,
    component_id: str,
    demand: Amounts,
    now: datetime,
    *,
    idempotency_key: str | None = None,
    **fields: Any,
) -> Request:
    """A new queued request, written; ``fields`` as ``new_request`` takes them."""
    request = new_request(component_id, demand, now, **fields)
    write_request(connection, request, idempotency_key)
    return request


def find_keyed(
    connection: Connection, table: Table, key: str
) -> tuple[str, str | None, str | None] | None:
    """The row of ``table`` (a workload, an operation, a config version) created with this
    idempotency key: its key (id, version), the digest of what it asked, and the token it was
    made with (None where the table records none)."""
    (ident,) = table.primary_key.columns
    owner = table.c.get("created_by_token_id")
    row = connection.execute(
        select(ident, table.c.idempotency_digest, *([] if owner is None else [owner]))
        .where(table.c.idempotency_key == key)
    ).one_or_none()
    if row is None:
        return None
    return str(row[0]), row[1], None if owner is None else row[2]


def keyed(idempotency: tuple[str, str] | None) -> dict[str, str | None]:
    """An insert's idempotency columns: the key and the digest of what was asked, or none."""
    key, digest = idempotency or (None, None)
    return {"idempotency_key": key, "idempotency_digest": digest}


def find_request_by_key(connection: Connection, key: str) -> str | None:
    """The id of the request created with this idempotency key, if any."""
    table = schema.request
    found: str | None = connection.scalar(
        select(table.c.id).where(table.c.idempotency_key == key)
    )
    return found


def get_request(connection: Connection, ref: str) -> Request:
    """The request with id ``ref``, else the one whose id alone starts with ``ref``."""
    table = schema.request
    found = _requests(connection, _REQUEST_BY_ID, _REQUEST_BY_ID_DEMAND,
                      {"id": as_ref(ref)})
    if found:  # the common case, a whole id: no separate lookup
        return found[0]
    request_id = resolve_id(connection, table, ref, "request")
    return _requests(connection, select(table).where(table.c.id == request_id))[0]


_REQUEST_STATUS = Direct(
    select(schema.request.c.status).where(schema.request.c.id == bindparam("id"))
)


def _leases_run_out(now: datetime) -> Select[tuple[str]]:
    """The live allocations whose lease ran out before ``now``."""
    table = schema.allocation
    return select(table.c.request_id).where(
        table.c.released_at.is_(None), table.c.lease_expires_at < as_utc(now)
    )


def lease_expired(connection: Connection, now: datetime) -> bool:
    """Whether a live allocation's lease ran out before ``now``: one statement."""
    return connection.execute(_leases_run_out(now).limit(1)).first() is not None


def pass_due(connection: Connection, now: datetime) -> bool:
    """Whether a pass could change anything at ``now``: a request waits (what a pass decides
    for it depends on time too: backfill), or a live allocation's lease ran out. One
    statement."""
    request = schema.request
    waiting = select(request.c.id).where(request.c.status == RequestStatus.QUEUED.value)
    return bool(connection.execute(
        select(waiting.exists() | _leases_run_out(now).exists())
    ).scalar())


def request_status(connection: Connection, request_id: str) -> RequestStatus | None:
    """The status of the request whose id is ``request_id`` (a whole id, not a prefix); None
    if there is none. One statement, without the request's demand: a long-poll asks it
    first, and most requests it asks of still wait."""
    status = _REQUEST_STATUS.scalar(connection, {"id": request_id})
    return None if status is None else RequestStatus(status)


async def request_status_async(db: Database, request_id: str) -> RequestStatus | None:
    """``request_status`` on an event loop, on PostgreSQL (``Database.scalar_async``)."""
    status = await db.scalar_async(_REQUEST_STATUS, {"id": request_id})
    return None if status is None else RequestStatus(status)


#: What a submitter token owns: the rows it submitted (``created_by_token_id``), by the name
#: messages give them.
OWNED: dict[str, Table] = {
    "request": schema.request,
    "workload": schema.workload,
    "operation": schema.tree_operation,
}


def resolve_own(connection: Connection, what: str, ref: str, token_id: str) -> str:
    """The id of the ``what`` (``OWNED``) submitted with token ``token_id`` whose id is, or
    else alone starts with, ``ref``; others are not found, nor counted as ambiguous."""
    table = OWNED[what]
    return resolve_id(
        connection, table, ref, what, among=table.c.created_by_token_id == token_id
    )


def created_by(
    connection: Connection, what: str, token_id: str, ids: Sequence[str]
) -> set[str]:
    """Those of ``ids`` (of ``what``, ``OWNED``) submitted with token ``token_id``."""
    table = OWNED[what]
    return _ids_where(connection, table, ids, table.c.created_by_token_id == token_id)


def others_of(
    connection: Connection, what: str, token_id: str, ids: Sequence[str]
) -> set[str]:
    """Those of ``ids`` that are rows of ``what`` (``OWNED``) not submitted with token
    ``token_id`` (any other id is none of them)."""
    table = OWNED[what]
    return _ids_where(
        connection, table, ids, table.c.created_by_token_id.is_distinct_from(token_id)
    )


def _ids_where(
    connection: Connection, table: Table, ids: Sequence[str], condition: ColumnElement[bool]
) -> set[str]:
    found: set[str] = set()
    for batch in batches(ids):
        found.update(connection.scalars(select(table.c.id).where(table.c.id.in_(batch), condition)))
    return found


def request_page(
    connection: Connection,
    *,
    status: RequestStatus | None = None,
    component_ids: Collection[str] | None = None,
    pool_name: str | None = None,
    queued_there: Collection[str] = (),
    created_by: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    after: Cursor | None = None,
) -> tuple[list[str], int, Cursor | None]:
    """The ids of requests ``offset`` to ``offset + limit`` (None: to the end) of those the
    filters match after ``after``, oldest first (created_at, id), how many they match, and
    the page's cursor: the database filters, counts and pages (``page_of``).
    ``pool_name``: allocated there (by the name, which outlives the pool), or one of
    ``queued_there``: where a queued request waits is the engine's to say."""
    table, allocation = schema.request, schema.allocation
    where: list[ColumnElement[bool]] = []
    if status is not None:
        where.append(table.c.status == status.value)
    if component_ids is not None:  # a name's components, one per type
        where.append(table.c.component_id.in_(list(component_ids)))
    if created_by is not None:
        where.append(table.c.created_by_token_id == created_by)
    if pool_name is not None:
        allocated_there = exists().where(
            allocation.c.request_id == table.c.id, allocation.c.pool_name == pool_name
        )
        # Written into the statement: a queue may be longer than a statement's parameters.
        waiting: BindParameter[list[str]] = bindparam(
            "queued_there", list(queued_there), expanding=True, literal_execute=True
        )
        where.append(allocated_there | table.c.id.in_(waiting))
    statement = select(table.c.id, table.c.created_at).where(*where)
    rows, total, cursor = page_of(
        connection, statement, (table.c.created_at, table.c.id), limit, offset, after
    )
    return [row["id"] for row in rows], total, cursor


def page_of(
    connection: Connection,
    statement: Select[Any],
    order: tuple[Column[datetime], Column[str]],
    limit: int | None,
    offset: int,
    after: Cursor | None = None,
) -> tuple[list[RowMapping], int, Cursor | None]:
    """Rows ``offset`` to ``offset + limit`` (None: to the end) of ``statement`` in
    ``order`` (a time, then an id; its own order is dropped), of those after ``after`` if
    given; how many it has in all; and the cursor of the page's end while more rows
    follow: a page costs what it holds, not every row ever written."""
    at, id_ = order
    statement = statement.order_by(None)
    total = connection.execute(select(func.count()).select_from(statement.subquery())).scalar_one()
    if after is not None:
        # Bound as the columns are: SQLite compares the time as the text it stores.
        after_row = tuple_(literal(after.at, at.type), literal(after.id, id_.type))
        statement = statement.where(tuple_(at, id_) > after_row)
    statement = statement.order_by(at, id_).offset(offset)
    if limit is None:
        return list(connection.execute(statement).mappings()), total, None
    rows = list(connection.execute(statement.limit(limit + 1)).mappings())
    if len(rows) <= limit:
        return rows, total, None
    del rows[limit:]  # the one more said that more follow
    return rows, total, Cursor(rows[-1][at.key], rows[-1][id_.key])


def requests_by_id(connection: Connection, request_ids: Sequence[str]) -> list[Request]:
    """Those of the requests ``request_ids`` that exist, in queue order; two queries per
    ``_BATCH`` ids."""
    found: list[Request] = []
    for batch in batches(request_ids):
        found += _requests(connection, _REQUESTS_BY_ID, _REQUESTS_BY_ID_DEMAND, {"ids": batch})
    if len(request_ids) > _BATCH:
        found.sort(key=lambda request: (request.created_at, request.id))
    return found


def queued_requests(connection: Connection) -> list[Request]:
    """The whole queue, in order; two queries however long it is."""
    return _requests(connection, _QUEUE, _QUEUE_DEMAND)


def set_request_status(
    connection: Connection,
    request_id: str,
    status: RequestStatus,
    reason: str | None,
    now: datetime,
    preempted_by_id: str | None = None,
) -> None:
    """Move the request to ``status``; a final status also sets ``finished_at``."""
    _update(
        connection,
        schema.request,
        request_id,
        "request",
        status=status.value,
        status_reason=reason,
        preempted_by_id=preempted_by_id,
        updated_at=now,
        finished_at=now if status.is_final else None,
    )


def with_status(
    request: Request,
    status: RequestStatus,
    reason: str | None,
    now: datetime,
    preempted_by_id: str | None = None,
) -> Request:
    """``request`` as ``set_request_status`` leaves its row (for state kept in memory)."""
    now = as_utc(now)
    return replace(
        request,
        status=status,
        status_reason=reason,
        preempted_by_id=preempted_by_id,
        updated_at=now,
        finished_at=now if status.is_final else None,
    )


def set_request_reason(
    connection: Connection, request_id: str, reason: str | None, now: datetime
) -> None:
    """Explain the current status anew (e.g. why a request still waits)."""
    _update(connection, schema.request, request_id, "request", status_reason=reason, updated_at=now)


def with_reason(request: Request, reason: str | None, now: datetime) -> Request:
    """``request`` as ``set_request_reason`` leaves its row."""
    return replace(request, status_reason=reason, updated_at=as_utc(now))


def allocation_and_retry(
    connection: Connection, request_id: str
) -> tuple[Allocation | None, str | None]:
    """In one query: the request's allocation (live or released, None if it never had one)
    and the id of the request that retries it (None if none was made)."""
    row = connection.execute(_ALLOCATION_AND_RETRY, {"id": request_id}).mappings().first()
    return _allocation_and_retry(row) if row is not None else (None, None)


def allocations_and_retries(
    connection: Connection, request_ids: Sequence[str]
) -> dict[str, tuple[Allocation | None, str | None]]:
    """``allocation_and_retry`` of each of ``request_ids`` that exists; a query per
    ``_BATCH`` ids."""
    found: dict[str, tuple[Allocation | None, str | None]] = {}
    for batch in batches(request_ids):
        for row in connection.execute(_ALLOCATIONS_AND_RETRIES, {"ids": batch}).mappings():
            found[row["id"]] = _allocation_and_retry(row)
    return found


def _allocation_and_retry(row: RowMapping) -> tuple[Allocation | None, str | None]:
    held = Allocation.from_row(row) if row["request_id"] is not None else None
    return held, row["retried_as_id"]


def _allocation_and_retry_statement(which: ColumnElement[bool]) -> Select[Any]:
    allocation, retry = schema.allocation, schema.request.alias("retry")
    request = schema.request
    return (
        select(request.c.id, allocation, retry.c.id.label("retried_as_id"))
        .select_from(
            request.outerjoin(allocation, allocation.c.request_id == request.c.id).outerjoin(
                retry, retry.c.previous_attempt_id == request.c.id
            )
        )
        .where(which)
    )


# One request by key on the hot path (a plain parameter, no list to expand); pages in batches.
_ALLOCATION_AND_RETRY = _allocation_and_retry_statement(schema.request.c.id == bindparam("id"))
_ALLOCATIONS_AND_RETRIES = _allocation_and_retry_statement(
    schema.request.c.id.in_(bindparam("ids", expanding=True))
)


def delete_request(connection: Connection, request_id: str) -> None:
    """Its demand and allocation go with it; retries and preemptees lose the link."""
    _delete(connection, schema.request, request_id, "request")


# Allocations


_INSERT_ALLOCATION = Direct(insert(schema.allocation))
# Updates of a request's live allocation; the SET clause comes from the parameters' names.
_UPDATE_LIVE_ALLOCATION = Direct(
    update(schema.allocation).where(
        schema.allocation.c.request_id == bindparam("_request_id"),
        schema.allocation.c.released_at.is_(None),
    )
)


def insert_allocation(
    connection: Connection,
    request_id: str,
    pool_id: str,
    policy_id: str | None,
    pool_name: str,
    priority: int,
    now: datetime,
    lease_expires_at: datetime | None = None,
) -> Allocation:
    allocation = Allocation(
        request_id=request_id,
        pool_id=pool_id,
        policy_id=policy_id,
        pool_name=pool_name,
        priority=priority,
        allocated_at=as_utc(now),
        released_at=None,
        lease_expires_at=as_utc(lease_expires_at) if lease_expires_at else None,
    )
    _INSERT_ALLOCATION.execute(
        connection,
        {
            "request_id": request_id,
            "pool_id": pool_id,
            "policy_id": policy_id,
            "pool_name": pool_name,
            "priority": priority,
            "allocated_at": allocation.allocated_at,
            "lease_expires_at": allocation.lease_expires_at,
        },
    )
    return allocation


def renew_lease(connection: Connection, request_id: str, expires_at: datetime) -> None:
    """Push a live allocation's lease out to ``expires_at``."""
    _UPDATE_LIVE_ALLOCATION.execute(
        connection,
        {"_request_id": request_id, "lease_expires_at": as_utc(expires_at)},
        must_change=("live allocation for request", request_id),
    )


def release_allocation(connection: Connection, request_id: str, now: datetime) -> None:
    """Give the request's units back; NotFound unless it holds a live allocation."""
    _UPDATE_LIVE_ALLOCATION.execute(
        connection,
        {"_request_id": request_id, "released_at": as_utc(now)},
        must_change=("live allocation for request", request_id),
    )


def reprioritize_allocations(connection: Connection, policy_id: str, priority: int) -> None:
    """The live allocations of a policy whose priority changed take the new one: preemption
    compares it with a waiter's (a copy kept from the grant made a component's own waiter
    outrank its running work, priority 9 > 2, once its policy was raised)."""
    table = schema.allocation
    connection.execute(
        update(table)
        .where(table.c.policy_id == policy_id, table.c.released_at.is_(None))
        .values(priority=priority)
    )


_LIVE_ALLOCATIONS = (
    select(schema.allocation)
    .where(schema.allocation.c.released_at.is_(None))
    .order_by(schema.allocation.c.allocated_at, schema.allocation.c.request_id)
)


def live_allocations(connection: Connection, pool_id: str | None = None) -> list[Allocation]:
    """Allocations still holding units, oldest first."""
    table = schema.allocation
    statement = _LIVE_ALLOCATIONS
    if pool_id is not None:
        statement = statement.where(table.c.pool_id == pool_id)
    return [Allocation.from_row(row) for row in connection.execute(statement).mappings()]


# Events


# inline(): PostgreSQL would send back each new id, which nobody reads.
_INSERT_EVENT = Direct(insert(schema.event).inline())


#: An event to insert (``event_row``); the database numbers it.
EventRow = dict[str, Any]


def event_row(
    kind: str,
    message: str,
    now: datetime,
    request_id: str | None = None,
    pool_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> EventRow:
    return {"at": as_utc(now), "kind": kind, "request_id": request_id, "pool_id": pool_id,
            "message": message, "data": dict(data or {})}


def insert_events(connection: Connection, events: Sequence[EventRow]) -> None:
    """Append ``events`` to the log, numbered in this order; one statement for all."""
    if events:
        _INSERT_EVENT.execute_many(connection, events)


def list_events(
    connection: Connection, request_id: str | None = None, limit: int | None = None
) -> list[Event]:
    """The latest ``limit`` events (all if None), oldest first."""
    table = schema.event
    statement = select(table).order_by(table.c.id.desc()).limit(limit)
    if request_id is not None:
        statement = statement.where(table.c.request_id == request_id)
    rows = connection.execute(statement).mappings().all()
    return [Event.from_row(row) for row in reversed(rows)]


def request_events(connection: Connection, ref: str) -> tuple[str, list[Event]]:
    """The id of request ``ref`` and its events, oldest first. The log outlives the request:
    a deleted one's are found by its whole id."""
    ref = as_ref(ref)
    try:
        request_id = resolve_id(connection, schema.request, ref, "request")
    except NotFound:
        if events := list_events(connection, request_id=ref.lower()):  # ids are lower case
            return ref.lower(), events
        raise
    return request_id, list_events(connection, request_id=request_id)


def pool_names(connection: Connection, pool_ids: Collection[str]) -> dict[str, str]:
    """The names of those of ``pool_ids`` that still exist, by id."""
    table = schema.pool
    rows = connection.execute(select(table.c.id, table.c.name).where(table.c.id.in_(pool_ids)))
    return {row.id: row.name for row in rows}


# API tokens


def insert_token(
    connection: Connection,
    name: str | None,
    role: TokenRole,
    components: Sequence[str],
    prefix: str,
    secret_hash: str,
    now: datetime,
) -> ApiToken:
    token = ApiToken(
        id=new_id(),
        name=name,
        role=role,
        components=tuple(components),
        prefix=prefix,
        secret_hash=secret_hash,
        created_at=as_utc(now),
        revoked_at=None,
    )
    connection.execute(
        insert(schema.api_token).values(
            id=token.id,
            name=name,
            role=role.value,
            components=list(token.components),
            prefix=prefix,
            secret_hash=secret_hash,
            created_at=token.created_at,
        )
    )
    return token


def get_token(connection: Connection, ref: str) -> ApiToken:
    """The token with id ``ref``, else the one whose id alone starts with ``ref``."""
    table = schema.api_token
    token_id = resolve_id(connection, table, ref, "token")
    row = connection.execute(select(table).where(table.c.id == token_id)).mappings().one()
    return ApiToken.from_row(row)


def token_by_prefix(connection: Connection, shown: str) -> ApiToken:
    """The one token whose secret starts with ``shown`` (at most its kept prefix)."""
    table = schema.api_token
    rows = connection.execute(
        # Not LIKE: SQLite's ignores case, and a secret's characters are case-sensitive.
        select(table).where(func.substr(table.c.prefix, 1, len(shown)) == shown).limit(2)
    ).mappings().all()
    if len(rows) > 1:
        raise AmbiguousReference(f"token prefix {shown!r} {AmbiguousReference.ENDING}")
    if not rows:
        raise NotFound(f"no token whose secret starts with {shown!r}")
    return ApiToken.from_row(rows[0])


def token_by_hash(connection: Connection, secret_hash: str) -> ApiToken | None:
    """The token whose secret hashes to ``secret_hash``, revoked or not."""
    table = schema.api_token
    row = connection.execute(
        select(table).where(table.c.secret_hash == secret_hash)
    ).mappings().first()
    return None if row is None else ApiToken.from_row(row)


def list_tokens(connection: Connection) -> list[ApiToken]:
    """Oldest first."""
    table = schema.api_token
    rows = connection.execute(select(table).order_by(table.c.created_at, table.c.id)).mappings()
    return [ApiToken.from_row(row) for row in rows]


def revoke_token(connection: Connection, token_id: str, now: datetime) -> None:
    _update(connection, schema.api_token, token_id, "token", revoked_at=as_utc(now))


# Retention (``fairpool.retention``)


def finished_before(table: Table, before: datetime) -> ColumnElement[bool]:
    """Rows of ``table`` (request, workload, tree_operation) that ended before ``before``:
    only a final status sets ``finished_at``. A request, only once every later attempt of
    its chain ended before it too: a holder told of a preemption follows ``retried_as_id``
    from the attempt it held, hop by hop, and a slow holder may still hold the first of
    several (helper-77: the chain's first attempt pruned under its holder, the live third
    attempt was held by nobody until its lease ran out)."""
    ended = table.c.finished_at < before
    if table is not schema.request:
        return ended
    live = table.alias("live")
    earlier = table.alias("earlier")
    # The attempts before one that lives on, walked back from the few that do.
    kept = select(live.c.previous_attempt_id.label("id")).where(
        live.c.previous_attempt_id.is_not(None),
        live.c.finished_at.is_(None) | (live.c.finished_at >= before),
    ).cte("kept_attempts", recursive=True)
    kept = kept.union(select(earlier.c.previous_attempt_id).where(
        earlier.c.id == kept.c.id, earlier.c.previous_attempt_id.is_not(None)))
    # NOT EXISTS, an anti-join: PostgreSQL ran NOT IN as a scan of the kept list per row
    # (20k requests: 7 s a dry run, 0.04 s before the chains; helper-82).
    return ended & ~exists().where(kept.c.id == table.c.id)


def ids_where(
    connection: Connection, table: Table, where: ColumnElement[bool], limit: int
) -> list[Any]:
    """The ids of up to ``limit`` rows of ``table`` matching ``where``."""
    return list(connection.scalars(select(table.c.id).where(where).limit(limit)))


def delete_ids(connection: Connection, table: Table, ids: Sequence[Any]) -> int:
    """How many of ``ids`` were still there to delete."""
    return connection.execute(delete(table).where(table.c.id.in_(list(ids)))).rowcount


def count_where(connection: Connection, table: Table, where: ColumnElement[bool]) -> int:
    return int(connection.execute(select(func.count()).select_from(table).where(where))
               .scalar_one())


def stale_events(before: datetime, requests_gone: ColumnElement[bool] | None = None
                 ) -> ColumnElement[bool]:
    """Events from before ``before`` whose request is gone (deleted, or ``requests_gone``:
    about to be), or that name none (no request has a NULL id): a live request's history is
    kept whatever its age."""
    event, request = schema.event, schema.request
    gone = ~exists().where(request.c.id == event.c.request_id)
    if requests_gone is not None:
        gone = gone | event.c.request_id.in_(select(request.c.id).where(requests_gone))
    return (event.c.at < before) & gone
