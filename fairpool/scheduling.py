"""The scheduler config front-end as a service (seed 004): config versions, workloads, queues.

Like ``fairpool.service``, each command is one write transaction: the change, then a pass
(route every waiting workload under the active config, assign flavors, run the engine, store
its decisions), so a submit answers with the decision already made. The pure parts live in
``fairpool.frontends.config`` (validation) and ``fairpool.frontends.workloads`` (routing,
flavors, compilation to the engine).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection

from fairpool.errors import Conflict, InvalidInput, NotFound, as_ref, one_of, validate_int
from fairpool.frontends import workloads as wl
from fairpool.frontends.config import (
    MAX_VERSION,
    ConfigError,
    ConfigIssue,
    SchedulerConfig,
    load_config,
    warnings,
)
from fairpool.frontends.config_diff import changed_queues, diff_configs, summary
from fairpool.frontends.pools import cancel_reason, validate_filter
from fairpool.idempotency import Keyed
from fairpool.ids import new_id
from fairpool.paging import Page, check_page
from fairpool.store import scheduling as store
from fairpool.store import schema
from fairpool.store.db import Database, generation, read_generation
from fairpool.store.records import ConfigVersion, ConfigVersionInfo, Workload, WorkloadStatus
from fairpool.views import WORKLOAD_STATUSES

_EMPTY = SchedulerConfig()


def _applied_again(conn: Connection, number: int) -> Applied:
    """Version ``number``, as its apply answered it (its warnings and changes; not the
    workloads it moved, told the first time): what a repeat with its key is answered."""
    version = store.get_config_version(conn, number)
    before = (_EMPTY if number == 1
              else _parsed(store.get_config_version(conn, number - 1).document))
    config = _parsed(version.document)
    active = store.active_config_version(conn)
    return Applied(
        SchedulingService._version_view(version, active), tuple(warnings(config)),
        diff_configs(before, config), (), (), (), (),
    )


def _based_on(based_on: object) -> int | None:
    return None if based_on is None else validate_int("based_on", based_on, 0, MAX_VERSION)


def _check_based_on(conn: Connection, based_on: int | None) -> None:
    """Conflict unless the active config version is ``based_on`` (0: none yet); a version
    that never was is no change meanwhile, but a wrong ``based_on``."""
    if based_on is None:
        return
    active = store.active_config_version(conn)
    now = 0 if active is None else active.version
    if now == based_on:
        return
    # None yet: "it is version 0" named a version no one ever applied (helper-83).
    found = f"it is version {now}" if now else "there is none"
    if based_on:
        try:
            store.get_config_version(conn, based_on)
        except NotFound:  # "changed meanwhile" said it had been (helper-101)
            active_one = f"the active one is version {now}" if now else "none is applied yet"
            raise InvalidInput("based_on", based_on, f"no scheduler config version "
                               f"{based_on}; {active_one}") from None
    expected = f"not version {based_on}" if based_on else "where there was none"
    raise Conflict(
        f"the active scheduler config changed meanwhile: {found}, {expected} "
        "(based_on); nothing applied: look at it again and re-apply"
    )


def _version(version: int) -> int:
    """A version number as the API takes it: beyond 32 bits a database could not even look
    it up."""
    return validate_int("version", version, 1, MAX_VERSION)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _config(version: ConfigVersion | None) -> SchedulerConfig:
    return _EMPTY if version is None else _parsed(version.document)


@functools.lru_cache(maxsize=16)
def _parsed(document: str) -> SchedulerConfig:
    """A stored version's config (it was valid when applied, so it parses again)."""
    return load_config(document, stored=True)


