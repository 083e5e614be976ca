"""``fairpool resource-request ...``: ZenML v1's ``zenml resource-request`` commands, plus
``create`` (ZenML creates requests only inside a step run; here anyone can ask for units)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FrameType
from typing import Any, NoReturn

import click

from fairpool.cli import output as o
from fairpool.cli.common import Seconds, parse_pairs, reason_option, service
from fairpool.errors import Conflict, NotFound, Unreachable, said
from fairpool.leases import MAX_LEASE_TTL, MAX_RETRIES, interrupted, still_waiting
from fairpool.signals import resent_from_finalizer
from fairpool.views import COMPONENT_TYPES, PREEMPTING, REQUEST_STATUSES, RequestView

REQUEST_COLUMNS = ("id", "status", "component", "pool", "resources", "reason", "created")
QUEUE_COLUMNS = ("pool", "position", "reason", "holding")

#: ``--wait`` asks in slices of this many seconds (a long-poll on a server, backing-off polls
#: embedded), so the position and reason it shows stay current.
WAIT_SLICE = 2.0
#: Exit code when ``--wait`` gives up (1 is a failed request, 2 also marks click usage errors).
EXIT_TIMEOUT = 2


class WaitTimeout(click.ClickException):
    exit_code = EXIT_TIMEOUT


def reason_of(request: dict[str, Any], pool: str | None = None) -> str:
    """Why a request is where it is: for a queued one the live reason of its queue entry in
    ``pool`` (a list filtered to it), else of its first (the stored reason dates from the
    last pass); else its status reason."""
    places = request.get("queue") or ()
    place = next((p for p in places if p.get("pool") == pool), places[0] if places else None)
    if request.get("status") == "queued" and place and place.get("reason"):
        return str(place["reason"])
    return str(request.get("status_reason") or "")


def queue_summary(request: dict[str, Any]) -> str:
    """``position 3 in pool `p`: reason`` for each pool the request waits in."""
    parts = []
    for place in request.get("queue") or ():
        position = place.get("position")
        where = f"position {position}" if position else "not eligible"
        holding = ", holding units" if place.get("holding") else ""
        parts.append(f"{where} in pool `{place.get('pool')}`{holding}: {place.get('reason')}")
    return "; ".join(parts)


def print_request(request: dict[str, Any], output: str) -> None:
    """One request: the object (json/yaml), or a key/value table plus its queue entries."""
    if output != "table":
        o.dump(request, output)
        return
    o.print_properties(
        f"Resource request '{request['id']}'",
        [
            ("id", request["id"]),
            ("status", request["status"]),
            ("reason", request.get("status_reason")),
            ("component", f"{request['component']} ({request['component_type']})"),
            ("pool", request.get("pool")),
            ("priority", request.get("priority")),
            ("resources", request["resources"]),
            ("preemptible", request["preemptible"]),
            ("attempt", f"{request['attempt']} of {request['max_retries'] + 1}"),
            ("previous_attempt_id", request.get("previous_attempt_id")),
            ("retried_as_id", request.get("retried_as_id")),
            ("preempted_by", request.get("preempted_by_id")),
            ("labels", request.get("labels")),
            ("created", request.get("created")),
            ("allocated_at", request.get("allocated_at")),
            ("released_at", request.get("released_at")),
            *(
                [("lease_ttl", f"{request['lease_ttl']} s"),
                 ("lease_expires_at", request.get("lease_expires_at"))]
                if request.get("lease_ttl") is not None else []
            ),
        ],
    )
    if request["status"] == "queued":
        # Position 0: a pool that can never serve it (it waits in none of its queues), not
        # the head of one; read as "next in line" (found by helper-66).
        places = [{**place, "position": place["position"] or "-"}
                  for place in request.get("queue") or []]
        o.print_section("Queue", places, QUEUE_COLUMNS, empty_message="not waiting in any pool.")


def declare_status(request: dict[str, Any]) -> None:
    status = request["status"]
    rid = request["id"]
    if status == "allocated":
        reason = request["status_reason"] or ""
        preempting = reason[reason.find(PREEMPTING):] if PREEMPTING in reason else ""
        o.declare(
            f"Resource request `{rid}` allocated in resource pool `{request['pool']}`{preempting}."
        )
    elif status == "queued":
        o.declare(f"Resource request `{rid}` queued: {queue_summary(request)}")
    else:
        o.declare(f"Resource request `{rid}` {status}: {reason_of(request) or 'no reason given'}")


@click.group("resource-request")
def resource_request() -> None:
    """Create, inspect and clean up resource requests."""


def request_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that describe a request (shared by ``resource-request create`` and
    ``fairpool run``), ZenML's ResourceSettings fields among them."""
    options = [
        click.option("--component", required=True,
                     help="Name of the requesting stack component."),
        click.option("--component-type", "-t", type=click.Choice(COMPONENT_TYPES),
                     default="orchestrator", show_default=True,
                     help="Kind of the requesting component."),
        click.option("--gpu-count", type=int, default=None,
                     help="GPUs (ResourceSettings.gpu_count)."),
        click.option("--cpu-count", type=float, default=None,
                     help="CPUs; becomes mcpu (x1000, ceil)."),
        click.option("--memory", default=None, help="Memory such as 16GiB; becomes memory_mb."),
        click.option("--pool-resource", "pool_resources", multiple=True, metavar="KEY=N",
                     help="Any pool resource key (repeatable), e.g. --pool-resource tpu=4."),
        click.option("--non-preemptible", is_flag=True, default=False,
                     help="Never preempted (it may preempt others); must fit within the policy's "
                     "reserved units."),
        click.option("--max-retries", type=click.IntRange(0, MAX_RETRIES), default=0,
                     show_default=True, help="Times to requeue after a preemption."),
        click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
                     help="Free-form label (repeatable)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def request_fields(
    component: str,
    component_type: str,
    gpu_count: int | None,
    cpu_count: float | None,
    memory: str | None,
    pool_resources: tuple[str, ...],
    non_preemptible: bool,
    max_retries: int,
    labels: tuple[str, ...],
) -> dict[str, Any]:
    """The service's ``create_request`` arguments from ``request_options``."""
    from fairpool.settings import ResourceSettings, request_map

    # model_validate: pydantic checks and converts the KEY=N strings (and names the bad one).
    settings = ResourceSettings.model_validate({
        "gpu_count": gpu_count,
        "cpu_count": cpu_count,
        "memory": memory,
        "pool_resources": parse_pairs("pool_resources", pool_resources) or None,
        "preemptible": not non_preemptible,
    })
    return {
        "component": component,
        "component_type": component_type,
        "demand": request_map(settings),
        "preemptible": settings.preemptible,
        "max_retries": max_retries,
        "labels": parse_pairs("labels", labels),
    }


