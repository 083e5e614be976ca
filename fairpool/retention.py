"""Retention: what ended long ago leaves the store.

A shared server keeps every request, workload and operation it ever saw, and each request's
history; without this, lists, backups and the database grow for ever. ``prune`` deletes what
ended (a final status) before a cutoff: finished requests with their demand, allocation and
history, the history of requests deleted before it, finished workloads and finished
operations with their jobs. Nothing live is touched, whatever its age, nor a live request's
history, so no decision changes. Each batch is its own short transaction: a prune of a
large store never holds the write lock for long, and what it did stays done if it stops.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fairpool.store import repo, schema
from fairpool.store.db import Database
from fairpool.views import PruneProgress, PruneView

#: Rows deleted per transaction.
BATCH = 1_000


def prune(
    db: Database,
    before: datetime,
    *,
    dry_run: bool = False,
    batches: int | None = None,
    progress: PruneProgress | None = None,
) -> PruneView:
    """Delete what ended before ``before`` (see the module); ``dry_run``: only count it.
    ``batches``: in at most that many transactions, the rest left for the next prune
    (``PruneView.complete``); ``progress``: told after each."""
    tables = {
        "requests": schema.request, "workloads": schema.workload,
        "operations": schema.tree_operation,
    }
    done = PruneView(before=before, dry_run=dry_run)
    if dry_run:
        with db.read() as conn:
            for name, table in tables.items():
                done = done.adding(name, repo.count_where(
                    conn, table, repo.finished_before(table, before)))
            events = repo.stale_events(before, repo.finished_before(schema.request, before))
            return done.adding("events", repo.count_where(conn, schema.event, events))
    # Requests first: their history then is the events of requests gone.
    work = [*((name, table, repo.finished_before(table, before)) for name, table in tables.items()),
            ("events", schema.event, repo.stale_events(before))]
    for name, table, where in work:
        while True:
            with db.read() as conn:  # a read first: nothing to delete writes nothing
                ids = repo.ids_where(conn, table, where, BATCH)
            if not ids:
                break
            if batches is not None and batches <= 0:
                return replace(done, complete=False)
            with db.write() as conn:  # those gone meanwhile (another replica's) not counted
                done = done.adding(name, repo.delete_ids(conn, table, ids))
            if progress is not None:
                progress(done)
            batches = None if batches is None else batches - 1
            if len(ids) < BATCH:
                break
    return done
