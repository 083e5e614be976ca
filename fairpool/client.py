"""The Python SDK: the CLI's operations, and submit, wait, hold with heartbeats, release.

``Client()`` talks to a server when ``FAIRPOOL_URL`` (or ``url=``) is set, else works directly
on the embedded SQLite store: the same calls, the same answers.

    from fairpool import Client, ResourceSettings
    client = Client()
    with client.acquire(ResourceSettings(gpu_count=2), component="team-a-orch") as grant:
        train(grant.resources)        # heartbeats run in the background

A preemption reaches the holder within one heartbeat interval: as ``Preempted`` raised in the
main thread (when it holds the grant there), and from ``grant.check()`` anywhere. Used as a
decorator, ``acquire`` runs the function again on the retry attempt the server queued, as long
as the request's ``max_retries`` allows.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Self, TypeVar

from fairpool import backends
from fairpool.errors import (
    Conflict,
    FairpoolError,
    InvalidInput,
    NotFound,
    Unreachable,
    from_database,
    said,
    validate_int,
)
from fairpool.leases import (
    DEFAULT_LEASE_TTL,
    MAX_RETRIES,
    beat_failed,
    gave_up,
    holding,
    interrupted,
    kept_next,
    lost_as_it_ended,
    not_followed,
    passing,
    still_waiting,
    wait_timeout,
)
from fairpool.paging import Page
from fairpool.settings import ResourceSettings, request_map
from fairpool.signals import resent_from_finalizer, signal_main
from fairpool.views import (
    ComponentView,
    EventView,
    PassSummary,
    PolicyView,
    PoolView,
    PruneProgress,
    PruneView,
    RequestView,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fairpool.async_client import AsyncGrant
    from fairpool.remote import RemoteScheduling, RemoteTrees
    from fairpool.scheduling import SchedulingService
    from fairpool.trees_service import TreesService

P = ParamSpec("P")
T = TypeVar("T")



class NotGranted(FairpoolError):
    """The request ended without an allocation (rejected, cancelled) or was taken back."""

    def __init__(self, request: RequestView) -> None:
        super().__init__(
            f"request {request.id} was {request.status}: {request.status_reason or 'no reason'}"
        )
        self.request = request


class Rejected(NotGranted):
    pass


class Cancelled(NotGranted):
    pass


class Preempted(NotGranted):
    pass


class WaitTimeout(FairpoolError):
    """A wait ran out with the request queued. ``request``: as it is now (cancelled, when
    ``acquire`` withdrew it: it said "still queued" of a request it had cancelled);
    ``waited``: as the wait left it, queued, with its places."""

    def __init__(self, request: RequestView, waited: RequestView | None = None) -> None:
        queued = waited or request
        where = "; ".join(f"{q.pool} #{q.position}: {q.reason}" for q in queued.queue)
        if request.status == "queued":
            message = f"request {request.id} still queued ({where or 'no queue'})"
        else:
            message = (f"request {request.id} {request.status_reason or request.status} "
                       f"(it was queued: {where or 'no queue'})")
        super().__init__(message)
        self.request = request
        self.waited = queued

    def withdrawn(self, request: RequestView) -> WaitTimeout:
        """The same timeout, said of ``request`` as its cancel left it."""
        return WaitTimeout(request, self.waited)


_ENDINGS: dict[str, type[NotGranted]] = {
    "rejected": Rejected,
    "cancelled": Cancelled,
    "preempted": Preempted,
    "released": Cancelled,
}


def not_granted(request: RequestView) -> NotGranted:
    """Why ``request`` holds no units, as the exception to raise: ``Rejected``,
    ``Preempted``, ``Cancelled`` (cancelled or released), else ``NotGranted``."""
    return _ENDINGS.get(request.status, NotGranted)(request)


def granted_repr(grant: Grant | AsyncGrant) -> str:
    """A grant as ``repr`` shows it: its request, pool and units."""
    return (f"<fairpool.{type(grant).__name__} of request {grant.id} on pool {grant.pool}: "
            f"{grant.resources}>")


class Grant:
    """A held allocation: what was granted, and a heartbeat keeping it alive."""

    def __init__(self, client: Client, request: RequestView, interval: float) -> None:
        self.request = request
        self.lost: RequestView | None = None
        #: The heartbeat interrupted the main thread to tell it of ``lost`` (a
        #: KeyboardInterrupt there is ours, not a Ctrl-C).
        self.interrupted = False
        #: The heartbeat heard of ``lost`` in a thread it cannot interrupt: the block ran on.
        self.ran_on = False
        self._client = client
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._main = threading.current_thread() is threading.main_thread()
        #: The process holding it: a child forked in the block leaves it to its parent.
        self._pid = os.getpid()
        # A process that ignores SIGINT (a job a shell started in the background) or leaves it
        # to the OS could not be interrupted in a blocking call: while held, SIGINT gets a
        # handler that raises for the heartbeat's interrupt and does as before for anyone
        # else's. SIGTERM or SIGHUP left to the OS would end the process without a release
        # (the units idle until the lease expires): while held, it ends the block instead.
        self._held = (
            [h for s in (signal.SIGINT, *_STOPPING_SIGNALS) if (h := _HeldSignal.hold(s))]
            if self._main else []
        )
        self._thread = threading.Thread(target=self._beat, args=(interval,), daemon=True,
                                        name=f"fairpool-heartbeat-{request.id[:8]}")
        self._thread.start()

    def __repr__(self) -> str:
        return granted_repr(self)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def pool(self) -> str | None:
        return self.request.pool

    @property
    def resources(self) -> dict[str, int]:
        return self.request.resources

    def check(self) -> None:
        """Raise ``Preempted`` (or why else the units were lost) if they are gone."""
        if self.lost is not None:
            raise not_granted(self.lost)

    def finish(self) -> RequestView | None:
        """Stop the heartbeat and give the units back; returns why they were lost, if so. A
        Ctrl-C, SIGTERM or SIGHUP during the release waits for it, then does what it would
        have (a Ctrl-C cut the release short, the units held until the lease ran out:
        helper-84). The heartbeat, stopped first, sends no interrupt of its own then. In a
        child forked in the block, nothing: the grant is its parent's, which holds on (the
        child's exit released it, helper-84)."""
        if os.getpid() != self._pid:
            return None
        try:
            with self._lock:
                self._stop.set()
            for held in self._held:
                held.shielded += 1
            try:
                self._thread.join(timeout=10)  # a heartbeat riding out an outage: seconds
                if self.lost is None:
                    self._release()
            finally:
                for held in self._held:
                    held.shielded -= 1
        finally:
            for held in self._held:
                held.let_go()
        for held in self._held:
            held.replay()
        return self.lost

    def _release(self) -> None:
        try:
            self._client.release(self.request.id)
        except Conflict:
            # Preempted, expired or released between two heartbeats.
            self.lost = self._client.get(self.request.id)
        except Exception as error:
            # The block's work is done: not lost for want of a release the lease makes
            # anyway (as ``fairpool run`` goes on), the database out of reach or full.
            if not isinstance(error, Unreachable) and not from_database(error):
                raise
            log.warning("%s; the units go back when the lease expires", said(error))

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                request = self._client.heartbeat(self.request.id)
            except Exception as error:  # the thread must live on: none was told otherwise
                failed = beat_failed(self.request, error)
                if failed is None:
                    continue  # a miss: the lease covers a few
                request = failed
            if request.status != "allocated":
                with self._lock:
                    self.lost = request
                    if self._main and not self._stop.is_set():
                        self.interrupted = True
                        _interrupt_main()
                    self.ran_on = not self._main
                if self.ran_on and request.retried_as_id is not None:
                    # Nothing interrupts another thread: its block runs on to its end, and
                    # never follows the retry attempt, which would get units nobody uses.
                    with contextlib.suppress(FairpoolError):  # ended, or the lease will
                        self._client.cancel(request.retried_as_id, not_followed(thread=True))
                elif request.retried_as_id is not None:
                    self._keep(request.retried_as_id, interval)
                return

    def _keep(self, retry: str | None, interval: float) -> None:
        """Heartbeat the retry attempt while the interrupted function unwinds, until the
        grant finishes: then it is followed (the decorator), or cancelled (``_finish``). A
        function that saved a checkpoint for longer than the lease found it expired, granted
        to nobody meanwhile, and was not run again (helper-84)."""
        while retry is not None and not self._stop.wait(interval):
            try:
                retry = kept_next(retry, self._client.heartbeat(retry))
            except (Conflict, NotFound):  # it ended meanwhile
                return
            except Exception as error:
                if not passing(error):
                    return


