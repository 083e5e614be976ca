"""The HTTP API: thin over ``Service`` (validate, call, map errors), under ``/api/v1``.

The busy request routes (submit, long-poll, heartbeat, release, cancel) are coroutines: their
writes are queued for group commit (``Api.write``), the long-poll holds neither a thread nor a
transaction while it waits (see ``ChangeNotifier``), and without auth ``BusyRoutes`` serves
them without FastAPI's per-request machinery. Every other endpoint is a plain ``def``: FastAPI
runs it in its thread pool and the service makes each call one database transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import ExitStack, asynccontextmanager, suppress
from dataclasses import replace
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import Depends, FastAPI, Path, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.types import DecoratedCallable
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from fairpool.api.answers import Listed
from fairpool.api.auth import (
    Auth,
    Caller,
    listed_for,
    names_others,
    owner_of_new_request,
    shown,
    shown_events,
    visible_pool,
    visible_requests,
)
from fairpool.api.browsers import SameOrigin
from fairpool.api.busy_routes import BusyRoute, BusyRoutes
from fairpool.api.docs_pages import serve_docs
from fairpool.api.errors import (
    DATABASE_AWAY,
    AnswerCancelled,
    BodySizeLimit,
    error_response,
    install_error_handlers,
    known_query,
    log_failure,
)
from fairpool.api.metrics import Metrics
from fairpool.api.models import (
    DEFAULT_PAGE_SIZE,
    MAX_BODY_BYTES,
    Cancel,
    ComponentType,
    ErrorBody,
    IdempotencyHeader,
    PageAfter,
    PageLimit,
    PageOffset,
    PathText,
    PolicyCreate,
    PolicyUpdate,
    PoolCreate,
    PoolUpdate,
    Prune,
    QueryText,
    RequestCreate,
    WaitSeconds,
    one_key,
)
from fairpool.api.notify import Watch, notifier_for
from fairpool.api.reconciler import Reconciler
from fairpool.api.scheduling import MAX_DOCUMENT_BODY, scheduling_router
from fairpool.api.semantics import CREATED, as_get, located, rooted, segment
from fairpool.api.trees import MAX_TREE_DOCUMENT_BODY, trees_router
from fairpool.errors import Later, NotFound, WouldWait, words
from fairpool.paging import page_dict
from fairpool.scheduling import SchedulingService
from fairpool.service import Service
from fairpool.store import trees as tree_store
from fairpool.store.records import ApiToken
from fairpool.trees_service import TreesService
from fairpool.views import (
    ComponentView,
    EventView,
    PassSummary,
    PolicyView,
    PoolView,
    PruneView,
    RequestView,
)

log = logging.getLogger("fairpool.api")
T = TypeVar("T")

PREFIX = "/api/v1"
#: Routes whose body is a whole scheduler config document.
DOCUMENT_PATHS = {
    **{PREFIX + path: MAX_DOCUMENT_BODY
       for path in ("/config", "/config/validate", "/config/preview")},
    PREFIX + "/pool-trees/apply": MAX_TREE_DOCUMENT_BODY,
}
#: A long-poll never waits longer than this, whatever its ``timeout``.
MAX_WAIT_SECONDS = 60.0
#: A long-poll re-reads the database at least this often, to see changes made by other
#: processes on the same database (this process's own changes wake it at once).
RECHECK_SECONDS = 1.0
#: The status of a long-poll's answer once its client has gone: nginx's "client closed
#: request", which only the access log shows.
CLIENT_GONE = 499
#: With ``keep_history``, the time between prunes (seconds), and the most transactions one
#: tick's prune takes (``retention.BATCH`` rows each).
PRUNE_EVERY = 3600.0
PRUNE_BATCHES = 10
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


Ref = Annotated[PathText, Path(description="Name, id or unique id prefix.")]
Status = Literal["queued", "allocated", "released", "rejected", "preempted", "cancelled"]

def _error_responses(*described: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": text} for code, text in described}


_ERRORS = _error_responses(
    (400, "Malformed JSON"),
    (404, "Unknown name, id or prefix"),
    (409, "Ambiguous id prefix, or the current state forbids it"),
    (413, "Request body too large"),
    (415, "A body not sent as JSON"),
    (422, "Invalid input; `field` names it"),
    (503, "Database busy or unreachable"),
)
#: With auth on, what every route under ``PREFIX`` may answer too.
_DENIALS = _error_responses(
    (401, "No token, or an unknown or revoked one"),
    (403, "The token's role or components do not allow it"),
)
#: With auth off, what every route under ``PREFIX`` may answer too (``SameOrigin``).
_CROSS_SITE = _error_responses(
    (403, "A request from another site (its Origin or Host not loopback's)"),
)


class Api:
    """What the endpoints share: the service, change notifications, metrics, the reconciler."""

    def __init__(self, service: Service, tick: float, keep_history: int | None = None) -> None:
        self.service = service
        #: Seconds what ended is kept (``Service.prune``); None: for ever.
        self.keep_history = keep_history
        self._next_prune = 0.0
        self.notifier = notifier_for(service.db)
        self.trees = TreesService(service.db)
        self.scheduling = SchedulingService(service.db)
        self.metrics = Metrics(service, self.scheduling, self.trees)
        service.on_pass = self._committed
        service.on_batch = self.metrics.batch
        self.reconciler = Reconciler(self.tick, tick)
        self.stopping = False
        #: Whether the log said the schema moved on (once, until it is this server's again).
        self._schema_moved_said = False
        #: Since when (``time.monotonic``) the tick finds the database away, or None.
        self._away_since: float | None = None

    def _committed(self, summary: PassSummary, dequeued: Mapping[str, RequestView]) -> None:
        """A pass has committed: count it, and wake the long-polls of the requests it took
        out of the queue, handing them those requests' views."""
        self.metrics.record([summary])
        if dequeued:
            self.notifier.notify(dequeued.keys(), dequeued)

    def reconcile(self) -> PassSummary:
        return self.service.reconcile()

    async def write(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A service write for an ``async`` route (one whose write is its last step): queued
        for group commit and awaited. The writes the routes queue while the loop is busy
        form one batch, led by a task on this loop (``Service.drive_writes_on``): on SQLite
        it runs on the loop when it need not wait, on PostgreSQL the loop awaits its round
        trip; else on a thread. A worker thread per write, waiting in the queue, cost more
        than such a write itself: its hop and its contention for the GIL
        (docs/performance.md)."""
        try:
            with self.service.later():
                return operation(*args, **kwargs)  # only if it wrote nothing
        except Later as queued:
            answer: T = await queued.future
            return answer

    def reconcile_trees(self) -> int:
        """A pass over every pool tree where time can change a decision (promotions, grants,
        starvation preemption as of now), each in its own transaction; how many trees
        passed. Without trees it is one small read, and one more per tree where nothing
        waits. A tree whose pass fails is logged and tried again on the next tick; the other
        trees still pass."""
        with self.service.db.read() as conn:
            names = [record.name for record in tree_store.list_trees(conn)]
        passed = 0
        for name in names:
            try:
                passed += self.trees.tick(name)
            except NotFound:  # deleted meanwhile (by another process)
                continue
            except DATABASE_AWAY:  # every tree's would fail too: the tick says it once
                raise
            except Exception as error:
                log_failure(f"pool tree {name}: reconcile pass failed", error)
        return passed

    def tick(self) -> None:
        """The reconciler's pass: requests (leases, timeouts), then pool trees (starvation
        timeouts act without a command), then waiting workloads (their decisions depend on
        time too: a blocked one holds units after 300 s; one small read when none waits),
        then a prune if due; each also when an earlier one failed (each failure logged).
        First, whether the schema is still this server's (one small read): once a newer
        fairpool migrated it, nothing is written any more (``Database.schema_moved``)."""
        try:
            problem = self.service.db.schema_problem()
        except Exception:  # the database away: the steps say so, as ever
            problem = None
        if problem is not None:
            if not self._schema_moved_said:
                log.error("Writing nothing more: %s", problem)
                self._schema_moved_said = True
            return
        self._schema_moved_said = False
        away: tuple[str, Exception] | None = None
        for what, step in (("requests", self.service.tick), ("pool trees", self.reconcile_trees),
                           ("workloads", self.scheduling.reconcile_waiting),
                           ("prune", self.prune_if_due)):
            try:
                step()
            except DATABASE_AWAY as error:  # the database may be away a while: next tick
                away = away or (what, error)
            except Exception as error:
                log_failure(f"reconcile pass failed ({what})", error)
        self._say_outage(away)

    def _say_outage(self, away: tuple[str, Exception] | None) -> None:
        """One line as the database goes away (the first step it failed), one as the
        passes work again. Said each tick, an outage of a minute was ~180 identical lines
        per replica, none naming its step (helper-90)."""
        now = time.monotonic()
        if away is None:
            if self._away_since is not None:
                log.info("Reconcile passes work again, the database answering (after %.0f s)",
                         now - self._away_since)
                self._away_since = None
            return
        if self._away_since is None:
            self._away_since = now
            what, error = away
            log_failure(f"reconcile pass failed ({what}); tried again each tick, said again "
                        "once it works", error)

    def prune_if_due(self) -> None:
        """With ``keep_history``, a prune at start and then hourly: each then deletes little,
        in short transactions (``retention``), and at most ``PRUNE_BATCHES`` of them per
        tick. Said in the log."""
        now = time.monotonic()
        if self.keep_history is None or now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY
        done = self.prune(self.keep_history, batches=PRUNE_BATCHES)
        if not done.complete:  # more: on the next tick, so that leases still expire on time
            self._next_prune = now
        counts = done.counts()
        if any(counts.values()):
            log.info("Pruned what ended before %s: %s", done.before.isoformat(timespec="seconds"),
                     ", ".join(f"{count} {what}" for what, count in counts.items()))

    def prune(
        self, older_than: int, *, dry_run: bool = False, batches: int | None = None
    ) -> PruneView:
        """``Service.prune``, counted in the metrics."""
        done = self.service.prune(older_than, dry_run=dry_run, batches=batches)
        self.metrics.pruned(done)
        return done

    def begin_shutdown(self) -> None:
        """No more waiting: long-polls answer now so that in-flight requests can finish."""
        self.stopping = True
        self.notifier.close()

    async def decided(self, ref: str) -> tuple[str, RequestView | None]:
        """The id of request ``ref`` (id or unique id prefix) and its view unless it still
        waits: one small read, no engine run (``Service.decided_request``). On SQLite it runs
        on the loop's thread unless it would wait (~0.1 ms). On PostgreSQL the loop awaits
        its first statement, which tells that a request still waits (what most long-polls
        find), and a worker thread reads the rest (``Service.read_decided``, without that
        statement again): a hop to a thread per long-poll cost the contended load a third of
        its rate (docs/performance.md)."""
        if self.service.db.embedded:
            try:
                return self.service.decided_request(ref, wait=False)
            except WouldWait:  # its connection in use, or SQLite busy: the thread reads
                return await run_in_threadpool(self.service.decided_request, ref)
        with suppress(DBAPIError):  # the loop's connection failed: the thread reads it all
            if await self.service.still_queued(ref):
                return ref, None
        return await run_in_threadpool(self.service.read_decided, ref)

    async def until_decided(
        self, watch: Watch, request_id: str, deadline: float, asker: Request
    ) -> RequestView | None:
        """Wait while the request is queued: its view once it no longer waits, as the pass of
        this process that took it out of the queue hands it, else read when woken by a
        change (another replica's) and every ``RECHECK_SECONDS`` (other processes' changes on
        SQLite); None at ``deadline`` (loop time), at shutdown, or once ``asker`` has gone
        (its client closed the connection: it read on for nobody until its timeout)."""
        loop = asyncio.get_running_loop()
        while not self.notifier.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            await watch.wait(min(remaining, RECHECK_SECONDS))
            watch.clear()
            if await asker.is_disconnected():
                return None
            view = watch.take_view()  # woken by this process's pass: no read
            if view is None:
                _, view = await self.decided(request_id)
            if view is not None:
                return view
        return None


class _JSON(JSONResponse):
    """JSONResponse's bytes (compact, UTF-8) by orjson: ~0.5 µs for a request's view, where
    the standard library's encoder took ~9 µs, twice per admission."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return _JSON(data, status_code=status)


