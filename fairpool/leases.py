"""A holder's lease: how long its units stay granted without a heartbeat, and how often the
SDK (sync and asyncio) and ``fairpool run`` send one. No imports: the CLI loads it."""

from __future__ import annotations

#: Seconds a held allocation survives without a heartbeat.
DEFAULT_LEASE_TTL = 60


def heartbeat_interval(lease_ttl: float) -> float:
    """Seconds between heartbeats: a third of the lease, so that two may be lost before it
    expires (a preemption is heard within one interval); at least 0.2."""
    return max(lease_ttl / 3, 0.2)