class Client:
    """The CLI's operations in Python, on a server (``url``, else ``FAIRPOOL_URL``; ``token``,
    else ``FAIRPOOL_TOKEN``) or, without one, directly on a database (``database_url``, else
    ``FAIRPOOL_DATABASE_URL``) or the embedded store under ``home`` (else ``FAIRPOOL_HOME``).
    ``url``, ``database_url`` or ``home`` given wins over the variables; with both variables
    set, the server is used. Answers are the CLI's views (``as_dict()`` is its JSON); bad input
    raises ``InvalidInput`` naming the field, an unknown name or id ``NotFound``, a refused
    change ``Conflict`` (all ``FairpoolError``). The scheduler config and the pool trees are
    ``client.scheduling`` and ``client.trees``."""

    def __init__(
        self, url: str | None = None, *, home: str | None = None, token: str | None = None,
        database_url: str | None = None,
    ) -> None:
        given = [name for name, value in
                 (("url", url), ("database_url", database_url), ("home", home)) if value]
        url, database_url = backends.target(url or os.environ.get("FAIRPOOL_URL"),
                                            database_url or os.environ.get("FAIRPOOL_DATABASE_URL"),
                                            given)
        token = token or os.environ.get("FAIRPOOL_TOKEN")
        self._service = backends.open_service(url, token, home, database_url)

    def __repr__(self) -> str:
        return f"<fairpool.Client on {self.where}>"

    @property
    def where(self) -> str:
        """What it works on: ``server URL`` or ``database URL``, a password hidden."""
        return backends.where(self._service)

    @functools.cached_property
    def scheduling(self) -> SchedulingService | RemoteScheduling:
        """The declarative scheduler config: ``apply_config``, ``submit_workload``, ..."""
        return backends.scheduling_of(self._service)

    @functools.cached_property
    def trees(self) -> TreesService | RemoteTrees:
        """The fair-share pool trees: ``create_tree``, ``start_operation``, ..."""
        return backends.trees_of(self._service)

    # -- pools ---------------------------------------------------------------------------

    def create_pool(
        self, name: str, capacity: Mapping[str, int], description: str | None = None
    ) -> PoolView:
        return self._service.create_pool(name, capacity, description)

    def update_pool(
        self,
        ref: str,
        capacity: Mapping[str, int] | None = None,
        description: str | None = None,
    ) -> PoolView:
        """New totals for the keys given (0 removes a key), and/or a new description."""
        return self._service.update_pool(ref, capacity, description)

    def delete_pool(self, ref: str) -> None:
        self._service.delete_pool(ref)

    def get_pool(self, ref: str) -> PoolView:
        """The pool (name or id) with its policies, active and queued requests."""
        return self._service.get_pool(ref)

    def list_pools(self) -> list[PoolView]:
        return self._service.list_pools()

    def pool_requests(
        self, ref: str, view: Literal["queued", "active", "all"] = "all"
    ) -> list[RequestView]:
        return self._service.pool_requests(ref, view)

    # -- policies ------------------------------------------------------------------------

    def attach_policy(
        self,
        pool: str,
        component: str,
        component_type: str = "orchestrator",
        priority: int = 0,
        reserved: Mapping[str, int] | None = None,
        limit: Mapping[str, int] | None = None,
    ) -> PolicyView:
        """Attach ``component``'s policy to ``pool`` (``Conflict`` if it has one there:
        ``update_policy`` changes it)."""
        return self._service.attach_policy(
            pool, component, component_type, priority, reserved, limit
        )

    def update_policy(
        self,
        pool: str,
        component: str,
        component_type: str = "orchestrator",
        *,
        priority: int | None = None,
        reserved: Mapping[str, int] | None = None,
        limit: Mapping[str, int] | None = None,
    ) -> PolicyView:
        """Change ``component``'s policy on ``pool`` in place, in use or not: what is given
        replaces what it had (``reserved`` and ``limit`` each as a whole map). Allocations
        keep their units; the queue is decided by the new policy from now on."""
        return self._service.update_policy(
            pool, component, component_type, priority, reserved, limit
        )

    def detach_policy(
        self, pool: str, component: str, component_type: str = "orchestrator"
    ) -> None:
        self._service.detach_policy(pool, component, component_type)

    def list_policies(
        self,
        pool: str | None = None,
        component: str | None = None,
        component_type: str | None = None,
    ) -> list[PolicyView]:
        return self._service.list_policies(pool, component, component_type)

    # -- components ----------------------------------------------------------------------

    def list_components(self, component_type: str | None = None) -> list[ComponentView]:
        """Components (who asks for units): their pools and live requests."""
        return self._service.list_components(component_type)

    # -- requests ------------------------------------------------------------------------

    def submit(
        self,
        settings: ResourceSettings | Mapping[str, int],
        *,
        component: str,
        component_type: str = "orchestrator",
        max_retries: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: int | None = DEFAULT_LEASE_TTL,
    ) -> RequestView:
        """Create a request; the answer already carries the decision. With a ``lease_ttl``
        (seconds), the units go back when no heartbeat comes for that long; ``None``: held
        until released."""
        demand: Mapping[str, int]
        if isinstance(settings, ResourceSettings):
            demand = request_map(settings)
            preemptible = settings.preemptible
        elif settings is None:  # the service would read it as no resources at all
            raise InvalidInput("resources", settings, "must be a mapping")
        else:
            demand, preemptible = settings, True  # the service checks it is a mapping
        return self._service.create_request(
            component=component, component_type=component_type, demand=demand,
            preemptible=preemptible, max_retries=max_retries, labels=labels,
            lease_ttl=lease_ttl,
        )

    def get(self, ref: str) -> RequestView:
        """The request (id or unique id prefix), with its queue position per pool."""
        return self._service.get_request(ref)

    def events(self, ref: str) -> list[EventView]:
        """The request's history, oldest first: each change of its status with the reason
        given then (``created``, ``allocated``, ``preempted``, ``retried``, ...)."""
        return self._service.request_events(ref)

    def list_requests(
        self, status: str | None = None, component: str | None = None, pool: str | None = None
    ) -> list[RequestView]:
        """Every request the filters match, oldest first."""
        return self._service.list_requests(status, component, pool)

    def request_page(
        self,
        status: str | None = None,
        component: str | None = None,
        pool: str | None = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        after: str | None = None,
    ) -> Page[RequestView]:
        """Requests ``offset`` to ``offset + limit`` (``limit`` None: to the end) of those
        the filters match, oldest first, and ``total``: how many they match. ``after``: a
        page's ``next``, to go on where it ended, wherever deletes since have moved it."""
        return self._service.request_page(status, component, pool, limit=limit, offset=offset,
                                          after=after)

    def wait(self, ref: str, timeout: float | None = None) -> RequestView:
        """Block until the request leaves the queue (or ``timeout`` seconds pass)."""
        timeout = wait_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            request = self._service.wait(ref, max(0.0, left))
            if request.status != "queued" or (deadline is not None and left <= 0):
                return request

    def heartbeat(self, ref: str) -> RequestView:
        """Renew the request's lease; the answer is the request as it stands (preempted?)."""
        return self._service.heartbeat(ref)

    def release(self, ref: str) -> RequestView:
        return self._service.release_request(ref)

    def cancel(self, ref: str, reason: str | None = None) -> RequestView:
        """Withdraw a queued or allocated request; ``reason`` is kept as why."""
        return self._service.cancel_request(ref, reason)

    def delete(self, ref: str) -> None:
        """Delete the request and its history (its units go back if it held any)."""
        self._service.delete_request(ref)

    def reconcile(self) -> PassSummary:
        """Run one pass now (every change already runs one)."""
        return self._service.reconcile()

    def prune(
        self, older_than: int, *, dry_run: bool = False, progress: PruneProgress | None = None
    ) -> PruneView:
        """Delete what ended more than ``older_than`` seconds ago: finished requests and their
        history, finished workloads and operations (``dry_run``: count them). Nothing live is
        touched. On a server, admins only; a call per part of bounded size there.
        ``progress``: told what is deleted so far, as it goes."""
        return self._service.prune(older_than, dry_run=dry_run, progress=progress)

    def close(self) -> None:
        """Close the connections to the server or the embedded database."""
        self._service.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def acquire(
        self,
        settings: ResourceSettings | Mapping[str, int],
        *,
        component: str,
        component_type: str = "orchestrator",
        max_retries: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        timeout: float | None = None,
    ) -> _Acquire:
        """Submit, wait, hold with heartbeats, release on exit (exceptions and Ctrl-C too)."""
        interval, timeout = holding(lease_ttl, timeout)
        request = functools.partial(
            self.submit, settings, component=component, component_type=component_type,
            max_retries=max_retries, labels=labels, lease_ttl=lease_ttl,
        )
        return _Acquire(self, request, interval, timeout, max_retries)


