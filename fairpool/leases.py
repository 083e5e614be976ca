"""A holder's lease: how long its units stay granted without a heartbeat, and how often the
SDK (sync and asyncio) and ``fairpool run`` send one; and how often a preempted holder may
be retried. Light imports: the CLI loads it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from fairpool.errors import (
    FairpoolError,
    Forbidden,
    InvalidInput,
    NotFound,
    SchemaMoved,
    Unauthorized,
    validate_int,
)

if TYPE_CHECKING:
    from fairpool.views import RequestView

#: Seconds a held allocation survives without a heartbeat.
DEFAULT_LEASE_TTL = 60
#: The longest lease a request may ask for (30 days).
MAX_LEASE_TTL = 30 * 24 * 3600
#: The most retry attempts a request may ask for after preemptions.
MAX_RETRIES = 1000


#: The longest interval between heartbeats, the default lease's third: a lease made long to
#: ride out outages must not make a preemption go unheard for a third of it (20 minutes of
#: an hour's), the holder running on units that are another's.
MAX_HEARTBEAT_INTERVAL = 20.0


def heartbeat_interval(lease_ttl: float) -> float:
    """Seconds between heartbeats: a third of the lease, so that two may be lost before it
    expires (a preemption is heard within one interval); at least 0.2, at most
    ``MAX_HEARTBEAT_INTERVAL``."""
    return min(max(lease_ttl / 3, 0.2), MAX_HEARTBEAT_INTERVAL)


def holding(lease_ttl: object, timeout: object) -> tuple[float, float | None]:
    """An ``acquire``'s heartbeat interval and wait timeout, checked before it submits (in
    the service's words), so that a bad one leaves nothing behind."""
    ttl = validate_int("lease_ttl", lease_ttl, 1, MAX_LEASE_TTL)
    return heartbeat_interval(ttl), wait_timeout(timeout)


def wait_timeout(timeout: object) -> float | None:
    """A wait's ``timeout``: None (no limit), or a finite number of seconds >= 0. NaN would be
    a deadline that never comes, and the wait's loop would spin."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidInput("timeout", timeout, "must be a number of seconds")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput("timeout", timeout, "must be a finite number of seconds >= 0")
    return seconds


def gave_up(timeout: float) -> str:
    """Why a request still queued when its holder's wait timed out is cancelled."""
    return f"gave up waiting after {timeout:g} s"


def passing(error: BaseException) -> bool:
    """Whether a heartbeat's failure is one its lease rides out: anything but the server
    refusing the caller (``Unauthorized``, ``Forbidden``: a token revoked) or a store a
    newer fairpool migrated under this process (``SchemaMoved``), which fail every heartbeat
    from then on, so that the units go when the lease runs out and the holder must stop.
    The server or the database out of reach, the database's lock held past its timeout, a
    proxy's error, a server's 500 (a server's ``SchemaMoved`` too: behind a proxy, the next
    may reach a newer replica): the next heartbeat may get through."""
    return not isinstance(error, Unauthorized | Forbidden | SchemaMoved)


def kept_next(retry: str, answer: RequestView) -> str | None:
    """Which retry attempt to heartbeat next, while the preempted holder that will follow it
    stops, after a heartbeat of ``retry`` answered ``answer``: the same while it waits or is
    held (granted meanwhile, its lease runs from then, and a stop longer than the lease let
    it expire), its own retry attempt if it was preempted in turn, else None (it ended)."""
    if answer.status in ("queued", "allocated"):
        return retry
    return answer.retried_as_id if answer.status == "preempted" else None


def still_waiting(what: str, request_id: str, error: BaseException | str) -> str:
    """A request nobody will use that could not be cancelled (``error``; one that is not
    ours, a second Ctrl-C or a cancellation, cut the cancel short): granted later, its units
    would go to nobody (for ever without a lease) unless it is cancelled by hand."""
    still = "is still"
    if isinstance(error, BaseException) and not isinstance(error, FairpoolError):
        # Cut short anywhere: before the cancel, or after its commit.
        still, error = "may still be", (f"interrupted again ({type(error).__name__}) as it "
                                        "was being cancelled")
    return (f"{what} `{request_id}` {still} waiting ({error}): cancel it with "
            f"`fairpool resource-request cancel {request_id}`")


def interrupted(cause: str) -> str:
    """Why a request still queued when its holder stopped waiting (``cause``: a signal's or an
    exception's name) is cancelled."""
    return f"interrupted while waiting ({cause})"


def lost_as_it_ended(request: RequestView, holder: str, ran_on: bool = False) -> str:
    """What a holder (``holder``: "command", "block") that ended by itself is told of units
    it lost meanwhile without hearing of it (``ran_on``: in a thread nothing interrupts, it
    ran on after the loss was heard): its ending stands."""
    when = (f"while the {holder} ran on (nothing interrupts a thread but the main one)"
            if ran_on else f"as the {holder} ended")
    return f"Resource request `{request.id}` was {request.status} {when}: {request.status_reason}"


def not_followed(thread: bool = False) -> str:
    """Why a retry attempt is cancelled whose holder ended (its work done, or failed) before
    it heard of the preemption (``thread``: runs in a thread nothing interrupts, so it will
    not hear of it): nobody would run it."""
    if thread:
        return "not followed: its holder runs in a thread a preemption cannot interrupt"
    return "not followed: its holder ended before it heard of the preemption"


def deleted(request: RequestView) -> RequestView:
    """``request`` as its holder learns it was deleted (its units are free for others)."""
    return replace(request, status="deleted", status_reason="deleted while held")


def beat_failed(request: RequestView, error: Exception) -> RequestView | None:
    """What a heartbeat that raised ``error`` tells ``request``'s holder: it was deleted, or
    refused (not ``passing``: lost, its lease will run out and its units go to others); None
    for a miss the lease covers (the next beat tries again)."""
    if isinstance(error, NotFound):
        return deleted(request)
    if passing(error):
        return None
    return replace(request, status="lost", status_reason=f"heartbeat refused: {error}")
