"""Queries of the scheduler config front-end (seed 004): config versions and workloads.

Like ``repo``: plain functions on the caller's transaction, returning frozen records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, func, insert, select, update

from fairpool.errors import NotFound
from fairpool.ids import new_id
from fairpool.paging import Cursor
from fairpool.store import schema
from fairpool.store.records import (
    WORKLOAD_RESOURCES,
    ConfigVersion,
    ConfigVersionInfo,
    Workload,
    WorkloadStatus,
)
from fairpool.store.repo import batches, keyed, page_of, resolve_id
from fairpool.store.schema import as_utc

# -- config versions -------------------------------------------------------------------------


def insert_config_version(
    connection: Connection, document: str, summary: Mapping[str, Any], now: datetime,
    rolled_back_from: int | None = None, idempotency: tuple[str, str] | None = None,
) -> ConfigVersion:
    """The next version, active from now. Callers hold the write lock, so max + 1 is free.
    ``summary``: its config's (``config_diff.summary``). ``idempotency``: the key it was
    applied with and the digest of what was asked."""
    table = schema.config_version
    latest = connection.scalar(select(func.max(table.c.version)))
    version = ConfigVersion(
        version=(latest or 0) + 1,
        document=document,
        applied_at=as_utc(now),
        rolled_back_from=rolled_back_from,
        summary=summary,
    )
    connection.execute(
        insert(table).values(
            version=version.version,
            document=document,
            summary=summary,
            applied_at=version.applied_at,
            rolled_back_from=rolled_back_from,
            **keyed(idempotency),
        )
    )
    return version


def config_summaries(connection: Connection) -> list[ConfigVersionInfo]:
    """Every version, oldest first, without its document."""
    table = schema.config_version
    rows = connection.execute(
        select(table.c.version, table.c.applied_at, table.c.rolled_back_from, table.c.summary)
        .order_by(table.c.version)
    )
    return [ConfigVersionInfo(row.version, row.applied_at, row.rolled_back_from, row.summary)
            for row in rows]


def record_summary(connection: Connection, version: int, summary: Mapping[str, Any]) -> None:
    """The summary of a version applied before migration 0015, worked out since."""
    table = schema.config_version
    connection.execute(
        update(table).where(table.c.version == version, table.c.summary.is_(None))
        .values(summary=summary)
    )


def active_config_version(connection: Connection) -> ConfigVersion | None:
    """The newest version; None until a config was applied (everything passes through)."""
    table = schema.config_version
    row = connection.execute(
        select(table).order_by(table.c.version.desc()).limit(1)
    ).mappings().first()
    return None if row is None else ConfigVersion.from_row(row)


def get_config_version(connection: Connection, version: int) -> ConfigVersion:
    table = schema.config_version
    row = connection.execute(select(table).where(table.c.version == version)).mappings().first()
    if row is None:
        raise NotFound(f"no scheduler config version {version}")
    return ConfigVersion.from_row(row)


# -- workloads -------------------------------------------------------------------------------


def insert_workload(
    connection: Connection,
    labels: Mapping[str, str],
    requested_priority: int | None,
    demand: Mapping[str, int],
    now: datetime,
    created_by: str | None = None,
    idempotency: tuple[str, str] | None = None,
) -> str:
    """A new queued workload, not yet routed; its id. ``created_by``: the API token it was
    submitted with; ``idempotency``: the key it was submitted with and the digest of what it
    asked."""
    now = as_utc(now)
    workload_id = new_id()
    connection.execute(
        insert(schema.workload).values(
            id=workload_id,
            status=WorkloadStatus.QUEUED.value,
            labels=dict(labels),
            requested_priority=requested_priority,
            submitted_at=now,
            updated_at=now,
            created_by_token_id=created_by,
            **keyed(idempotency),
            **{key: demand.get(key, 0) for key in WORKLOAD_RESOURCES},
        )
    )
    return workload_id


def get_workload(connection: Connection, ref: str) -> Workload:
    """The workload with id ``ref``, else the one whose id alone starts with ``ref``."""
    table = schema.workload
    workload_id = resolve_id(connection, table, ref, "workload")
    row = connection.execute(select(table).where(table.c.id == workload_id)).mappings().one()
    return Workload.from_row(row)


def list_workloads(
    connection: Connection,
    statuses: Iterable[WorkloadStatus] | None = None,
    queue: str | None = None,
) -> list[Workload]:
    """Workloads in submission order, optionally only those in ``statuses`` / ``queue``."""
    found = connection.execute(_workloads(statuses, queue)).mappings()
    return [Workload.from_row(row) for row in found]


def workload_page(
    connection: Connection,
    statuses: Iterable[WorkloadStatus] | None = None,
    queue: str | None = None,
    created_by: str | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
    after: Cursor | None = None,
) -> tuple[list[Workload], int, Cursor | None]:
    """``list_workloads``' ``offset`` to ``offset + limit`` (None: to the end) after
    ``after``, only those submitted with token ``created_by`` if given, how many match, and
    the page's cursor (``page_of``)."""
    table = schema.workload
    rows, total, cursor = page_of(
        connection, _workloads(statuses, queue, created_by),
        (table.c.submitted_at, table.c.id), limit, offset, after,
    )
    return [Workload.from_row(row) for row in rows], total, cursor


def _workloads(
    statuses: Iterable[WorkloadStatus] | None, queue: str | None, created_by: str | None = None
) -> Select[Any]:
    table = schema.workload
    statement = select(table).order_by(table.c.submitted_at, table.c.id)
    if statuses is not None:
        statement = statement.where(table.c.status.in_([s.value for s in statuses]))
    if queue is not None:
        statement = statement.where(table.c.queue == queue)
    if created_by is not None:
        statement = statement.where(table.c.created_by_token_id == created_by)
    return statement


def any_queued_workload(connection: Connection) -> bool:
    table = schema.workload
    found = connection.execute(
        select(table.c.id).where(table.c.status == WorkloadStatus.QUEUED.value).limit(1)
    ).first()
    return found is not None


def live_workloads(connection: Connection) -> list[Workload]:
    """Queued and admitted workloads: everything a pass looks at."""
    return list_workloads(connection, (WorkloadStatus.QUEUED, WorkloadStatus.ADMITTED))


def workloads_by_id(connection: Connection, ids: Iterable[str]) -> list[Workload]:
    """The workloads with these ids (in no particular order; those not found are left out)."""
    table = schema.workload
    found: list[Workload] = []
    for batch in batches(sorted(ids)):
        rows = connection.execute(select(table).where(table.c.id.in_(batch))).mappings()
        found.extend(Workload.from_row(row) for row in rows)
    return found


def update_workload(connection: Connection, workload_id: str, now: datetime, **values: Any) -> None:
    """Set columns of one workload (and its ``updated_at``)."""
    table = schema.workload
    if "status" in values and isinstance(values["status"], WorkloadStatus):
        if values["status"].is_final:
            values.setdefault("finished_at", as_utc(now))
        values["status"] = values["status"].value
    result = connection.execute(
        update(table).where(table.c.id == workload_id).values(updated_at=as_utc(now), **values)
    )
    if result.rowcount == 0:
        raise NotFound.of("workload", workload_id)