#: One ``acquire(...)`` entered again while in use (in another thread, nested): its exit
#: would release the other's grant, and leave its own held for ever.
HELD_ALREADY = ("this acquire(...) is in use already (waiting or holding): enter it once at a "
                "time, or call acquire(...) again for another grant")


class _Acquire:
    """``with client.acquire(...) as grant:`` or ``@client.acquire(...)``."""

    def __init__(
        self,
        client: Client,
        submit: Callable[[], RequestView],
        interval: float,
        timeout: float | None,
        max_retries: int,
    ) -> None:
        self._client = client
        self._submit = submit
        self._interval = interval
        self._timeout = timeout
        self._max_retries = max_retries
        self._grant: Grant | None = None
        #: Entered, from the submit on (a second entry while the first waits is refused too).
        self._entered = threading.Lock()

    def __enter__(self) -> Grant:
        runs_once(self._max_retries)
        if not self._entered.acquire(blocking=False):
            raise RuntimeError(HELD_ALREADY)
        try:
            self._grant = self._start(self._submit)
        except BaseException:
            self._entered.release()
            raise
        return self._grant

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        grant, self._grant = self._grant, None
        assert grant is not None
        try:
            _finish(grant, kind)
        finally:
            self._entered.release()

    def __call__(self, function: Callable[P, T]) -> Callable[P, T]:
        if (inspect.isgeneratorfunction(function) or inspect.iscoroutinefunction(function)
                or inspect.isasyncgenfunction(function)):
            # Called, such a function only makes an object: the units would be given back
            # before its body ran.
            raise _not_plain(function)

        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            request = self._submit
            while True:
                try:
                    # Its own grant per call: the function may run in several threads at
                    # once, or call itself. A retry attempt preempted before it was read
                    # raises here, and is followed as well.
                    grant = self._start(request)
                    try:
                        result = function(*args, **kwargs)
                        if (inspect.isgenerator(result) or inspect.iscoroutine(result)
                                or inspect.isasyncgen(result)):
                            # Wrapped in a plain function (functools.wraps), it passed the
                            # check above; its body has not run, and will not.
                            if inspect.isgenerator(result) or inspect.iscoroutine(result):
                                result.close()
                            raise _not_plain(function)
                    except BaseException as error:
                        _finish(grant, type(error))
                        raise
                    _finish(grant, None)
                    return result
                except Preempted as preempted:
                    # The server queued a retry attempt when max_retries allowed one, in the
                    # pass that preempted: the answer that told of it names it.
                    retry = preempted.request.retried_as_id
                    if retry is None:
                        raise
                    request = functools.partial(self._follow, retry)

        return run

    def _follow(self, retry: str) -> RequestView:
        """The retry attempt to wait for. Read again, the preempted one's answer was lost
        where the server had gone away meanwhile, and the error named neither (helper-84)."""
        try:
            return self._client.get(retry)
        except Unreachable as error:
            raise Unreachable(still_waiting("Retry attempt", retry, error)) from None

    def _start(self, make: Callable[[], RequestView]) -> Grant:
        """Make the request (submit it, or read the retry attempt), wait for it, then hold
        it; a request still queued on the way out (timeout, Ctrl-C, SIGTERM) is cancelled so
        it does not get units nobody will use. A SIGTERM or a Ctrl-C during the submit waits
        for its answer, which tells what to cancel."""
        main = threading.current_thread() is threading.main_thread()
        held = [h for s in (*_STOPPING_SIGNALS, signal.SIGINT)
                if main and (h := _HeldSignal.hold(s))]
        try:
            for signalled in held:
                signalled.shielded += 1
            try:
                request = make()
            finally:
                for signalled in held:
                    signalled.shielded -= 1
            try:
                for signalled in held:
                    signalled.replay()
                if request.status == "queued":
                    request = self._client.wait(request.id, self._timeout)
                if request.status == "queued":
                    raise WaitTimeout(request)
            except Unreachable:  # nothing to cancel it with; the error says what to do
                raise
            except BaseException as error:
                # Granted meanwhile, perhaps: a cancel releases it then.
                try:
                    reason = stopped_waiting(error, self._timeout)
                    cancelled = self._client.cancel(request.id, reason)
                except (Conflict, NotFound):  # it ended meanwhile, or was deleted
                    pass
                except BaseException as failed:  # the caller's error stays the error
                    # A second Ctrl-C left it queued, unnamed (helper-84): it goes up, said.
                    log.warning("%s", still_waiting("Resource request", request.id, failed))
                    if not isinstance(failed, FairpoolError):
                        raise
                else:
                    if isinstance(error, WaitTimeout):
                        raise error.withdrawn(cancelled) from None
                raise
            if request.status != "allocated":
                raise not_granted(request)
            return Grant(self._client, request, self._interval)
        finally:
            for signalled in held:
                signalled.let_go()