# -- views -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadView:
    id: str
    status: str
    reason: str | None
    queue: str | None
    #: One flavor per resource group of its queue, once admitted.
    flavors: tuple[str, ...]
    priority: int | None
    requested_priority: int | None
    labels: dict[str, str]
    #: Units as a user writes them ("0.5"), per resource axis.
    demand: dict[str, str]
    submitted_at: datetime
    admitted_at: datetime | None
    finished_at: datetime | None
    config_version: int | None
    preemptions: int
    #: When it was last preempted and queued again; it waits from then.
    requeued_at: datetime | None = None
    #: Queued: 1 = next in its queue (priority, then FIFO); None otherwise.
    position: int | None = None
    #: Why earlier rules and other flavors did not apply, one line each.
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("submitted_at", "admitted_at", "finished_at", "requeued_at"):
            data[key] = _iso(data[key])
        data["flavors"] = list(self.flavors)
        data["notes"] = list(self.notes)
        return data


@dataclass(frozen=True, slots=True)
class ExplainView:
    """``fairpool config explain``: the decision a workload would get now, and why."""

    status: str
    #: Index of the scheduling rule that routes it (None: no rule, or no rules at all).
    rule: int | None
    queue: str | None
    flavors: tuple[str, ...]
    priority: int
    reason: str
    notes: tuple[str, ...]
    config_version: int | None
    #: Queued: where it would wait, 1 = next (behind those waiting ahead of it).
    position: int | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["flavors"] = list(self.flavors)
        data["notes"] = list(self.notes)
        return data


@dataclass(frozen=True, slots=True)
class ConfigVersionView:
    version: int
    applied_at: datetime
    active: bool
    rolled_back_from: int | None
    flavors: int
    queues: int
    rules: int
    #: The YAML as applied; None in a listing (``list_configs``).
    document: str | None = field(repr=False)

    @classmethod
    def of(cls, version: ConfigVersionInfo, counts: Mapping[str, Any],
           active: int | None, document: str | None) -> ConfigVersionView:
        return cls(version.version, version.applied_at, version.version == active,
                   version.rolled_back_from, counts["flavors"], counts["queues"],
                   counts["rules"], document)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["applied_at"] = _iso(self.applied_at)
        return data


@dataclass(frozen=True, slots=True)
class ConfigPreview:
    """What an apply would do (``preview_config``)."""

    #: The active version it was worked out against (0: none yet).
    based_on: int
    changes: tuple[str, ...]
    warnings: tuple[ConfigIssue, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"based_on": self.based_on, "changes": list(self.changes),
                "warnings": [issue.as_dict() for issue in self.warnings]}


@dataclass(frozen=True, slots=True)
class Applied:
    """What ``apply`` and ``rollback`` did."""

    version: ConfigVersionView
    warnings: tuple[ConfigIssue, ...]
    #: What changed from the version before, queue by queue (``diff_configs``).
    changes: tuple[str, ...]
    #: Admitted workloads whose queue (or flavor) the new version lacks: they keep running
    #: and their usage counts against no quota until they end.
    orphaned: tuple[str, ...]
    #: Waiting workloads whose decision changed in the pass that followed.
    admitted: tuple[str, ...]
    failed: tuple[str, ...]
    #: Running workloads that pass preempted (each one's view says what it got once requeued).
    preempted: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version.as_dict(),
            "warnings": [issue.as_dict() for issue in self.warnings],
            "changes": list(self.changes),
            "orphaned": list(self.orphaned),
            "admitted": list(self.admitted),
            "failed": list(self.failed),
            "preempted": list(self.preempted),
        }


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    passthrough: bool
    preemption: str
    queued: int
    admitted: int
    usage: tuple[wl.QuotaUsage, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passthrough": self.passthrough,
            "preemption": self.preemption,
            "queued": self.queued,
            "admitted": self.admitted,
            "usage": [
                {
                    "flavor": row.flavor,
                    "resource": row.resource,
                    "used": wl.format_units(row.used_milli),
                    "nominal_quota": None
                    if row.nominal_quota_milli is None
                    else wl.format_units(row.nominal_quota_milli),
                    "workloads": row.workloads,
                }
                for row in self.usage
            ],
        }