@resource_request.command("create")
@request_options
@click.option("--lease-ttl", type=click.IntRange(1, MAX_LEASE_TTL), default=None,
              help="Seconds the allocation stays held without a heartbeat (default: until "
              "released).")
@click.option("--wait", is_flag=True, default=False,
              help="Reconcile and wait until the request is no longer queued; interrupted "
              "(Ctrl-C, SIGTERM, SIGHUP), cancel it.")
@click.option("--timeout", type=Seconds(min=0), default=None,
              help="With --wait: give up after this many seconds (exit code 2).")
@o.output_option
def create(lease_ttl: int | None, wait: bool, timeout: float | None, output: str,
           **fields: Any) -> None:
    """Ask for units: allocated now, queued, or rejected with the reason (exit 1)."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait.")
    request = request_fields(**fields)
    # Without --wait, an interrupted create is just that (the request made or not, as asked).
    guard: AbstractContextManager[list[int]] = holding_signals() if wait else nullcontext([])
    with (o.spinner(f"Creating resource request for component '{request['component']}'...\n"),
          guard as received):
        created = service().create_request(**request, lease_ttl=lease_ttl)
    if received:
        cancel_and_exit(created, received[0])
    data = created.as_dict()
    declare_status(data)
    if wait:
        data = wait_or_cancel(created, timeout)
    print_request(data, output)
    if wait:
        finish_wait(data)
    elif data["status"] == "rejected":  # said above; a script tells it by the exit code
        click.get_current_context().exit(1)


def wait_for(request_id: str, timeout: float | None) -> dict[str, Any]:
    """Reconcile and poll until the request leaves the queue or ``timeout`` passes; waiting
    position and reason go to stderr whenever they change."""
    svc = service()
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = ""
    # Where it stands right away; then short slices, so what is shown stays current.
    left = 0.0
    while True:
        data = svc.wait(request_id, max(left, 0.0)).as_dict()
        if data["status"] != "queued":
            return data
        summary = queue_summary(data)
        if summary != shown:
            o.declare(f"Waiting for resource request `{request_id}`: {summary}")
            shown = summary
        if deadline is not None and deadline - time.monotonic() <= 0:
            return data
        left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())


#: What ends a waiting or holding command from outside: Ctrl-C, ``kill``, a closed terminal
#: or a dropped SSH session.
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def catch_ending_signals(
    handler: Callable[[int, FrameType | None], Any] | signal.Handlers,
) -> dict[int, Any]:
    """``handler`` for the ``ENDING_SIGNALS`` this process does not ignore (``nohup``
    ignores SIGHUP, a shell SIGINT for a job it starts in the background: they must not
    end it); the handlers it replaced, for ``restore``."""
    return {s: signal.signal(s, handler) for s in ENDING_SIGNALS
            if signal.getsignal(s) != signal.SIG_IGN}


def restore(previous: Mapping[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def wait_or_cancel(request: RequestView, timeout: float | None) -> dict[str, Any]:
    """``request`` once it no longer waits (``wait_for``), or still queued once ``timeout``
    passed. Interrupted meanwhile (``ENDING_SIGNALS``), the request is cancelled, so that units
    nobody will use are never granted to it, and the command exits with 128 + the signal's
    number, as a shell reports a command the signal ended. A SIGHUP or SIGTERM within a
    second of the last signal (a closed terminal sends SIGHUP twice) leaves the cancel be; a
    second Ctrl-C, or a signal later than that, ends us at once, with the same status."""
    received: list[tuple[int, float]] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if resent_from_finalizer(signum, frame):
            return
        now = time.monotonic()
        again = bool(received) and now - received[-1][1] < 1.0 and signum != signal.SIGINT
        received.append((signum, now))
        if len(received) == 1:
            raise KeyboardInterrupt
        if not again:  # SystemExit: a KeyboardInterrupt escaped as "Aborted!", exit 1
            _exit_for(received[0][0], _interrupted_again(request.id))

    previous = catch_ending_signals(interrupt)
    signalled = False
    try:
        data = request.as_dict()
        return wait_for(request.id, timeout) if data["status"] == "queued" else data
    except KeyboardInterrupt:
        signalled = bool(received)
        if not signalled:
            raise
    except Exception as error:
        # A revoked token, a full disk: nobody waits any more. (Out of reach, the error says
        # what may be left queued.)
        if not isinstance(error, Unreachable):
            cancel_saying("Resource request", request.id, interrupted(type(error).__name__))
        raise
    finally:
        # Interrupted, the handlers stay to the exit: a repeated signal landing once they
        # were put back ended us by its default action, before the exit status was ours.
        if not signalled:
            restore(previous)
    cancel_and_exit(request, received[0][0])


def cancel_and_exit(request: RequestView, signum: int) -> NoReturn:
    """Interrupted by ``signum``: cancel ``request`` and exit with 128 + its number; a
    second Ctrl-C meanwhile exits at once, naming what may be left."""
    try:
        cancel_saying("Interrupted: resource request", request.id,
                      interrupted(signal.Signals(signum).name))
    except KeyboardInterrupt:  # a Ctrl-C with Python's handler (the submit's ``holding_signals``)
        _exit_for(signum, _interrupted_again(request.id))
    _exit_for(signum)


def _interrupted_again(request_id: str) -> str:
    return (f"Interrupted again: resource request `{request_id}` may not be cancelled: "
            f"cancel it with `fairpool resource-request cancel {request_id}`")


def _exit_for(signum: int, saying: str | None = None) -> NoReturn:
    """Exit with 128 + ``signum`` (after ``saying`` it). Further ending signals are ignored to
    the exit: as Python finalizes, it puts their default actions back, and a repeated one
    then ended us by that action, not with our status."""
    if saying is not None:
        o.declare(saying)
    catch_ending_signals(signal.SIG_IGN)
    sys.exit(128 + signum)


def cancel_saying(what: str, request_id: str, reason: str) -> None:
    """Cancel a request nobody will use (allocated meanwhile, that releases it) and say so.
    The server out of reach, say what is left waiting, to be granted to nobody (for ever
    without a lease), and how to cancel it."""
    try:
        service().cancel_request(request_id, reason)
    except (Conflict, NotFound):
        return  # it ended meanwhile, or was deleted
    except Exception as error:  # out of reach; a revoked token; a full disk
        o.declare(still_waiting(what, request_id, said(error)))
        return
    o.declare(f"{what} `{request_id}` cancelled: {reason}")


@contextmanager
def holding_signals() -> Iterator[list[int]]:
    """The ending signals received while the block runs, held until it ends: a submit cut
    short would leave a request nobody knows of, to be granted to nobody (the caller then
    ``cancel_and_exit``s); a release cut short, units held until the lease ran out."""
    received: list[int] = []

    def hold(signum: int, _: FrameType | None) -> None:
        received.append(signum)

    previous = catch_ending_signals(hold)
    try:
        yield received
    finally:
        # Not where an exit for a signal ignores them now (``cancel_and_exit``).
        restore({s: h for s, h in previous.items() if signal.getsignal(s) is hold})


def finish_wait(data: dict[str, Any]) -> None:
    """Exit status after ``--wait``: 0 allocated, 1 rejected/cancelled/preempted, 2 timeout."""
    status = data["status"]
    if status in ("allocated", "released"):
        return
    if status == "queued":
        raise WaitTimeout(
            f"timed out waiting for resource request `{data['id']}`, still queued: "
            f"{queue_summary(data) or reason_of(data)}"
        )
    raise click.ClickException(
        f"Resource request `{data['id']}` was {status}: {reason_of(data) or 'unknown reason'}"
    )


@resource_request.command("list")
@click.option("--status", type=click.Choice(REQUEST_STATUSES), default=None,
              help="Only requests with this status.")
@click.option("--component", default=None, help="Only this component's requests.")
@click.option("--pool", default=None, help="Only requests allocated in or queued on this pool.")
@o.page_options("requests")
@o.output_option
def list_requests(
    status: str | None, component: str | None, pool: str | None, page: tuple[int | None, int],
    output: str,
) -> None:
    """List resource requests, oldest first."""
    limit, offset = page
    o.print_page(
        service().request_page(status, component, pool, limit=limit, offset=offset),
        REQUEST_COLUMNS, output, empty_message="No resource requests found.",
        row_formatter=lambda row: {**row, "reason": reason_of(row, pool)},
    )


@resource_request.command("describe")
@click.argument("request_id_or_prefix")
@o.output_option
def describe(request_id_or_prefix: str, output: str) -> None:
    """Show one request: status, pool, resources, reason, queue positions, preemption."""
    print_request(service().get_request(request_id_or_prefix).as_dict(), output)


EVENT_COLUMNS = ("at", "kind", "pool", "message")


@resource_request.command("events")
@click.argument("request_id_or_prefix")
@o.output_option
def events(request_id_or_prefix: str, output: str) -> None:
    """Show a request's history: each change of its status with the reason given then
    (a deleted request's too, by its whole id)."""
    rows = [e.as_dict() for e in service().request_events(request_id_or_prefix)]
    o.print_list(rows, EVENT_COLUMNS, output, empty_message="No events found.")


@resource_request.command("release")
@click.argument("request_id_or_prefix")
def release(request_id_or_prefix: str) -> None:
    """Give an allocated request's units back to its pool."""
    request = service().release_request(request_id_or_prefix)
    o.declare(f"Released resource request `{request.id}`.")


@resource_request.command("cancel")
@click.argument("request_id_or_prefix")
@reason_option
def cancel(request_id_or_prefix: str, reason: str | None) -> None:
    """Withdraw a queued or allocated request."""
    request = service().cancel_request(request_id_or_prefix, reason)
    o.declare(f"Cancelled resource request `{request.id}`.")


@resource_request.command("delete")
@click.argument("request_id_or_prefix")
def delete(request_id_or_prefix: str) -> None:
    """Delete a request (no confirmation, as in ZenML)."""
    svc = service()
    request_id = svc.get_request(request_id_or_prefix).id
    svc.delete_request(request_id)
    o.declare(f"Deleted resource request `{request_id}`.")