def _not_plain(function: Callable[..., object]) -> TypeError:
    return TypeError(
        f"Client.acquire() decorates a plain function (not {function!r}): use "
        "AsyncClient.acquire() for an async def, `with client.acquire(...)` inside a generator"
    )


def stopped_waiting(error: BaseException, timeout: float | None) -> str:
    """The cancel reason of a request its ``acquire`` stopped waiting for by ``error``."""
    if isinstance(error, WaitTimeout) and timeout is not None:
        return gave_up(timeout)
    code = error.code if isinstance(error, SystemExit) else None
    if isinstance(code, int) and code - 128 in _STOPPING_SIGNALS:
        # The grant's own handler's SystemExit: the signal, as `fairpool run` names it.
        return interrupted(signal.Signals(code - 128).name)
    return interrupted(type(error).__name__)


def runs_once(max_retries: int) -> None:
    """A ``with`` block runs once: the retry attempt a preemption queued would get units
    nobody uses (until its lease ended). Refused before anything is submitted."""
    validate_int("max_retries", max_retries, 0, MAX_RETRIES)
    if max_retries:
        raise InvalidInput(
            "max_retries", max_retries, "a with block runs once; use acquire as a decorator to "
            "run the function again on the retry attempt"
        )


def _finish(grant: Grant, kind: type[BaseException] | None) -> None:
    """Release ``grant`` as its block ends (by ``kind``, or normally); a grant lost on the way
    (preempted, expired) raises unless the block ended of its own accord (returned, or
    raised), before it was told: its retry attempt, which nobody will run then, is
    cancelled, as ``fairpool run`` does for a command that ended by itself."""
    try:
        lost = grant.finish()
    except KeyboardInterrupt:
        if grant.lost is None:  # a Ctrl-C of the program's: not swallowed
            raise
        # The heartbeat's interrupt landed while we were already leaving.
        lost = grant.lost
    if lost is None:
        return
    # Told of the loss (the heartbeat's interrupt), whatever the block made of it (a
    # SystemExit, a RuntimeError of a framework's), it is the loss that ended the block.
    if (kind is not None and issubclass(kind, NotGranted)) or grant.interrupted:
        raise not_granted(lost) from None
    if kind is None:  # its work is done: run again, a decorated function did it twice
        log.warning("%s", lost_as_it_ended(lost, "block", ran_on=grant.ran_on))
    if lost.retried_as_id is not None and not grant.ran_on:  # else cancelled when heard
        with contextlib.suppress(Conflict, Unreachable):  # ended meanwhile; or the lease will
            grant._client.cancel(lost.retried_as_id, not_followed())


