"""Build engine snapshots from pools-and-policies descriptions, for scenario and property tests.

Goes through the real front-end compilation (``frontends.pools``), so a scenario exercises the
same nodes and placements the service builds from the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fairpool.engine.explain import queue_entries
from fairpool.engine.model import Allocation, Charge, Placement, Plan, Request, Snapshot
from fairpool.engine.reconcile import reconcile
from fairpool.frontends import pools as frontend
from fairpool.settings import ResourceSettings
from fairpool.store.records import Policy, Pool

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def demand(**settings: object) -> dict[str, int]:
    """A request map exactly as a ZenML step with these ResourceSettings would send it."""
    return ResourceSettings.model_validate(settings).requested_resources()


@dataclass
class World:
    """Pools, policies (component -> pool), running allocations and a queue, by name."""

    pools: dict[str, Pool] = field(default_factory=dict)
    policies: dict[tuple[str, str], Policy] = field(default_factory=dict)
    running: list[Allocation] = field(default_factory=list)
    queue: list[Request] = field(default_factory=list)
    now: float = 1_000.0

    def pool(self, name: str, capacity: Mapping[str, int]) -> World:
        self.pools[name] = Pool(name, name, None, EPOCH, EPOCH, dict(capacity))
        return self

    def policy(
        self,
        component: str,
        pool: str,
        priority: int = 0,
        reserved: Mapping[str, int] | None = None,
        limit: Mapping[str, int] | None = None,
    ) -> World:
        self.policies[(component, pool)] = Policy(
            f"{component}@{pool}", pool, component, priority, EPOCH, EPOCH,
            dict(reserved or {}), dict(limit or {}),
        )
        return self

    def placements(self, component: str, amounts: Mapping[str, int]) -> tuple[Placement, ...]:
        mine = [p for (c, _), p in self.policies.items() if c == component]
        return frontend.placements(amounts, mine, self.pools)

    def run(
        self,
        request_id: str,
        component: str,
        pool: str,
        amounts: Mapping[str, int],
        at: float = 0.0,
        preemptible: bool = True,
    ) -> World:
        policy = self.policies[(component, pool)]
        placement = Placement(pool, (Charge(policy.id, dict(amounts)),), policy.priority)
        self.running.append(Allocation(request_id, placement, at, preemptible))
        return self

    def wait(
        self,
        request_id: str,
        component: str,
        amounts: Mapping[str, int],
        at: float = 0.0,
        preemptible: bool = True,
    ) -> World:
        placements = self.placements(component, amounts)
        self.queue.append(Request(request_id, at, placements, preemptible))
        return self

    def snapshot(self) -> Snapshot:
        nodes = {p.id: frontend.pool_node(p) for p in self.pools.values()}
        for (component, pool), policy in self.policies.items():
            nodes[policy.id] = frontend.policy_node(policy, self.pools[pool], component)
        return Snapshot(self.now, nodes, tuple(self.running), tuple(self.queue))

    def plan(self) -> Plan:
        return reconcile(self.snapshot())

    def apply(self, snapshot: Snapshot, plan: Plan) -> None:
        """What ``plan`` leaves: its victims gone, its grants running, the rest queued."""
        victims = {p.victim_id for p in plan.preemptions}
        self.running = [a for a in self.running if a.request_id not in victims]
        by_id = {r.id: r for r in self.queue}
        for grant in plan.grants:
            request = by_id[grant.request_id]
            self.running.append(Allocation(
                request.id, request.placements[grant.placement_index], snapshot.now,
                request.preemptible,
            ))
        done = {g.request_id for g in plan.grants} | {r.request_id for r in plan.rejections}
        self.queue = [r for r in self.queue if r.id not in done]


def outcome(plan: Plan, snapshot: Snapshot) -> dict[str, str]:
    """request id -> "allocated:<pool>" | "rejected" | "waiting" | "preempted:<rule>"."""
    by_id = {r.id: r for r in snapshot.queue}
    result: dict[str, str] = {}
    for grant in plan.grants:
        result[grant.request_id] = (
            f"allocated:{by_id[grant.request_id].placements[grant.placement_index].queue}"
        )
    for rejection in plan.rejections:
        result[rejection.request_id] = "rejected"
    for request_id in queue_entries(plan):
        result[request_id] = "waiting"
    for preemption in plan.preemptions:
        result[preemption.victim_id] = f"preempted:{preemption.rule.value}"
    return result


def only(items: Sequence[object]) -> object:
    assert len(items) == 1, items
    return items[0]