# -- the service -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Live:
    """What a pass reads: the active config and the live workloads, each tuple in the
    store's order (submitted, then id), and the same workloads as ``wl.schedule`` takes them
    (``pure_waiting``, ``pure_running``, same order)."""

    version: ConfigVersion | None
    config: SchedulerConfig
    waiting: tuple[Workload, ...]
    running: tuple[Workload, ...]
    pure_waiting: tuple[wl.Workload, ...]
    pure_running: tuple[wl.RunningWorkload, ...]

    @classmethod
    def load(cls, conn: Connection) -> _Live:
        version = store.active_config_version(conn)
        live = store.live_workloads(conn)
        waiting = tuple(w for w in live if w.status is WorkloadStatus.QUEUED)
        running = tuple(w for w in live if w.status is WorkloadStatus.ADMITTED)
        return cls(
            version,
            _config(version),
            waiting,
            running,
            tuple(_pure(w) for w in waiting),
            tuple(_running(w) for w in running),
        )

    def refreshed(
        self, conn: Connection, ids: Collection[str],
        applied: tuple[ConfigVersion, SchedulerConfig] | None,
    ) -> _Live:
        """This state after its own transaction wrote the workloads ``ids`` (and ``applied``
        a config version, with its config, as the apply validated it: not parsed again).
        Those are read again, the other rows are unchanged. The pure workloads of the rows
        not read again are kept as they were: a compile that finds the same objects reuses
        what it worked out for them (``wl.Parts``)."""
        version, config = applied or (self.version, self.config)
        read = store.workloads_by_id(conn, ids)
        waiting = _merged(
            [(w, p) for w, p in zip(self.waiting, self.pure_waiting, strict=True)
             if w.id not in ids],
            [(w, _pure(w)) for w in read if w.status is WorkloadStatus.QUEUED],
        )
        running = _merged(
            [(w, p) for w, p in zip(self.running, self.pure_running, strict=True)
             if w.id not in ids],
            [(w, _running(w)) for w in read if w.status is WorkloadStatus.ADMITTED],
        )
        return _Live(
            version,
            config,
            tuple(w for w, _ in waiting),
            tuple(w for w, _ in running),
            tuple(p for _, p in waiting),
            tuple(p for _, p in running),
        )

    def outcome(self, now: datetime, reuse: wl.Parts | None = None) -> wl.Outcome:
        return wl.schedule(
            self.config, self.pure_waiting, self.pure_running, now.timestamp(), reuse
        )


_P = TypeVar("_P")


def _store_order(pair: tuple[Workload, object]) -> tuple[datetime, str]:
    """``store.list_workloads``' order."""
    return pair[0].submitted_at, pair[0].id


def _merged(
    kept: list[tuple[Workload, _P]], read: list[tuple[Workload, _P]]
) -> list[tuple[Workload, _P]]:
    """``kept`` (in store order) with the rows ``read`` again put in their places."""
    for pair in read:
        bisect.insort(kept, pair, key=_store_order)
    return kept


@dataclass(frozen=True, slots=True)
class _Kept:
    """What a committed write leaves for the next: the live state, with the store's
    generation it is current at, and what the last pass compiled."""

    generation: int
    live: _Live | None
    #: Good whoever wrote since: a part is reused only for an equal workload and config.
    parts: wl.Parts | None


