"""Prometheus metrics on a registry of the app's own (never the process-global one).

Gauges are read from the database at scrape time: per pool and key, queue length, capacity,
allocated and free units; per queue of the scheduler config, its workloads waiting and admitted
and its usage against each quota; per pool tree, its operations and resources. Counters and
histograms are fed by the reconcile passes this process runs: every service operation ends
with a pass, and the reconciler thread runs one per tick. A pass's summary is recorded only
once its transaction has committed (``Service.on_pass``), so a rolled-back operation counts
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairpool.api.errors import log_failure
from fairpool.scheduling import SchedulingService
from fairpool.service import Service
from fairpool.trees_service import TreesService
from fairpool.views import PRUNED_KINDS, PassSummary, PruneView

# The ``*_created`` series prometheus_client adds to every counter and histogram (a gauge
# each) double the series for what Prometheus itself knows without them. Process-wide.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: Where group commit's write batches run (``Service.on_batch``).
BATCHES_RUN_ON = ("loop", "thread")

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    4 * 3600.0, 24 * 3600.0,
)


class Metrics:
    def __init__(
        self, service: Service, scheduling: SchedulingService, trees: TreesService
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.admissions = Counter(
            "fairpool_admissions", "Requests granted an allocation.", registry=self.registry
        )
        self.rejections = Counter(
            "fairpool_rejections",
            "Requests rejected (could never fit, or no policy on any pool).",
            registry=self.registry,
        )
        self.preemptions = Counter(
            "fairpool_preemptions", "Allocations preempted.", registry=self.registry
        )
        self.retries = Counter(
            "fairpool_retries", "Retry attempts queued after a preemption.", registry=self.registry
        )
        self.lease_expiries = Counter(
            "fairpool_lease_expiries",
            "Allocations released because their lease expired.",
            registry=self.registry,
        )
        self.long_polls = Gauge(
            "fairpool_long_polls",
            "Long-polls (GET /requests/{id}/wait) waiting for their request's decision now.",
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "fairpool_reconcile_pass_seconds",
            "Duration of one reconcile pass (load, engine, apply).",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.wait_seconds = Histogram(
            "fairpool_wait_seconds",
            "Time from a request's creation to its allocation.",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.batches = Counter(
            "fairpool_write_batches",
            "Write transactions of group commit, by where they ran: loop (on the event loop: "
            "SQLite when it need not wait, PostgreSQL awaiting the round trip) or thread.",
            ["on"],
            registry=self.registry,
        )
        self.batched = Counter(
            "fairpool_write_batch_operations",
            "Write operations those transactions held; over fairpool_write_batches_total, "
            "the mean batch size.",
            ["on"],
            registry=self.registry,
        )
        self.prunes = Counter(
            "fairpool_pruned",
            "Rows prunes deleted (what ended before their cutoff), by kind: requests, events, "
            "workloads, operations.",
            ["kind"],
            registry=self.registry,
        )
        self.registry.register(StateCollector(service, scheduling, trees))
        #: The batch counters' series by where batches ran: prometheus_client finds a
        #: labelled series under a lock, once per batch otherwise. Every labelled series
        #: is there from the start, at 0: ``rate()`` of one not yet made answers nothing.
        self._batch_series = {
            where: (self.batches.labels(where), self.batched.labels(where))
            for where in BATCHES_RUN_ON
        }
        for kind in PRUNED_KINDS:
            self.prunes.labels(kind)

    def record(self, summaries: Iterable[PassSummary]) -> None:
        for summary in summaries:
            # Every pass records one; adding 0 would take a lock for nothing.
            for counter, ids in (
                (self.admissions, summary.granted),
                (self.rejections, summary.rejected),
                (self.preemptions, summary.preempted),
                (self.retries, summary.retried),
                (self.lease_expiries, summary.expired),
            ):
                if ids:
                    counter.inc(len(ids))
            self.pass_seconds.observe(summary.seconds)
            for wait in summary.waits:
                self.wait_seconds.observe(wait)

    def batch(self, where: str, operations: int) -> None:
        """A write batch ran (``Service.on_batch``)."""
        series = self._batch_series[where]
        series[0].inc()
        series[1].inc(operations)

    def pruned(self, done: PruneView) -> None:
        """A prune ran (``--keep-history``, ``POST /prune``); a dry run deleted nothing."""
        if not done.dry_run:
            for kind, count in done.counts().items():
                self.prunes.labels(kind).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StateCollector(Collector):
    """The gauges, each family read in a read transaction of its own at scrape time."""

    def __init__(
        self, service: Service, scheduling: SchedulingService, trees: TreesService
    ) -> None:
        self._parts: tuple[tuple[str, Callable[[], list[GaugeMetricFamily]]], ...] = (
            ("pools", lambda: _pools(service)),
            ("the scheduler config's queues", lambda: _queues(scheduling)),
            ("the pool trees", lambda: _trees(trees)),
        )

    def describe(self) -> Iterable[Metric]:
        return [_up(), *_pool_families(), *_queue_families(), *_tree_families()]

    def collect(self) -> Iterable[Metric]:
        up = _up()
        found: list[Metric] = []
        for what, read in self._parts:
            try:
                found += read()
            except Exception as error:  # a scrape must not fail because the database is away
                log_failure(f"metrics: could not read {what}", error)
                up.add_metric([], 0)
                return [up]
        up.add_metric([], 1)
        return [up, *found]


def _up() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "fairpool_database_up", "1 when the last scrape could read the database."
    )


def _pools(service: Service) -> list[GaugeMetricFamily]:
    families = _pool_families()
    queue, capacity, allocated, free = families
    for pool in service.list_pools():
        queue.add_metric([pool.name], pool.queue_length)
        for key in {**pool.capacity, **pool.occupied}:  # a removed key still held: 0 total
            total, used = pool.capacity.get(key, 0), pool.occupied.get(key, 0)
            capacity.add_metric([pool.name, key], total)
            allocated.add_metric([pool.name, key], used)
            free.add_metric([pool.name, key], max(0, total - used))
    return families


def _pool_families() -> list[GaugeMetricFamily]:
    labels = ["pool", "key"]
    return [
        GaugeMetricFamily(
            "fairpool_pool_queue_length", "Requests waiting in the pool.", labels=["pool"]
        ),
        GaugeMetricFamily(
            "fairpool_pool_capacity_units", "Units of a key the pool has.", labels=labels
        ),
        GaugeMetricFamily(
            "fairpool_pool_allocated_units", "Units of a key held by allocations.",
            labels=labels,
        ),
        GaugeMetricFamily(
            "fairpool_pool_free_units", "Capacity minus allocated (at least 0).",
            labels=labels,
        ),
    ]


def _queues(scheduling: SchedulingService) -> list[GaugeMetricFamily]:
    families = _queue_families()
    waiting, admitted, used, quota = families
    for queue in scheduling.list_queues():
        waiting.add_metric([queue.name], queue.queued)
        admitted.add_metric([queue.name], queue.admitted)
        for row in queue.usage:
            labels = [queue.name, row.flavor or "", row.resource]
            used.add_metric(labels, row.used_milli / 1000)
            if row.nominal_quota_milli is not None:  # no series for "unlimited"
                quota.add_metric(labels, row.nominal_quota_milli / 1000)
    return families


def _queue_families() -> list[GaugeMetricFamily]:
    labels = ["queue", "flavor", "resource"]
    return [
        GaugeMetricFamily(
            "fairpool_queue_waiting_workloads",
            "Workloads waiting in a queue of the scheduler config.", labels=["queue"],
        ),
        GaugeMetricFamily(
            "fairpool_queue_admitted_workloads",
            "Workloads of a queue admitted and running.", labels=["queue"],
        ),
        GaugeMetricFamily(
            "fairpool_queue_used_units",
            "Units of a resource a queue's running workloads use, per flavor (none on a "
            "passthrough queue: flavor \"\").", labels=labels,
        ),
        GaugeMetricFamily(
            "fairpool_queue_nominal_quota_units",
            "A queue's nominal quota of a resource per flavor (no series: unlimited).",
            labels=labels,
        ),
    ]


def _trees(trees: TreesService) -> list[GaugeMetricFamily]:
    families = _tree_families()
    running, pending, resources = families
    for tree in trees.list_trees():
        running.add_metric([tree.name], tree.running_operations)
        pending.add_metric([tree.name], tree.pending_operations)
        for resource, total in tree.resources.items():
            resources.add_metric([tree.name, resource], total)
    return families


def _tree_families() -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily(
            "fairpool_tree_running_operations", "Operations running in a pool tree.",
            labels=["tree"],
        ),
        GaugeMetricFamily(
            "fairpool_tree_pending_operations",
            "Operations of a pool tree not running (waiting on their pool's "
            "max_running_operation_count).", labels=["tree"],
        ),
        GaugeMetricFamily(
            "fairpool_tree_resource_units", "A resource the pool tree's nodes have in all.",
            labels=["tree", "resource"],
        ),
    ]
