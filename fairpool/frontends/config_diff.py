"""What changes between two scheduler configs, queue by queue (``fairpool config diff``).

Pure. One line per change, in the order a reader checks them: queues, then the flavors they
use, then the rules that route to them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from fairpool.frontends.config import ConfigIssue, SchedulerConfig


def _brief(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def diff_configs(old: SchedulerConfig, new: SchedulerConfig) -> tuple[str, ...]:
    """Lines saying what ``new`` adds, removes and changes relative to ``old``; () if equal."""
    lines: list[str] = []
    old_queues = {q.name: q for q in old.resource_queues}
    new_queues = {q.name: q for q in new.resource_queues}
    for name, queue in new_queues.items():
        kind = "passthrough queue" if queue.is_passthrough else "queue"
        if name not in old_queues:
            lines.append(f"+ {kind} {name}: added")
        elif old_queues[name].spec() != queue.spec():  # apply refuses this; say it anyway
            lines.append(f"~ {kind} {name}: spec changed")
    lines += [
        f"- queue {name}: removed (admitted workloads keep running, charged to no quota; "
        "queued ones are routed again)"
        for name in old_queues
        if name not in new_queues
    ]
    old_flavors = {f.name: f for f in old.resource_flavors}
    new_flavors = {f.name: f for f in new.resource_flavors}
    for name, flavor in new_flavors.items():
        if name not in old_flavors:
            lines.append(f"+ flavor {name}: added")
        elif old_flavors[name] != flavor:
            lines.append(
                f"~ flavor {name}: {_brief(old_flavors[name].to_dict())} -> "
                f"{_brief(flavor.to_dict())}"
            )
    lines += [f"- flavor {name}: removed" for name in old_flavors if name not in new_flavors]
    old_rules = [_brief(rule.to_dict()) for rule in old.scheduling_rules]
    new_rules = [_brief(rule.to_dict()) for rule in new.scheduling_rules]
    if old_rules != new_rules:
        for index in range(max(len(old_rules), len(new_rules))):
            before = old_rules[index] if index < len(old_rules) else None
            after = new_rules[index] if index < len(new_rules) else None
            if before == after:
                continue
            if before is None:
                lines.append(f"+ scheduling_rules[{index}]: {after}")
            elif after is None:
                lines.append(f"- scheduling_rules[{index}]: {before}")
            else:
                lines.append(f"~ scheduling_rules[{index}]: {before} -> {after}")
    return tuple(lines)


def summary(config: SchedulerConfig) -> dict[str, Any]:
    """What a version's record keeps of its config, so that listing versions and checking a
    new one against them never parses their documents again: its counts, and each queue's
    spec (``ResourceQueue.spec``) by name. JSON."""
    return {
        "flavors": len(config.resource_flavors),
        "queues": len(config.resource_queues),
        "rules": len(config.scheduling_rules),
        "queue_specs": {queue.name: queue.spec() for queue in config.resource_queues},
    }


def changed_queues(
    history: Iterable[tuple[int, Mapping[str, Any]]], config: SchedulerConfig
) -> list[ConfigIssue]:
    """A queue's spec is immutable per name across versions: each queue of ``config`` whose
    spec differs from the last one its name had in ``history`` (version numbers and their
    ``summary``'s ``queue_specs``, oldest first), at the field that differs."""
    latest: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for number, specs in history:
        latest.update((name, (number, spec)) for name, spec in specs.items())
    problems: list[ConfigIssue] = []
    for index, queue in enumerate(config.resource_queues):
        if queue.name not in latest:
            continue
        number, before = latest[queue.name]
        now = queue.spec()
        if before == now:
            continue
        field = "preemption" if before["preempts"] != now["preempts"] else "resource_groups"
        problems.append(ConfigIssue(
            f"resource_queues[{index}].{field}",
            f"queue {queue.name!r} differs from its spec in version {number}; a queue's "
            "spec cannot change once applied: give the changed queue a new name",
            reference=True,
        ))
    return problems