class _Tx:
    """One write transaction of the service: the live state as of its last read, what the
    transaction wrote since (``live`` reads that again), and what the last pass compiled."""

    def __init__(self, conn: Connection, live: _Live | None, parts: wl.Parts | None) -> None:
        self.conn = conn
        self.parts = parts
        self._live = live
        self._written: set[str] = set()
        self._applied: tuple[ConfigVersion, SchedulerConfig] | None = None

    def live(self) -> _Live:
        """The live state now: loaded at first (unless given), then kept current by
        reading again only what this transaction wrote."""
        if self._live is None:
            self._live = _Live.load(self.conn)
        elif self._written or self._applied:
            self._live = self._live.refreshed(self.conn, self._written, self._applied)
        self._written, self._applied = set(), None
        return self._live

    def kept(self) -> _Live | None:
        """The live state at the end of the transaction, if it has one to keep."""
        return None if self._live is None else self.live()

    def insert_config_version(
        self, document: str, config: SchedulerConfig, now: datetime,
        rolled_back_from: int | None, idempotency: tuple[str, str] | None,
    ) -> ConfigVersion:
        version = store.insert_config_version(
            self.conn, document, summary(config), now, rolled_back_from, idempotency
        )
        self._applied = (version, config)
        return version

    def insert_workload(
        self, checked: wl.Workload, now: datetime, created_by: str | None,
        idempotency: tuple[str, str] | None,
    ) -> str:
        workload_id = store.insert_workload(
            self.conn, checked.labels, checked.priority, checked.demand, now, created_by,
            idempotency,
        )
        self._written.add(workload_id)
        return workload_id

    def update_workload(self, workload_id: str, now: datetime, **values: Any) -> None:
        store.update_workload(self.conn, workload_id, now, **values)
        self._written.add(workload_id)


def _pure(workload: Workload) -> wl.Workload:
    return wl.Workload(
        id=workload.id,
        labels=workload.labels,
        priority=workload.requested_priority,
        demand=workload.demand,
        submitted_at=(workload.requeued_at or workload.submitted_at).timestamp(),
    )


def _running(workload: Workload) -> wl.RunningWorkload:
    assert workload.admitted_at is not None and workload.priority is not None
    return wl.RunningWorkload(
        _pure(workload),
        wl.Admission(
            workload.queue, workload.flavors, workload.priority, workload.admitted_at.timestamp()
        ),
    )


