"""Queries of the pool-tree front-end (seed 003): nodes, trees, pools, operations, jobs.

Like ``repo``: plain functions on the caller's transaction, returning frozen records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, Select, delete, func, insert, select, update

from fairpool.errors import NotFound, as_ref
from fairpool.ids import new_id
from fairpool.paging import Cursor
from fairpool.store import schema
from fairpool.store.direct import check_found
from fairpool.store.repo import batches, keyed, page_of, resolve_id
from fairpool.store.schema import as_utc, by_code_point
from fairpool.store.tree_records import (
    IntegralRecord,
    JobRecord,
    JobStatus,
    NodeRecord,
    OperationRecord,
    OperationStatus,
    PlacementRecord,
    PoolTreeRecord,
    TreePoolRecord,
)

# -- nodes -------------------------------------------------------------------------------------


def insert_node(
    connection: Connection, name: str, tags: Iterable[str], resources: Mapping[str, int],
    now: datetime,
) -> None:
    connection.execute(insert(schema.cluster_node).values(
        name=name, tags=sorted(tags), resources=dict(resources), created_at=as_utc(now)
    ))


def list_nodes(connection: Connection) -> list[NodeRecord]:
    table = schema.cluster_node
    rows = connection.execute(select(table).order_by(by_code_point(table.c.name))).mappings()
    return [NodeRecord.from_row(row) for row in rows]


def find_node(connection: Connection, name: str) -> NodeRecord | None:
    as_ref(name)
    table = schema.cluster_node
    row = connection.execute(select(table).where(table.c.name == name)).mappings().first()
    return None if row is None else NodeRecord.from_row(row)


def delete_node(connection: Connection, name: str) -> None:
    table = schema.cluster_node
    result = connection.execute(delete(table).where(table.c.name == name))
    check_found(result.rowcount, "node", name)


def mark_preemption(connection: Connection, names: Sequence[str], now: datetime) -> None:
    table = schema.cluster_node
    if names:
        connection.execute(
            update(table).where(table.c.name.in_(names)).values(last_preemption_at=as_utc(now))
        )


# -- trees -------------------------------------------------------------------------------------


def insert_tree(
    connection: Connection, name: str, config: Mapping[str, Any], now: datetime
) -> None:
    now = as_utc(now)
    connection.execute(insert(schema.pool_tree).values(
        name=name, config=dict(config), created_at=now, updated_at=now
    ))


def set_tree_config(
    connection: Connection, name: str, config: Mapping[str, Any], now: datetime
) -> None:
    table = schema.pool_tree
    result = connection.execute(
        update(table).where(table.c.name == name).values(
            config=dict(config), updated_at=as_utc(now)
        )
    )
    check_found(result.rowcount, "pool tree", name)


def delete_tree(connection: Connection, name: str, pools_children_first: Sequence[str]) -> None:
    """Delete tree ``name``, its pools and its ended operations' history in it (jobs and
    placements; an operation that ran only here goes whole). The caller has made sure no live
    operation is placed in it."""
    placement, operation = schema.tree_operation_placement, schema.tree_operation
    elsewhere = select(placement.c.operation_id).where(placement.c.tree != name)
    only_here = select(placement.c.operation_id).where(
        placement.c.tree == name, placement.c.operation_id.not_in(elsewhere)
    )
    connection.execute(delete(operation).where(operation.c.id.in_(only_here)))
    connection.execute(delete(placement).where(placement.c.tree == name))  # jobs: cascade
    pool = schema.tree_pool
    for pool_name in pools_children_first:  # a parent is RESTRICTed while it has children
        connection.execute(delete(pool).where(pool.c.tree == name, pool.c.name == pool_name))
    table = schema.pool_tree
    result = connection.execute(delete(table).where(table.c.name == name))  # default: cascade
    check_found(result.rowcount, "pool tree", name)


def find_tree(connection: Connection, name: str) -> PoolTreeRecord | None:
    as_ref(name)
    table = schema.pool_tree
    row = connection.execute(select(table).where(table.c.name == name)).mappings().first()
    return None if row is None else PoolTreeRecord.from_row(row)


def list_trees(connection: Connection) -> list[PoolTreeRecord]:
    table = schema.pool_tree
    rows = connection.execute(select(table).order_by(by_code_point(table.c.name))).mappings()
    return [PoolTreeRecord.from_row(row) for row in rows]


def default_tree(connection: Connection) -> str | None:
    return connection.scalar(select(schema.pool_tree_default.c.tree))


def set_default_tree(connection: Connection, name: str) -> None:
    table = schema.pool_tree_default
    connection.execute(delete(table))
    connection.execute(insert(table).values(id=1, tree=name))


# -- pools -------------------------------------------------------------------------------------


def list_pools(connection: Connection, tree: str) -> list[TreePoolRecord]:
    table = schema.tree_pool
    rows = connection.execute(
        select(table).where(table.c.tree == tree).order_by(by_code_point(table.c.name))
    ).mappings()
    return [TreePoolRecord.from_row(row) for row in rows]


def save_pool(
    connection: Connection,
    tree: str,
    name: str,
    parent: str | None,
    config: Mapping[str, Any],
    now: datetime,
    ephemeral_user: str | None = None,
) -> None:
    """Insert the pool, or replace its parent and options."""
    table = schema.tree_pool
    now = as_utc(now)
    values = {"parent": parent, "config": dict(config), "updated_at": now}
    result = connection.execute(
        update(table).where(table.c.tree == tree, table.c.name == name).values(**values)
    )
    if result.rowcount == 0:
        connection.execute(insert(table).values(
            tree=tree, name=name, ephemeral_user=ephemeral_user, created_at=now, **values
        ))


def keep_pool(connection: Connection, tree: str, name: str) -> None:
    """An ephemeral pool made a declared one: it no longer goes with its last operation."""
    table = schema.tree_pool
    connection.execute(
        update(table).where(table.c.tree == tree, table.c.name == name).values(ephemeral_user=None)
    )


def delete_pool(connection: Connection, tree: str, name: str) -> None:
    table = schema.tree_pool
    result = connection.execute(delete(table).where(table.c.tree == tree, table.c.name == name))
    check_found(result.rowcount, "pool", name)


def set_pool_since(
    connection: Connection, tree: str, name: str, since: datetime | None
) -> None:
    table = schema.tree_pool
    connection.execute(
        update(table).where(table.c.tree == tree, table.c.name == name).values(
            below_fair_share_since=since
        )
    )


def set_pool_integral(
    connection: Connection, tree: str, name: str, state: IntegralRecord | None
) -> None:
    """Store an integral pool's volume and share ratio (None: clear them)."""
    table = schema.tree_pool
    values: dict[str, Any] = {
        "integral_volume": None, "integral_share_ratio": None, "integral_updated_at": None,
    }
    if state is not None:
        values = {
            "integral_volume": {key: str(amount) for key, amount in state.volume.items()},
            "integral_share_ratio": str(state.share_ratio),
            "integral_updated_at": as_utc(state.updated_at),
        }
    connection.execute(
        update(table).where(table.c.tree == tree, table.c.name == name).values(**values)
    )