#: What ends a holder from outside, where the program left it to the OS: ``kill``, and a
#: closed terminal or SSH session (SIGHUP). Either ends the blocks (``SystemExit``), which
#: release on the way out; the process ended at once before, its units held until the lease
#: ran out.
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

#: Set just before a grant's heartbeat sends SIGINT to the main thread.
_interrupting = threading.Event()


class _HeldSignal:
    """A signal's handler while grants are held in the main thread. SIGINT: the heartbeat's
    interrupt raises ``KeyboardInterrupt`` (``Preempted`` as the block ends), whatever the
    program made of SIGINT; anyone else's SIGINT does what it did before (the program's
    handler, nothing, or the end of the process). SIGTERM or SIGHUP, where the program left
    it to the OS: ``SystemExit(128 + its number)`` (the status a shell shows for it), so the
    blocks end and release on the way out. Shared by the grants held at once, in whatever order
    they end: the last to end puts the old disposition back, unless the signal has been
    given another handler since."""

    def __init__(self, signum: int, before: Any) -> None:
        self.signum = signum
        self.before = before
        self.holders = 0
        #: SIGTERM, SIGHUP: calls under way that it must not cut short (a submit, a
        #: release), and whether one came meanwhile.
        self.shielded = 0
        self.deferred = False

    @classmethod
    def hold(cls, signum: int) -> _HeldSignal | None:
        """As a grant starts: the handler it shares, installed if need be; None where the
        program handles or ignores SIGTERM, or the signal's handler is not Python's to
        change."""
        current = signal.getsignal(signum)
        if isinstance(current, cls):
            held = current
        elif current is not None and (signum == signal.SIGINT or current is signal.SIG_DFL):
            held = cls(signum, current)
            if signum == signal.SIGINT:
                _interrupting.clear()
            signal.signal(signum, held)
        else:
            return None
        held.holders += 1
        return held

    def let_go(self) -> None:
        """As a grant ends."""
        self.holders -= 1
        still_ours = signal.getsignal(self.signum) is self
        if self.holders == 0 and still_ours:
            signal.signal(self.signum, self.before)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if resent_from_finalizer(signum, frame):
            return
        if self.shielded and not _interrupting.is_set():
            self.deferred = True  # the call goes on; ``replay`` once it is done
            return
        self._act(signum, frame)

    def replay(self) -> None:
        """What a signal deferred during the shielded calls does, once the last is done."""
        if self.deferred and not self.shielded:
            self.deferred = False
            self._act(self.signum, None)

    def _act(self, signum: int, frame: object) -> None:
        if signum in _STOPPING_SIGNALS:
            raise SystemExit(128 + signum)
        if _interrupting.is_set():
            _interrupting.clear()
            raise KeyboardInterrupt
        if self.before is signal.SIG_DFL:  # what the OS would have done: end the process
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        elif callable(self.before):
            self.before(signum, frame)


def _interrupt_main() -> None:
    """KeyboardInterrupt in the main thread now (``signal_main``)."""
    if isinstance(signal.getsignal(signal.SIGINT), _HeldSignal):
        _interrupting.set()
    signal_main(signal.SIGINT)