class SchedulingService:
    def __init__(
        self, db: Database, clock: Callable[[], datetime] = _utcnow, reuse: bool = True
    ) -> None:
        """``reuse``: a write starts from the live state the last one committed, when
        nobody wrote since (``_write``); off, each pass loads it afresh (for comparisons)."""
        self.db = db
        self.clock = clock
        self.reuse = reuse
        #: What this service's last write transaction committed.
        self._committed: _Kept | None = None

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        """A write transaction (``Database.write``). It starts from the live state the last
        one committed if the store's generation shows that nobody wrote since (another
        process, another replica, a write of ``Service``'s): else that is loaded afresh
        when needed. Only a commit leaves its state behind, for the next."""
        with self.db.write() as conn:
            committed, self._committed = self._committed, None
            current = generation(conn)
            if committed is None:
                tx = _Tx(conn, None, None)
            else:
                fresh = committed.generation == current - 1
                tx = _Tx(conn, committed.live if fresh else None, committed.parts)
            yield tx
            kept = _Kept(current, tx.kept(), tx.parts)
        if self.reuse:
            self._committed = kept

    def _read(self, conn: Connection) -> tuple[_Live, wl.Parts | None]:
        """The live state for a read (``conn``'s snapshot), and what the last pass compiled:
        the state this service's last write committed, if the store's generation shows that
        nobody wrote since, else loaded. A read does not keep what it loaded or compiled:
        only a write's commit leaves state behind (``_write``)."""
        kept = self._committed  # None while a write runs: its state is not committed yet
        if kept is None:
            return _Live.load(conn), None
        if kept.live is not None and kept.generation == read_generation(conn):
            return kept.live, kept.parts
        return _Live.load(conn), kept.parts

    # -- config versions ---------------------------------------------------------------------

    def apply_config(
        self, document: str, based_on: int | None = None, idempotency_key: str | None = None
    ) -> Applied:
        """Validate ``document`` and make it the new active version (identical content too).
        ``based_on``: only if the active version is still that one (0: none yet), so that a
        change confirmed against what was shown does not undo another applied meanwhile.
        ``idempotency_key``: when a version was applied with it already, that version is
        answered (without the workloads it moved: those were told the first time)."""
        config = load_config(document)
        based_on = _based_on(based_on)
        key = Keyed.of(idempotency_key, {"document": document, "based_on": based_on})
        with self._write() as tx:
            made = key.made(tx.conn, schema.config_version, "a config version", None)
            if made is not None:
                return _applied_again(tx.conn, int(made))
            _check_based_on(tx.conn, based_on)
            return self._apply(tx, document, config, None, key.columns)

    def rollback_config(
        self, version: int, based_on: int | None = None, idempotency_key: str | None = None
    ) -> Applied:
        """Apply version ``version`` again, as a new version; history is never rewritten.
        ``based_on`` and ``idempotency_key``: as ``apply_config``'s."""
        based_on = _based_on(based_on)
        key = Keyed.of(idempotency_key, {"rollback": version, "based_on": based_on})
        with self._write() as tx:
            made = key.made(tx.conn, schema.config_version, "a config version", None)
            if made is not None:
                return _applied_again(tx.conn, int(made))
            _check_based_on(tx.conn, based_on)
            old = store.get_config_version(tx.conn, _version(version))
            return self._apply(
                tx, old.document, _parsed(old.document), old.version, key.columns
            )

    def get_config(self, version: int | None = None) -> ConfigVersionView | None:
        """The given version, else the active one (None before the first apply)."""
        with self.db.read() as conn:
            active = store.active_config_version(conn)
            if version is not None:
                found = store.get_config_version(conn, _version(version))
                return self._version_view(found, active)
            return None if active is None else self._version_view(active, active)

    def list_configs(self) -> list[ConfigVersionView]:
        """Every version, newest first, without its document (``get_config`` has it)."""
        with self.db.read() as conn:
            versions = _summarised(conn, record=False)
        active = versions[-1][0].version if versions else None
        return [ConfigVersionView.of(info, counts, active, None)
                for info, counts in reversed(versions)]

    def diff_config(self, version: int) -> tuple[str, ...]:
        """What applying (rolling back to) ``version`` would change, queue by queue."""
        with self.db.read() as conn:
            target = store.get_config_version(conn, _version(version))
            active = store.active_config_version(conn)
        current = _EMPTY if active is None else _parsed(active.document)
        return diff_configs(current, _parsed(target.document))

    def preview_config(self, document: str) -> ConfigPreview:
        """What applying ``document`` would change, without applying it: refused as an apply
        refuses it (``ConfigError``: invalid, or a queue whose spec an earlier version fixed),
        else the change from the active version and the advisories, with that version's
        number to apply it ``based_on`` (so what was shown is what changes)."""
        config = load_config(document)
        with self.db.read() as conn:
            _check_queues_unchanged(conn, config, record=False)
            active = store.active_config_version(conn)
        current = _config(active)
        return ConfigPreview(0 if active is None else active.version,
                             diff_configs(current, config), tuple(warnings(config)))

    def _apply(
        self, tx: _Tx, document: str, config: SchedulerConfig,
        rolled_back_from: int | None, idempotency: tuple[str, str] | None,
    ) -> Applied:
        _check_queues_unchanged(tx.conn, config, record=True)
        before = tx.live()
        version = tx.insert_config_version(
            document, config, self.clock(), rolled_back_from, idempotency
        )
        outcome = self._pass(tx)
        # Those whose queue or flavor this version removes (not those an earlier one did), and
        # those it brings back: each one's reason says whether a quota counts it.
        orphaned: list[str] = []
        for running in before.pure_running:
            admission = running.admission
            charged = wl.admitted_queue(config, admission) is not None
            if admission.queue is None or running.workload.id in outcome.repriced or (
                charged == (wl.admitted_queue(before.config, admission) is not None)
            ):
                continue
            reason = wl.admitted_reason(admission.queue, admission.flavors, admission.priority)
            if not charged:
                orphaned.append(running.workload.id)
                reason += (f"; config version {version.version} has "
                           f"{wl.missing_from(config, admission)}: it runs on, charged to no "
                           "quota")
            tx.update_workload(running.workload.id, self.clock(), status_reason=reason)
        waited = [w.id for w in before.waiting]
        return Applied(
            self._version_view(version, version),
            tuple(warnings(config)),
            diff_configs(before.config, config),
            tuple(orphaned),
            tuple(i for i in waited if outcome.decisions[i].status is wl.Status.ADMITTED),
            tuple(i for i in waited
                  if outcome.decisions[i].status in (wl.Status.REJECTED, wl.Status.FAILED)),
            tuple(e.workload_id for e in outcome.evictions),
        )

    @staticmethod
    def _version_view(version: ConfigVersion, active: ConfigVersion | None) -> ConfigVersionView:
        return ConfigVersionView.of(
            version, version.summary or summary(_parsed(version.document)),
            None if active is None else active.version, version.document,
        )

    # -- workloads ---------------------------------------------------------------------------

    def submit_workload(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        priority: int | None = None,
        demand: Mapping[str, object] | None = None,
        created_by: str | None = None,
        idempotency_key: str | None = None,
        **reserved: str | None,
    ) -> WorkloadView:
        """A new workload, routed and decided at once. ``reserved``: instance_type,
        accelerator_type, market_type, cloud_resource_id, workload_type. ``created_by``: the
        API token it was submitted with. ``idempotency_key``: when a workload was submitted
        with it already, that workload is answered and nothing is made."""
        now = self.clock()
        checked = _validate(labels, priority, demand, reserved, now)
        key = Keyed.of(idempotency_key, {"labels": checked.labels,
                                         "priority": checked.priority, "demand": checked.demand})
        with self._write() as tx:
            made = key.made(tx.conn, schema.workload, "a workload", created_by)
            if made is None:
                workload_id = tx.insert_workload(checked, now, created_by, key.columns)
                outcome = self._pass(tx)
                return self._view(store.get_workload(tx.conn, workload_id), outcome)
        return self.get_workload(made)

    def explain(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        priority: int | None = None,
        demand: Mapping[str, object] | None = None,
        **reserved: str | None,
    ) -> ExplainView:
        """What would happen to such a workload if submitted now (nothing is stored)."""
        now = self.clock()
        checked = _validate(labels, priority, demand, reserved, now)
        with self.db.read() as conn:
            live, parts = self._read(conn)
        decision = wl.explain(live.config, checked, live.pure_running, now.timestamp(),
                              waiting=live.pure_waiting, reuse=parts)
        return ExplainView(
            decision.status.value,
            decision.route.rule,
            decision.route.queue,
            decision.admission.flavors if decision.admission is not None else (),
            decision.route.priority,
            decision.reason,
            decision.notes,
            None if live.version is None else live.version.version,
            decision.position,
        )

    def get_workload(self, ref: str) -> WorkloadView:
        with self.db.read() as conn:
            workload = store.get_workload(conn, ref)
            if workload.status is not WorkloadStatus.QUEUED:
                return self._view(workload, None)
            live, parts = self._read(conn)
        return self._view(workload, live.outcome(self.clock(), parts))

    def list_workloads(
        self, status: str | None = None, queue: str | None = None
    ) -> list[WorkloadView]:
        """Every workload the filters match, in submission order (``workload_page``)."""
        return list(self.workload_page(status, queue).items)

    def workload_page(
        self,
        status: str | None = None,
        queue: str | None = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        after: str | None = None,
        created_by: str | None = None,
    ) -> Page[WorkloadView]:
        """Workloads ``offset`` to ``offset + limit`` (``limit`` None: to the end), after the
        cursor ``after`` if given, of those with ``status``, routed to ``queue``, submitted
        with token ``created_by``; in submission order, and how many match."""
        statuses = None
        if status is not None:
            statuses = [WorkloadStatus(one_of("status", status, WORKLOAD_STATUSES))]
        validate_filter("queue", queue)
        cursor = check_page(limit, offset, after)
        with self.db.read() as conn:
            if queue is not None and all(
                queue not in known["queue_specs"] for _, known in _summarised(conn, record=False)
            ):  # a typo, said as one: not an empty list
                raise NotFound.of("resource queue", queue, " in any scheduler config version")
            found, total, end = store.workload_page(
                conn, statuses, queue, created_by, limit=limit, offset=offset, after=cursor
            )
            live, parts = self._read(conn)
        outcome = live.outcome(self.clock(), parts) if live.waiting else None
        return Page(tuple(self._view(w, outcome) for w in found), total, limit, offset,
                    str(end) if end else None)

    def release_workload(self, ref: str) -> WorkloadView:
        """The workload ended: its quota is free for the next."""
        return self._end(ref, WorkloadStatus.FINISHED, "finished: released by its holder",
                         (WorkloadStatus.ADMITTED,))

    def cancel_workload(self, ref: str, reason: str | None = None) -> WorkloadView:
        """Withdraw a queued or admitted workload; ``reason`` (the canceller's words) is
        kept as its reason."""
        return self._end(ref, WorkloadStatus.CANCELLED, cancel_reason(reason),
                         (WorkloadStatus.QUEUED, WorkloadStatus.ADMITTED))

    def _end(
        self, ref: str, status: WorkloadStatus, why: str, allowed: Sequence[WorkloadStatus]
    ) -> WorkloadView:
        with self._write() as tx:
            workload = store.get_workload(tx.conn, ref)
            if workload.status not in allowed:
                hint = ": use cancel" if workload.status is WorkloadStatus.QUEUED else ""
                raise Conflict(f"workload {workload.id} is {workload.status.value}, not "
                               f"{' or '.join(s.value for s in allowed)}{hint}")
            tx.update_workload(workload.id, self.clock(), status=status, status_reason=why)
            outcome = self._pass(tx)
            return self._view(store.get_workload(tx.conn, workload.id), outcome)

    def reconcile(self) -> wl.Outcome:
        with self._write() as tx:
            return self._pass(tx)

    def reconcile_waiting(self) -> wl.Outcome | None:
        """A pass when some workload waits (the server's tick); None, after one small read,
        when none does."""
        with self.db.read() as conn:
            waiting = store.any_queued_workload(conn)
        return self.reconcile() if waiting else None

    # -- queues ------------------------------------------------------------------------------

    def list_queues(self) -> list[QueueView]:
        with self.db.read() as conn:
            live, _ = self._read(conn)
        usage = wl.queue_usage(live.config, live.pure_running)
        views = []
        for queue in live.config.resource_queues:
            policy = queue.preemption.within_resource_queue if queue.preemption else None
            views.append(QueueView(
                queue.name,
                queue.is_passthrough,
                policy.value if policy is not None else "never",
                sum(1 for w in live.waiting if w.queue == queue.name),
                sum(1 for w in live.running if w.queue == queue.name),
                tuple(row for row in usage if row.queue == queue.name),
            ))
        return views

    def describe_queue(self, name: str) -> QueueView:
        as_ref(name)
        for view in self.list_queues():
            if view.name == name:
                return view
        raise NotFound.of_queue(name)

    # -- the pass ----------------------------------------------------------------------------

    def _pass(self, tx: _Tx) -> wl.Outcome:
        now = self.clock()
        live = tx.live()
        outcome = live.outcome(now, tx.parts)
        tx.parts = outcome.parts
        version = None if live.version is None else live.version.version
        waiting = {w.id: w for w in live.waiting}
        running = {w.id: w for w in live.running}
        # Preempted (running before the pass: ``wl.schedule`` names no other): requeued,
        # without the flavors it no longer holds, and decided again in the same pass.
        evicted = {e.workload_id: e for e in outcome.evictions}
        for workload_id, decision in outcome.decisions.items():
            workload = waiting.get(workload_id) or running[workload_id]
            values: dict[str, Any] = {
                "queue": decision.route.queue,
                "priority": decision.route.priority,
                "config_version": version,
                "status_reason": decision.reason,
            }
            if workload_id in evicted:
                values.update(status=WorkloadStatus.QUEUED, admitted_at=None, flavors=[],
                              preemptions=workload.preemptions + 1, requeued_at=now,
                              status_reason=_requeued(evicted[workload_id], decision.reason))
            elif (workload.status_reason or "").endswith(_requeued(None, decision.reason)):
                # Still waiting for the reason it had once preempted: it says so until then.
                values["status_reason"] = workload.status_reason
            if decision.status is wl.Status.ADMITTED:
                assert decision.admission is not None
                values.update(status=WorkloadStatus.ADMITTED, admitted_at=now,
                              flavors=list(decision.admission.flavors),
                              status_notes=list(decision.notes))
            elif decision.status in (wl.Status.REJECTED, wl.Status.FAILED):
                values.update(status=WorkloadStatus(decision.status.value),
                              status_notes=list(decision.notes))
            elif all(getattr(workload, key) == value for key, value in values.items()):
                continue  # still queued for the same reason: a long idle queue costs no writes
            tx.update_workload(workload_id, now, **values)
        for workload_id, priority in outcome.repriced.items():
            if workload_id not in outcome.decisions:  # still running, at its rule's priority now
                workload = running[workload_id]
                assert workload.queue is not None
                # Its reason told the priority it was admitted at: it tells the one it has now.
                reason = wl.repriced_reason(workload.queue, workload.flavors, priority,
                                            workload.priority, version)
                tx.update_workload(workload_id, now, priority=priority, config_version=version,
                                   status_reason=reason)
        return outcome

    def _view(self, workload: Workload, outcome: wl.Outcome | None) -> WorkloadView:
        decision = None if outcome is None else outcome.decisions.get(workload.id)
        queued = decision is not None and workload.status is WorkloadStatus.QUEUED
        return WorkloadView(
            id=workload.id,
            status=workload.status.value,
            reason=workload.status_reason,
            queue=workload.queue,
            flavors=workload.flavors if workload.status is not WorkloadStatus.QUEUED else (),
            priority=workload.priority,
            requested_priority=workload.requested_priority,
            labels=dict(workload.labels),
            demand={key: wl.format_units(amount) for key, amount in workload.demand.items()},
            submitted_at=workload.submitted_at,
            admitted_at=workload.admitted_at,
            finished_at=workload.finished_at,
            config_version=workload.config_version,
            preemptions=workload.preemptions,
            requeued_at=workload.requeued_at,
            position=decision.position if queued and decision is not None else None,
            notes=decision.notes if decision is not None else workload.notes,
        )


