"""Per-request explanations from a plan: queue positions and reasons, for views only.

The pass records waiting requests in groups (see ``WaitingGroup``); positions are derived here,
on demand, so a pass never pays for numbering a long queue.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from fairpool.engine.model import Plan, Reason


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """Where a waiting request stands in one queue, and what it waits for."""

    placement_index: int
    queue: str
    #: 1 = next in line; 0 = not eligible on this queue (``reason`` says why).
    position: int
    reason: Reason
    #: True when this waiter holds free units back from requests behind it.
    holding: bool = False


def queue_entries(plan: Plan) -> dict[str, tuple[QueueEntry, ...]]:
    """For every request still waiting after ``plan``: one entry per placement."""
    granted = {g.request_id for g in plan.grants}
    ordered: dict[str, list[tuple[tuple[int, int], tuple[float, str], int, Reason, bool]]]
    ordered = defaultdict(list)
    entries: dict[str, list[QueueEntry]] = defaultdict(list)
    for group in plan.waiting:
        for member in group.members:
            request_id = member[1]
            if request_id in granted:
                continue
            if group.eligible:
                ordered[group.queue].append((
                    group.rank, member, group.placement_index, group.reason,
                    group.holder == request_id,
                ))
            else:
                entries[request_id].append(
                    QueueEntry(group.placement_index, group.queue, 0, group.reason)
                )
    waiting: set[str] = set()
    for queue, items in ordered.items():
        items.sort(key=lambda item: (item[0], item[1]))
        for position, (_, (_, request_id), index, reason, holding) in enumerate(items, 1):
            waiting.add(request_id)
            entries[request_id].append(QueueEntry(index, queue, position, reason, holding))
    return {
        request_id: tuple(sorted(found, key=lambda e: e.placement_index))
        for request_id, found in entries.items()
        if request_id in waiting
    }