# -- operations --------------------------------------------------------------------------------

LIVE = (OperationStatus.PENDING, OperationStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class Placement:
    """What an operation asks for in one pool tree."""

    tree: str
    pool: str
    weight: str
    resource_limits: Mapping[str, int]


def insert_operation(
    connection: Connection,
    *,
    user: str,
    job_resources: Mapping[str, int],
    job_count: int,
    gang: bool,
    interruptible: bool,
    placements: Sequence[Placement],
    now: datetime,
    created_by: str | None = None,
    idempotency: tuple[str, str] | None = None,
) -> str:
    """A new pending operation in ``placements``' trees; the passes that follow decide
    whether (and where) it runs. ``created_by``: the API token it was started with;
    ``idempotency``: the key it was started with and the digest of what it asked."""
    now = as_utc(now)
    operation_id = new_id()
    connection.execute(insert(schema.tree_operation).values(
        id=operation_id, user_name=user, job_resources=dict(job_resources),
        job_count=job_count, gang=gang, interruptible=interruptible,
        status=OperationStatus.PENDING.value, created_at=now, updated_at=now,
        created_by_token_id=created_by, **keyed(idempotency),
    ))
    connection.execute(insert(schema.tree_operation_placement), [
        {"operation_id": operation_id, "tree": p.tree, "position": position, "pool": p.pool,
         "weight": p.weight, "resource_limits": dict(p.resource_limits), "running": False}
        for position, p in enumerate(placements)
    ])
    return operation_id


def _with_placements(
    connection: Connection, rows: Sequence[RowMapping]
) -> list[OperationRecord]:
    """Operation records for ``rows``, each with its placements (a query per batch)."""
    table = schema.tree_operation_placement
    placements: dict[str, list[PlacementRecord]] = {row["id"]: [] for row in rows}
    for batch in batches(list(placements)):
        found = connection.execute(select(table).where(table.c.operation_id.in_(batch)))
        for row in found.mappings():
            placements[row["operation_id"]].append(PlacementRecord.from_row(row))
    return [OperationRecord.from_row(row, placements[row["id"]]) for row in rows]


def get_operation(connection: Connection, ref: str) -> OperationRecord:
    """The operation with id ``ref``, else the one whose id alone starts with ``ref``."""
    table = schema.tree_operation
    operation_id = resolve_id(connection, table, ref, "operation")
    row = connection.execute(select(table).where(table.c.id == operation_id)).mappings().one()
    return _with_placements(connection, [row])[0]


def list_operations(
    connection: Connection,
    tree: str | None = None,
    statuses: Iterable[OperationStatus] | None = None,
) -> list[OperationRecord]:
    """Operations in start order, optionally of one tree / in ``statuses``."""
    rows = list(connection.execute(_operations(tree, statuses)).mappings())
    return _with_placements(connection, rows)


def operation_page(
    connection: Connection,
    tree: str | None = None,
    statuses: Iterable[OperationStatus] | None = None,
    created_by: str | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
    after: Cursor | None = None,
) -> tuple[list[OperationRecord], int, Cursor | None]:
    """``list_operations``' ``offset`` to ``offset + limit`` (None: to the end) after
    ``after``, only those started with token ``created_by`` if given, how many match, and
    the page's cursor (``page_of``)."""
    table = schema.tree_operation
    rows, total, cursor = page_of(
        connection, _operations(tree, statuses, created_by),
        (table.c.created_at, table.c.id), limit, offset, after,
    )
    return _with_placements(connection, rows), total, cursor


def _operations(
    tree: str | None, statuses: Iterable[OperationStatus] | None, created_by: str | None = None
) -> Select[Any]:
    table = schema.tree_operation
    statement = select(table).order_by(table.c.created_at, table.c.id)
    if tree is not None:
        placement = schema.tree_operation_placement
        statement = statement.where(table.c.id.in_(
            select(placement.c.operation_id).where(placement.c.tree == tree)
        ))
    if statuses is not None:
        statement = statement.where(table.c.status.in_([s.value for s in statuses]))
    if created_by is not None:
        statement = statement.where(table.c.created_by_token_id == created_by)
    return statement


def update_operation(
    connection: Connection, operation_id: str, now: datetime, **values: Any
) -> None:
    """Set columns of one operation (and its ``updated_at``)."""
    table = schema.tree_operation
    status = values.get("status")
    if isinstance(status, OperationStatus):
        if status.is_final:
            values.setdefault("finished_at", as_utc(now))
        values["status"] = status.value
    result = connection.execute(
        update(table).where(table.c.id == operation_id).values(updated_at=as_utc(now), **values)
    )
    if result.rowcount == 0:
        raise NotFound.of("operation", operation_id)


def update_placement(
    connection: Connection, operation_id: str, tree: str, **values: Any
) -> None:
    """Set columns of an operation's placement in ``tree``."""
    table = schema.tree_operation_placement
    connection.execute(
        update(table)
        .where(table.c.operation_id == operation_id, table.c.tree == tree)
        .values(**values)
    )


def count_live_operations(connection: Connection, tree: str) -> dict[str, int]:
    """Started (pending + running) operations per pool name of ``tree``."""
    table, placement = schema.tree_operation, schema.tree_operation_placement
    rows = connection.execute(
        select(placement.c.pool, func.count())
        .join(table, table.c.id == placement.c.operation_id)
        .where(placement.c.tree == tree, table.c.status.in_([s.value for s in LIVE]))
        .group_by(placement.c.pool)
    )
    return {pool: count for pool, count in rows}


def time_acts_on(connection: Connection, tree: str) -> bool:
    """Whether time alone can change a decision in ``tree``: a started operation waits
    there (its placement pending, or with a reason: jobs pending; starvation clocks run for
    those only), one of its jobs there is being interrupted (a deadline), or a pool has
    integral guarantees (its volume is refilled and consumed at a share that depends on the
    volume: one pass over a long gap drained what a pass a second kept; helper-82)."""
    table, placement, job, pool = (
        schema.tree_operation, schema.tree_operation_placement, schema.tree_job,
        schema.tree_pool,
    )
    live = select(placement.c.operation_id).join(
        table, table.c.id == placement.c.operation_id
    ).where(placement.c.tree == tree, table.c.status.in_([s.value for s in LIVE]))
    waiting = live.where(~placement.c.running | placement.c.reason.is_not(None))
    interrupted = select(job.c.id).where(
        job.c.operation_id.in_(live), job.c.tree == tree,
        job.c.status == JobStatus.INTERRUPTING.value,
    )
    integral = select(pool.c.name).where(
        pool.c.tree == tree, pool.c.integral_updated_at.is_not(None)
    )
    return bool(connection.scalar(
        select(waiting.exists() | interrupted.exists() | integral.exists())
    ))


# -- jobs --------------------------------------------------------------------------------------


def insert_jobs(
    connection: Connection, tree: str, grants: Sequence[tuple[str, str]], now: datetime
) -> None:
    """Running jobs in ``tree``, one per ``(operation id, node)``."""
    if grants:
        connection.execute(insert(schema.tree_job), [
            {"id": new_id(), "operation_id": operation_id, "node": node, "tree": tree,
             "status": JobStatus.RUNNING.value, "started_at": as_utc(now)}
            for operation_id, node in grants
        ])


#: Jobs whose units are in use.
LIVE_JOBS = tuple(status.value for status in JobStatus if status.is_live)


def jobs_of(
    connection: Connection, operation_ids: Sequence[str], live: bool = False
) -> list[JobRecord]:
    """Jobs of these operations in start order (only those whose units are in use when
    ``live``)."""
    table = schema.tree_job
    jobs: list[JobRecord] = []
    for batch in batches(operation_ids):
        statement = select(table).where(table.c.operation_id.in_(batch))
        if live:
            statement = statement.where(table.c.status.in_(LIVE_JOBS))
        jobs.extend(JobRecord.from_row(row) for row in connection.execute(statement).mappings())
    return sorted(jobs, key=lambda job: (job.started_at, job.id))


def live_jobs_on(connection: Connection, node: str) -> int:
    """Jobs holding units on ``node`` (running or being interrupted)."""
    table = schema.tree_job
    return int(connection.scalar(
        select(func.count()).where(table.c.node == node, table.c.status.in_(LIVE_JOBS))
    ) or 0)


def live_job_trees(connection: Connection) -> dict[str, dict[str, int]]:
    """Per node, per tree: the jobs holding units there."""
    table = schema.tree_job
    rows = connection.execute(
        select(table.c.node, table.c.tree, func.count())
        .where(table.c.status.in_(LIVE_JOBS))
        .group_by(table.c.node, table.c.tree)
    )
    found: dict[str, dict[str, int]] = {}
    for node, tree, count in rows:
        found.setdefault(node, {})[tree] = int(count)
    return found


def preempt_job(
    connection: Connection,
    job_id: str,
    preemptor: str | None,
    reason: str,
    now: datetime,
    deadline: datetime | None = None,
) -> None:
    """Preempt a running job now, or (``deadline``) interrupt it: it keeps its units until
    then. ``preemptor``: the starving operation, or None for a ``resource_limits``."""
    table = schema.tree_job
    values: dict[str, Any] = {"preempted_by": preemptor, "reason": reason}
    if deadline is None:
        values.update(status=JobStatus.PREEMPTED.value, finished_at=as_utc(now))
    else:
        values.update(status=JobStatus.INTERRUPTING.value, interrupt_deadline=as_utc(deadline))
    connection.execute(update(table).where(table.c.id == job_id).values(**values))


def finish_interruptions(connection: Connection, job_ids: Sequence[str], now: datetime) -> None:
    """Interrupted jobs whose deadline has come: preempted, their units free."""
    table = schema.tree_job
    for batch in batches(job_ids):
        connection.execute(
            update(table)
            .where(table.c.id.in_(batch), table.c.status == JobStatus.INTERRUPTING.value)
            .values(status=JobStatus.PREEMPTED.value, finished_at=as_utc(now))
        )


def end_jobs(connection: Connection, operation_id: str, status: JobStatus, now: datetime) -> None:
    """Every live job of the operation (interrupted ones too) ends with ``status``."""
    table = schema.tree_job
    connection.execute(
        update(table)
        .where(table.c.operation_id == operation_id, table.c.status.in_(LIVE_JOBS))
        .values(status=status.value, finished_at=as_utc(now))
    )