def _requeued(eviction: wl.Eviction | None, reason: str) -> str:
    """A preempted workload's reason: why, then what it got once requeued."""
    return f"{'' if eviction is None else eviction.reason}; requeued: {reason}"


def _validate(
    labels: Mapping[str, str] | None,
    priority: int | None,
    demand: Mapping[str, object] | None,
    reserved: Mapping[str, str | None],
    now: datetime,
) -> wl.Workload:
    return wl.validate_workload(
        new_id(),
        labels=labels,
        priority=priority,
        demand=demand,
        submitted_at=now.timestamp(),
        **reserved,
    )


def _summarised(
    conn: Connection, *, record: bool
) -> list[tuple[ConfigVersionInfo, Mapping[str, Any]]]:
    """Every version, oldest first, with its summary. One applied before summaries were kept
    is parsed, and its summary recorded when ``record`` (``conn`` writes), so only once."""
    versions = []
    for info in store.config_summaries(conn):
        known = info.summary
        if known is None:
            known = summary(_parsed(store.get_config_version(conn, info.version).document))
            if record:
                store.record_summary(conn, info.version, known)
        versions.append((info, known))
    return versions


def _check_queues_unchanged(conn: Connection, config: SchedulerConfig, *, record: bool) -> None:
    """A queue's spec is immutable per name across versions: a changed one needs a new name.
    Read from the versions' summaries (``_summarised``)."""
    history = [(info.version, known["queue_specs"])
               for info, known in _summarised(conn, record=record)]
    problems = changed_queues(history, config)
    if problems:
        raise ConfigError(problems)