class FairpoolApp(FastAPI):
    """FastAPI, whose HTTP requests pass ``front`` first (``create_app`` sets it): the 503
    for a request the shutdown cuts short and ``Cache-Control``, another site's refusal, the
    body's size limit, then the busy routes, ahead of FastAPI's own layers. What the front
    does not answer it hands to ``fastapi``: FastAPI itself, as if the front were not there.
    A ``HEAD`` goes in as its ``GET`` (``semantics.as_get``): so every route answers it, out
    of the schema, without a route of its own.

    FastAPI (0.165) runs three layers around every request before the app's middleware: its
    telemetry check (which reads the environment each time), its error middleware, which
    wraps ``send``, and its body limit. The busy routes answer without them: their errors
    go to the app's exception handlers as that error middleware would send them
    (``BusyRoutes``), and their bodies are limited by ours."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: exception handlers may read it
        if scope["method"] == "HEAD":  # every GET route answers it, as RFC 9110 9.3.2 asks
            scope, send = as_get(scope, send)
        if root := scope.get("root_path"):  # behind a proxy's prefix: a create's Location too
            send = rooted(root, send)
        await self.front(scope, receive, send)

    async def fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def _traced(app: FastAPI) -> bool:
    """Whether FastAPI's own OpenTelemetry instrumentation is on (a provider configured):
    then the busy routes are FastAPI's too, so that their requests are traced like the rest.
    FastAPI before 0.165 has none."""
    telemetry = getattr(app, "_native_telemetry", None)
    return telemetry is not None and bool(telemetry.enabled())


def create_app(service: Service, *, tick: float = 1.0, auth: bool = False,
               loopback_only: bool = False, keep_history: int | None = None) -> FairpoolApp:
    """The API over ``service``. Its lifespan runs the reconciler thread (one pass every
    ``tick`` seconds). The caller owns the service and closes its database. With ``auth``,
    ``/api/v1`` needs API tokens (see ``fairpool.api.auth``); without, requests from another
    site's web page are refused, and with ``loopback_only`` those addressed to a name that is
    not a loopback one (``fairpool.api.browsers``). ``keep_history``: seconds what ended is
    kept before the reconciler prunes it (``Api.prune_if_due``); None: for ever."""
    api = Api(service, tick, keep_history)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(api.notifier.start)
        api.reconciler.start()
        service.drive_writes_on(asyncio.get_running_loop())
        try:
            yield
        finally:
            api.begin_shutdown()
            await run_in_threadpool(api.reconciler.stop)
            await run_in_threadpool(api.notifier.stop)
            await service.stop_driving()

    app = FairpoolApp(
        title="fairpool",
        summary="Shares scarce compute (GPUs first) between teams and pipelines.",
        version="1",
        lifespan=lifespan,
        responses=_ERRORS,
        docs_url=None,
        redoc_url=None,
        # No 307 from "/pools/" to "/pools": a client asking for the pool named "" would
        # follow it (or take it for an answer) and get the list instead of a 404.
        redirect_slashes=False,
    )
    app.state.api = api
    install_error_handlers(app)
    app.state.auth = tokens = Auth(service, auth)
    # After the token's check: a caller without one learns nothing of the routes.
    dependencies = [*tokens.dependencies(), Depends(known_query)]
    denials = _DENIALS if tokens.enabled else _CROSS_SITE

    def route(
        method: str, path: str, **options: Any
    ) -> Callable[[DecoratedCallable], DecoratedCallable]:
        """A route of the app's own under ``PREFIX``. Not an ``APIRouter``'s: FastAPI matches
        an included router's routes through a layer of its own per route, ~5 % of the CPU of
        a create + release (docs/performance.md)."""
        responses = {**denials, **options.pop("responses", {})}
        return app.api_route(PREFIX + path, methods=[method], dependencies=dependencies,
                             responses=responses, **options)

    # -- requests ----------------------------------------------------------------------
    # First: a route is found by trying the routes in order, and these are the busy ones.

    async def _own(caller: ApiToken | None, view: RequestView, status: int = 200
                   ) -> JSONResponse:
        """The caller's request answered as ``shown`` to it (a read only for a submitter's
        request that names others: preempted, or preempting)."""
        if caller is not None and names_others(view):
            view = await run_in_threadpool(shown, tokens, caller, view)
        return _json(view.as_dict(), status)

    @route("POST", "/requests", status_code=201, tags=["requests"], response_model=RequestView,
           responses=CREATED)
    async def create_request(
        body: RequestCreate, caller: Caller, idempotency_header: IdempotencyHeader = None
    ) -> JSONResponse:
        """Submit a request; the answer carries the decision already made: allocated, queued
        (with position and reason per pool) or rejected (with the reason)."""
        key = one_key(idempotency_header, body.idempotency_key)
        view = await api.write(
            service.create_request,
            body.component,
            body.component_type,
            body.resources,
            preemptible=body.preemptible,
            max_retries=body.max_retries,
            labels=body.labels,
            lease_ttl=body.lease_ttl,
            created_by=owner_of_new_request(caller, body.component),
            idempotency_key=key,
        )
        # A repeat (same key) answers the request as it is now: perhaps preempted already.
        return located(await _own(caller, view, 201), f"{PREFIX}/requests/{view.id}")

    @route("GET", "/requests", tags=["requests"], response_model=Listed[RequestView])
    def list_requests(
        caller: Caller,
        status: Status | None = None,
        component: QueryText | None = None,
        pool: QueryText | None = None,
        limit: PageLimit = DEFAULT_PAGE_SIZE,
        offset: PageOffset = 0,
        after: PageAfter | None = None,
    ) -> JSONResponse:
        """Requests, oldest first, filtered, one page: ``{"items", "pagination"}``; a
        submitter's own only."""
        page = service.request_page(
            status, component, pool, limit=limit, offset=offset, after=after,
            created_by=listed_for(caller)
        )
        shown_page = replace(page, items=tuple(visible_requests(tokens, caller, list(page.items))))
        return _json(shown_page.as_dict())

    @route("GET", "/requests/{ref}", tags=["requests"], response_model=RequestView)
    def get_request(ref: Ref, caller: Caller) -> JSONResponse:
        """One request: status, reason, pool, and per pool its queue position and reason."""
        return _json(shown(tokens, caller, service.get_request(ref)).as_dict())

    @route("GET", "/requests/{ref}/events", tags=["requests"], response_model=Listed[EventView])
    def request_events(ref: Ref, caller: Caller) -> JSONResponse:
        """A request's history, oldest first: each change of its status with the reason
        given then. A deleted request's, by its whole id (admins)."""
        events = shown_events(tokens, caller, service.request_events(ref))
        return _json(page_dict([e.as_dict() for e in events]))

    @route("GET", "/requests/{ref}/wait", tags=["requests"], response_model=RequestView)
    async def wait_request(
        ref: Ref,
        caller: Caller,
        asker: Request,
        timeout: Annotated[
            WaitSeconds,
            Query(description=f"Seconds; at most {MAX_WAIT_SECONDS:g} are waited."),
        ] = 30.0,
    ) -> Response:
        """Long-poll: answers as soon as the request is no longer queued, or when the timeout
        ends, with the request (its queue position and reason while it still waits)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout, MAX_WAIT_SECONDS)
        # Watched from before the first read when ``ref`` is the id (clients pass the id
        # they were given): a change committed after that read wakes us.
        with ExitStack() as watching:
            watch = watching.enter_context(api.notifier.watch(ref))
            request_id, view = await api.decided(ref)
            if view is None and request_id != ref:  # a prefix: watch the id, read again
                watch = watching.enter_context(api.notifier.watch(request_id))
                _, view = await api.decided(request_id)
            if view is None:
                api.metrics.long_polls.inc()
                try:
                    view = await api.until_decided(watch, request_id, deadline, asker)
                finally:
                    api.metrics.long_polls.dec()
        if view is None and await asker.is_disconnected():
            return Response(status_code=CLIENT_GONE)  # read by nobody: nothing more is read
        if view is None:  # still queued: the whole view, with its queue positions
            view = await run_in_threadpool(service.get_request, request_id)
        return await _own(caller, view)

    @route("POST", "/requests/{ref}/heartbeat", tags=["requests"], response_model=RequestView)
    async def heartbeat(ref: Ref, caller: Caller) -> JSONResponse:
        """The holder is alive: renew the lease. Answers with the request in any status, so a
        holder learns of a preemption at its next heartbeat."""
        return await _own(caller, await api.write(service.heartbeat, ref))

    @route("POST", "/requests/{ref}/release", tags=["requests"], response_model=RequestView)
    async def release(ref: Ref, caller: Caller) -> JSONResponse:
        """The work finished: the units go back to the pool."""
        return await _own(caller, await api.write(service.release_request, ref))

    @route("POST", "/requests/{ref}/cancel", tags=["requests"], response_model=RequestView)
    async def cancel(ref: Ref, caller: Caller, body: Cancel | None = None) -> JSONResponse:
        """Withdraw a queued or allocated request (the body, optional, says why)."""
        view = await api.write(service.cancel_request, ref, body.reason if body else None)
        api.notifier.notify([view.id])  # it may have left the queue: wake its long-polls
        return await _own(caller, view)

    @route("DELETE", "/requests/{ref}", status_code=204, tags=["requests"])
    def delete_request(ref: Ref) -> Response:
        """Delete a request (an allocation it holds is released)."""
        service.delete_request(ref)
        return Response(status_code=204)

    # -- pools -------------------------------------------------------------------------

    @route("POST", "/pools", status_code=201, tags=["pools"], response_model=PoolView,
           responses=CREATED)
    def create_pool(body: PoolCreate) -> JSONResponse:
        """Create a resource pool."""
        pool = service.create_pool(body.name, body.capacity, body.description)
        return located(_json(pool.as_dict(), 201), f"{PREFIX}/pools/{segment(pool.name)}")

    @route("GET", "/pools", tags=["pools"], response_model=Listed[PoolView])
    def list_pools() -> JSONResponse:
        """Every pool with occupied vs total per key and its queue length."""
        return _json(page_dict([p.as_dict() for p in service.list_pools()]))

    @route("GET", "/pools/{ref}", tags=["pools"], response_model=PoolView)
    def get_pool(ref: Ref, caller: Caller) -> JSONResponse:
        """One pool with its policies, active and queued requests."""
        return _json(visible_pool(tokens, caller, service.get_pool(ref)).as_dict())

    @route("PATCH", "/pools/{ref}", tags=["pools"], response_model=PoolView)
    def update_pool(ref: Ref, body: PoolUpdate) -> JSONResponse:
        """Change capacity (0 removes a key) and/or description."""
        pool = service.update_pool(ref, body.capacity, body.description)
        return _json(pool.as_dict())

    @route("DELETE", "/pools/{ref}", status_code=204, tags=["pools"])
    def delete_pool(ref: Ref) -> Response:
        """Delete a pool; refused (409) while it has live allocations."""
        service.delete_pool(ref)
        return Response(status_code=204)

    @route("GET", "/pools/{ref}/requests", tags=["pools"], response_model=Listed[RequestView])
    def pool_requests(
        ref: Ref, caller: Caller, view: Literal["queued", "active", "all"] = "all"
    ) -> JSONResponse:
        """The pool's active requests and/or its queue in order."""
        views = visible_requests(tokens, caller, service.pool_requests(ref, view))
        rows = [r.as_dict() for r in views]
        return _json(page_dict(rows))

    # -- policies ----------------------------------------------------------------------

    @route("POST", "/pools/{ref}/policies", status_code=201, tags=["policies"],
           response_model=PolicyView)
    def attach_policy(ref: Ref, body: PolicyCreate) -> JSONResponse:
        """Attach a component's policy (priority, reserved, limit) to a pool."""
        policy = service.attach_policy(
            ref,
            body.component,
            body.component_type,
            body.priority,
            body.reserved,
            body.limit,
        )
        return _json(policy.as_dict(), 201)

    @route("GET", "/policies", tags=["policies"], response_model=Listed[PolicyView])
    def list_policies(
        pool: QueryText | None = None,
        component: QueryText | None = None,
        component_type: ComponentType | None = None,
    ) -> JSONResponse:
        """Policies, optionally of one pool, component or component type."""
        views = service.list_policies(pool, component, component_type)
        return _json(page_dict([v.as_dict() for v in views]))

    @route("PATCH", "/pools/{ref}/policies/{component}", tags=["policies"],
           response_model=PolicyView)
    def update_policy(
        ref: Ref,
        component: Ref,
        body: PolicyUpdate,
        component_type: ComponentType = "orchestrator",
    ) -> JSONResponse:
        """Change a policy in place, in use or not: what the body gives replaces what it had.
        Allocations keep their units; the queue is decided by the new policy from now on."""
        policy = service.update_policy(
            ref, component, component_type, body.priority, body.reserved, body.limit
        )
        return _json(policy.as_dict())

    @route("DELETE", "/pools/{ref}/policies/{component}", status_code=204, tags=["policies"])
    def detach_policy(
        ref: Ref,
        component: Ref,
        component_type: ComponentType = "orchestrator",
    ) -> Response:
        """Detach a policy; refused (409) while it has live allocations."""
        service.detach_policy(ref, component, component_type)
        return Response(status_code=204)

    # -- components --------------------------------------------------------------------

    @route("GET", "/components", tags=["components"], response_model=Listed[ComponentView])
    def list_components(component_type: ComponentType | None = None) -> JSONResponse:
        """Components (who asks for units), optionally of one type: the pools each has a
        policy on, and how many of its requests hold units or wait."""
        views = service.list_components(component_type)
        return _json(page_dict([v.as_dict() for v in views]))

    # -- operations --------------------------------------------------------------------

    @route("POST", "/reconcile", tags=["operations"], response_model=PassSummary)
    def reconcile() -> JSONResponse:
        """Run one reconcile pass now; answers what it changed."""
        summary = api.reconcile()
        return _json(summary.as_dict())

    @route("POST", "/prune", tags=["operations"], response_model=PruneView)
    def prune(body: Prune) -> JSONResponse:
        """Delete what ended more than ``older_than`` seconds ago: finished requests and
        their history, finished workloads and operations (``dry_run``: count them). Nothing
        live is touched. Answers how many of each, and whether more is due (``complete``
        false: call again, the cutoff then a little later)."""
        done = api.prune(body.older_than, dry_run=body.dry_run, batches=body.batches)
        return _json(done.as_dict())

    @route("GET", "/auth/admin", status_code=204, tags=["operations"])
    def check_admin() -> Response:
        """204 when the caller may do what admins do (an admin token, or auth off); else 403
        as from any admin route. The CLI asks before it shows a change and asks to confirm it."""
        return Response(status_code=204)

    app.include_router(scheduling_router(api.scheduling, PREFIX, dependencies, tokens),
                       responses=denials)
    app.include_router(trees_router(api.trees, PREFIX, dependencies, tokens),
                       responses=denials)

    def healthz() -> JSONResponse:
        """The process is up."""
        return _json({"status": "ok"})

    def readyz() -> JSONResponse:
        """The database is reachable, and holds the schema this server works with."""
        if api.stopping:
            return error_response(503, "shutting down")
        try:
            problem = service.db.schema_problem()
        except Exception as error:
            return error_response(503, f"database unreachable: {words(error)}")
        if problem is not None:
            return error_response(503, problem)
        return _json({"status": "ready"})

    def metrics() -> Response:
        """Prometheus text format."""
        return PlainTextResponse(api.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    for path, endpoint, response_class in (
        ("/healthz", healthz, JSONResponse),
        ("/readyz", readyz, JSONResponse),
        ("/metrics", metrics, PlainTextResponse),
    ):
        # HEAD too, as every GET route (``FairpoolApp``), for checkers that probe with it.
        app.add_api_route(
            path, endpoint, methods=["GET"], tags=["operations"], response_class=response_class
        )
        # The same under the API prefix, for clients that only know the base URL.
        app.add_api_route(PREFIX + path, endpoint, methods=["GET"], include_in_schema=False)

    # Last: routes are tried in order, and the busy ones come first (see above).
    serve_docs(app)

    front: ASGIApp = app.fastapi
    if not tokens.enabled and not _traced(app):
        busy = [
            BusyRoute("POST", PREFIX + "/requests", create_request),
            BusyRoute("GET", PREFIX + "/requests/{ref}/wait", wait_request),
            *(BusyRoute("POST", PREFIX + f"/requests/{{ref}}/{action.__name__}", action)
              for action in (release, heartbeat, cancel)),
        ]
        front = BusyRoutes(front, busy, app.exception_handlers)
    front = BodySizeLimit(front, max_bytes=MAX_BODY_BYTES, per_path=DOCUMENT_PATHS)
    if not tokens.enabled:
        front = SameOrigin(front, loopback_only=loopback_only)
    # Outermost, so that its Cache-Control is on every answer (another site's refusal too).
    app.front = AnswerCancelled(front, no_store=PREFIX)
    return app
