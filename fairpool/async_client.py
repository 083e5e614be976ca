"""The Python SDK for asyncio code: ``Client``'s operations as coroutines, and ``acquire`` as
``async with``.

    from fairpool import AsyncClient
    async with AsyncClient() as client:
        async with client.acquire({"gpu": 2}, component="team-a-orch") as grant:
            await train(grant.resources)      # a preemption cancels this and raises Preempted

Each operation runs ``Client``'s on a worker thread, as both of its backends block (the
embedded store's SQLite, the server's HTTP client): the event loop never waits for them. Waits
have threads of their own (up to ``WAIT_THREADS``), so that however many tasks wait, the
heartbeats and other calls of the loop's default executor never queue behind a long-poll; each
long-polls in slices of at most ``WAIT_SLICE`` seconds, so that a cancelled wait leaves no
thread blocked for longer than that. A held grant heartbeats from a task of the loop; when a
heartbeat finds the units gone, it cancels the task holding the grant, and the ``async with``
turns that cancellation into ``Preempted`` (or why else they were lost), as ``asyncio.timeout``
turns its own into ``TimeoutError``: a cancellation from anyone else stays a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from fairpool.client import (
    HELD_ALREADY,
    Client,
    NotGranted,
    Preempted,
    WaitTimeout,
    granted_repr,
    not_granted,
    runs_once,
    stopped_waiting,
)
from fairpool.errors import Conflict, FairpoolError, NotFound, Unreachable
from fairpool.leases import (
    DEFAULT_LEASE_TTL,
    beat_failed,
    holding,
    kept_next,
    lost_as_it_ended,
    not_followed,
    passing,
    still_waiting,
    wait_timeout,
)
from fairpool.settings import ResourceSettings
from fairpool.views import RequestView

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: The longest single long-poll of a wait: how long a cancelled wait's thread may linger.
WAIT_SLICE = 10.0
#: Waits at once on their own threads; more wait for one of them to be free.
WAIT_THREADS = 32


def _on_thread(
    method: Callable[Concatenate[Client, P], T],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """``Client.method`` as a coroutine method of ``AsyncClient``, run on a worker thread."""

    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(method, self.client, *args, **kwargs)

    # Not functools.wraps: its type would hide the coroutine's signature from type checkers.
    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class AsyncClient:
    """``Client`` (same arguments, operations and answers) for asyncio code; ``client`` is the
    synchronous one it runs on."""

    def __init__(
        self, url: str | None = None, *, home: str | None = None, token: str | None = None,
        database_url: str | None = None,
    ) -> None:
        self.client = Client(url, home=home, token=token, database_url=database_url)
        self._waits = ThreadPoolExecutor(WAIT_THREADS, thread_name_prefix="fairpool-wait")

    def __repr__(self) -> str:
        return f"<fairpool.AsyncClient on {self.client.where}>"

    create_pool = _on_thread(Client.create_pool)
    update_pool = _on_thread(Client.update_pool)
    delete_pool = _on_thread(Client.delete_pool)
    get_pool = _on_thread(Client.get_pool)
    list_pools = _on_thread(Client.list_pools)
    pool_requests = _on_thread(Client.pool_requests)
    attach_policy = _on_thread(Client.attach_policy)
    update_policy = _on_thread(Client.update_policy)
    detach_policy = _on_thread(Client.detach_policy)
    list_policies = _on_thread(Client.list_policies)
    list_components = _on_thread(Client.list_components)
    submit = _on_thread(Client.submit)
    get = _on_thread(Client.get)
    events = _on_thread(Client.events)
    list_requests = _on_thread(Client.list_requests)
    request_page = _on_thread(Client.request_page)
    heartbeat = _on_thread(Client.heartbeat)
    release = _on_thread(Client.release)
    cancel = _on_thread(Client.cancel)
    delete = _on_thread(Client.delete)
    reconcile = _on_thread(Client.reconcile)
    prune = _on_thread(Client.prune)

    async def close(self) -> None:
        """Close the connections to the server or the embedded database."""
        self._waits.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.client.close)

    async def wait(self, ref: str, timeout: float | None = None) -> RequestView:
        """Until the request leaves the queue (or ``timeout`` seconds pass)."""
        timeout = wait_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            request = await asyncio.get_running_loop().run_in_executor(
                self._waits, self.client.wait, ref, min(left, WAIT_SLICE)
            )
            if request.status != "queued" or (
                deadline is not None and time.monotonic() >= deadline
            ):
                return request

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

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
    ) -> AsyncAcquire:
        """``async with``: submit, wait, hold with heartbeats, release on the way out (on an
        exception or a cancellation too). As a decorator of an ``async def``: the same around
        each call, run again on the retry attempt after a preemption while ``max_retries``
        allows."""
        interval, timeout = holding(lease_ttl, timeout)
        submit = functools.partial(
            self.submit, settings, component=component, component_type=component_type,
            max_retries=max_retries, labels=labels, lease_ttl=lease_ttl,
        )
        return AsyncAcquire(self, submit, interval, timeout, max_retries)


class AsyncGrant:
    """A held allocation: ``request`` as granted, ``lost`` once a heartbeat found it gone."""

    def __init__(self, request: RequestView) -> None:
        self.request = request
        self.lost: RequestView | None = None

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


class AsyncAcquire:
    """``async with client.acquire(...) as grant:`` or ``@client.acquire(...)``."""

    def __init__(
        self,
        client: AsyncClient,
        submit: Callable[[], Coroutine[Any, Any, RequestView]],
        interval: float,
        timeout: float | None,
        max_retries: int = 0,
    ) -> None:
        self._client = client
        self._submit = submit
        self._interval = interval
        self._timeout = timeout
        #: As given by the caller: the decorator's retries are its own loop's attempts.
        self._max_retries = max_retries
        self._grant: AsyncGrant | None = None
        self._holder: asyncio.Task[Any] | None = None
        self._beats: asyncio.Task[None] | None = None
        #: Set on the way out: a heartbeat no longer cancels the holder then.
        self._leaving = False
        self._cancelled_holder = False
        #: Entered, from the submit on (a second entry while the first waits is refused too).
        self._entered = False

    async def __aenter__(self) -> AsyncGrant:
        runs_once(self._max_retries)
        if self._entered:
            raise RuntimeError(HELD_ALREADY)
        self._entered = True
        try:
            return await self._enter()
        except BaseException:
            self._entered = False
            raise

    async def _enter(self) -> AsyncGrant:
        client = self._client
        submitting = asyncio.ensure_future(self._submit())
        try:
            request = await asyncio.shield(submitting)
        except asyncio.CancelledError as error:
            # The submit goes on without us (in a thread): the request it makes is withdrawn,
            # or it would get units nobody uses until its lease ends.
            with contextlib.suppress(Exception):
                made = await submitting
                if made.status in ("queued", "allocated"):
                    await client.cancel(made.id, stopped_waiting(error, None))
            raise
        try:
            if request.status == "queued":
                request = await client.wait(request.id, self._timeout)
            if request.status == "queued":
                raise WaitTimeout(request)
        except BaseException as error:  # a cancellation too: a queued request nobody will use
            # Granted meanwhile, perhaps: a cancel releases it then.
            try:
                cancelled = await client.cancel(request.id, stopped_waiting(error, self._timeout))
            except (Conflict, NotFound):  # it ended meanwhile, or was deleted
                pass
            except BaseException as failed:  # the caller's error stays the error
                # Cancelled again, it was left queued, unnamed: it goes up, said.
                log.warning("%s", still_waiting("Resource request", request.id, failed))
                if not isinstance(failed, FairpoolError):
                    raise
            else:
                if isinstance(error, WaitTimeout):
                    raise error.withdrawn(cancelled) from None
            raise
        if request.status != "allocated":
            raise not_granted(request)
        self._grant = AsyncGrant(request)
        self._holder = asyncio.current_task()
        self._beats = asyncio.create_task(self._beat(), name=f"fairpool-heartbeat-{request.id[:8]}")
        return self._grant

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        grant, beats = self._grant, self._beats
        assert grant is not None and beats is not None
        try:
            await self._leave(grant, beats, kind)
        finally:  # ready to be entered again
            self._grant = self._beats = self._holder = None
            self._leaving = self._cancelled_holder = self._entered = False

    async def _leave(
        self, grant: AsyncGrant, beats: asyncio.Task[None], kind: type[BaseException] | None
    ) -> None:
        self._leaving = True
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        if grant.lost is None:
            try:
                await self._client.release(grant.id)
            except Conflict:  # preempted, expired or released between two heartbeats
                grant.lost = await self._client.get(grant.id)
            except Unreachable as error:  # the block's work is done; the lease gives back
                log.warning("%s; the units go back when the lease expires", error)
        lost = grant.lost
        if lost is None:
            return
        if kind is None:
            if self._cancelled_holder:
                if self._holder is not None:
                    self._holder.uncancel()  # the block swallowed our cancellation
                raise not_granted(lost)
            # Its work is done before it heard: run again, a decorated one did it twice.
            log.warning("%s", lost_as_it_ended(lost, "block"))
        elif (
            issubclass(kind, asyncio.CancelledError)
            and self._cancelled_holder
            and self._holder is not None
            and self._holder.uncancel() == 0  # nobody else cancelled it
        ) or issubclass(kind, NotGranted):
            raise not_granted(lost) from None
        # The block ended of its own accord before it heard of the loss: nobody will run the
        # retry attempt.
        if lost.retried_as_id is not None:
            with contextlib.suppress(Conflict, Unreachable):  # ended meanwhile; or the lease
                await self._client.cancel(lost.retried_as_id, not_followed())

    def __call__(
        self, function: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, T]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(
                f"AsyncClient.acquire() decorates an async def (not {function!r}): the units "
                "are held while its coroutine runs; use Client.acquire() for a plain function"
            )

        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            submit = self._submit
            while True:
                try:
                    async with AsyncAcquire(self._client, submit, self._interval, self._timeout):
                        return await function(*args, **kwargs)
                except Preempted as preempted:
                    # As ``_Acquire``'s: the answer that told of the preemption names it.
                    retry = preempted.request.retried_as_id
                    if retry is None:
                        raise
                    submit = functools.partial(self._follow, retry)

        return run

    async def _follow(self, retry: str) -> RequestView:
        """As ``_Acquire._follow``."""
        try:
            return await self._client.get(retry)
        except Unreachable as error:
            raise Unreachable(still_waiting("Retry attempt", retry, error)) from None

    async def _beat(self) -> None:
        grant = self._grant
        assert grant is not None
        while True:
            await asyncio.sleep(self._interval)
            try:
                request = await self._client.heartbeat(grant.id)
            except Exception as error:  # the task must live on: none was told otherwise
                failed = beat_failed(grant.request, error)
                if failed is None:
                    continue  # a miss: the lease covers a few
                request = failed
            if request.status != "allocated":
                grant.lost = request
                if not self._leaving and self._holder is not None:
                    self._cancelled_holder = True
                    self._holder.cancel()
                await self._keep(request.retried_as_id)
                return

    async def _keep(self, retry: str | None) -> None:
        """As ``Grant._keep``: heartbeat the retry attempt while the cancelled holder
        unwinds, until ``_leave`` cancels this task; then it is followed or cancelled."""
        while retry is not None:
            await asyncio.sleep(self._interval)
            try:
                retry = kept_next(retry, await self._client.heartbeat(retry))
            except (Conflict, NotFound):  # it ended meanwhile
                return
            except Exception as error:
                if not passing(error):
                    return
