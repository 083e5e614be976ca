"""``RemoteService``: the service's operations over a fairpool server's HTTP API.

Same methods, same arguments, same view objects as ``fairpool.service.Service``, so the CLI and
the SDK work identically embedded or remote. Errors come back as the same exceptions
(``InvalidInput`` naming the field, ``NotFound``, ``Conflict``) with the server's message.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import quote

import httpx

from fairpool.backoff import jittered
from fairpool.errors import (
    AmbiguousReference,
    Conflict,
    FairpoolError,
    Forbidden,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unreachable,
    as_ref,
    listed,
    mapping,
    one_of,
    password_hidden,
    string,
    validate_int,
)
from fairpool.frontends.names import MAX_NAME, MAX_VERSION, bounded_text, check_unicode
from fairpool.ids import new_id
from fairpool.outage import Outage
from fairpool.paging import Page, V, check_page
from fairpool.views import (
    COMPONENT_TYPES,
    MAX_RETENTION,
    OPERATION_STATUSES,
    POOL_REQUEST_VIEWS,
    REQUEST_STATUSES,
    WORKLOAD_STATUSES,
    ComponentView,
    EventView,
    PassSummary,
    PolicyView,
    PoolView,
    PruneProgress,
    PruneView,
    RequestView,
)

#: Items asked for per call when a list wants them all.
_LIST_PAGE = 500

#: Transport failures (a restarting server) and ``_AWAY`` answers are retried this many times
#: in all, backing off.
_ATTEMPTS = 6
#: Answers that say the server is away for now: 503 (its database busy or away; a proxy's
#: with no server up), and a proxy's 502 and 504 while the server restarts (a TLS proxy in
#: front of it, as docs/service.md advises). Each may follow a request carried out.
_AWAY = frozenset({502, 503, 504})
#: Where the API's routes are, under the server's URL (``fairpool.api.app.PREFIX``).
_API = "/api/v1"

log = logging.getLogger(__name__)

#: Connections a forked child inherited (``RemoteService.http``): kept, never used.
_INHERITED: list[httpx.Client] = []


class RemoteService:
    def __init__(self, url: str, token: str | None = None) -> None:
        # A blank one (FAIRPOOL_TOKEN set to spaces) is none, as an empty one is.
        headers = {"Authorization": f"Bearer {_token(token)}"} if token and token.strip() else {}
        # Reads may long-poll for up to a minute.
        self._connecting = functools.partial(
            httpx.Client, base_url=_server_url(url) + _API, headers=headers,
            timeout=httpx.Timeout(10.0, read=75.0),
        )
        self._http, self._pid = self._connecting(), os.getpid()
        #: What a wait rides out while the server cannot be reached.
        self._outage = Outage("server")

    @property
    def http(self) -> httpx.Client:
        """This process's connections: a child forked after some were made makes its own (a
        keep-alive socket both used gave each process the other's answers, helper-94). The
        inherited ones are left alone: closing them could wait for ever on a lock a thread of
        the parent held as it forked."""
        if self._pid != os.getpid():
            _INHERITED.append(self._http)
            self._http, self._pid = self._connecting(), os.getpid()
        elif self._http.is_closed:  # used after close(): it answers, as an embedded one does
            self._http = self._connecting()  # (httpx's RuntimeError went up, helper-94)
        return self._http

    @http.setter
    def http(self, connections: httpx.Client) -> None:  # a transport of one's own
        self._http, self._pid = connections, os.getpid()

    @property
    def where(self) -> str:
        """The server's URL, a password in it hidden: for messages."""
        return password_hidden(str(self._http.base_url).removesuffix(_API + "/"))

    def close(self) -> None:
        self._http.close()

    # -- pools -------------------------------------------------------------------------

    def create_pool(
        self, name: str, capacity: Mapping[str, object], description: str | None = None
    ) -> PoolView:
        body = {"name": name, "capacity": capacity, "description": description}

        def done() -> Any:
            return _showing([self._call("GET", _resource_pool_path(name))], body)

        return PoolView.from_dict(self._once("POST", "/pools", 409, done, json=body))

    def update_pool(
        self,
        ref: str,
        capacity: Mapping[str, object] | None = None,
        description: str | None = None,
    ) -> PoolView:
        body = {"capacity": capacity, "description": description}
        path = _resource_pool_path(ref)

        def done() -> Any:
            # Only a key asked 0 makes the retry fail: the lost attempt removed it, and it is
            # "no key of the pool" now (422). Done if the pool holds what was asked.
            if capacity is None or 0 not in capacity.values():
                return None
            pool = self._call("GET", path)
            merged = {**pool["capacity"], **capacity}
            asked = {key: value for key, value in body.items() if value is not None}
            asked["capacity"] = {key: value for key, value in merged.items() if value != 0}
            return _showing([pool], asked)

        return PoolView.from_dict(self._once("PATCH", path, 422, done, json=body))

    def delete_pool(self, ref: str) -> None:
        self._once("DELETE", _resource_pool_path(ref), 404)

    def get_pool(self, ref: str) -> PoolView:
        return PoolView.from_dict(self._call("GET", _resource_pool_path(ref)))

    def list_pools(self) -> list[PoolView]:
        return [PoolView.from_dict(p) for p in self._call("GET", "/pools")["items"]]

    def pool_requests(self, ref: str, view: str = "all") -> list[RequestView]:
        params = {"view": one_of("view", view, POOL_REQUEST_VIEWS)}  # "5" must not pass for 5
        page = self._call("GET", _resource_pool_path(ref) + "/requests", params=params)
        return [RequestView.from_dict(r) for r in page["items"]]

    # -- policies ----------------------------------------------------------------------

    def attach_policy(
        self,
        pool_ref: str,
        component: str,
        component_type: str = "orchestrator",
        priority: int = 0,
        reserved: Mapping[str, object] | None = None,
        limit: Mapping[str, object] | None = None,
    ) -> PolicyView:
        body = {"component": component, "component_type": component_type,
                "priority": priority, "reserved": reserved or {}, "limit": limit or {}}
        path = _resource_pool_path(pool_ref) + "/policies"

        def done() -> Any:
            mine = {"pool": pool_ref, "component": component, "component_type": component_type}
            return _showing(self._call("GET", "/policies", params=mine)["items"], body)

        return PolicyView.from_dict(self._once("POST", path, 409, done, json=body))

    def update_policy(
        self,
        pool_ref: str,
        component: str,
        component_type: str = "orchestrator",
        priority: int | None = None,
        reserved: Mapping[str, object] | None = None,
        limit: Mapping[str, object] | None = None,
    ) -> PolicyView:
        body = {"priority": priority, "reserved": reserved, "limit": limit}
        # Sent again after a lost answer, it sets the same values: no refusal to tell apart.
        return PolicyView.from_dict(self._call(
            "PATCH", self._policy_path(pool_ref, component, component_type),
            params={"component_type": component_type}, json=body))

    def detach_policy(
        self, pool_ref: str, component: str, component_type: str = "orchestrator"
    ) -> None:
        path = self._policy_path(pool_ref, component, component_type)
        self._once("DELETE", path, 404, params={"component_type": component_type})

    def _policy_path(self, pool_ref: str, component: str, component_type: str) -> str:
        pool = _segment(pool_ref, "resource pool")

        def missing(name: str) -> NotFound:  # the pool is looked up first, as the service does
            kind = one_of("component_type", component_type, COMPONENT_TYPES)
            return NotFound.of_policy(kind, name, self._call("GET", f"/pools/{pool}")["name"])

        return f"/pools/{pool}/policies/{_segment(component, missing)}"

    def list_policies(
        self,
        pool_ref: str | None = None,
        component: str | None = None,
        component_type: str | None = None,
    ) -> list[PolicyView]:
        if component_type is not None:  # as the service words it
            one_of("component_type", component_type, COMPONENT_TYPES)
        params = {k: string(k, v) for k, v in (("pool", pool_ref), ("component", component),
                                               ("component_type", component_type))
                  if v is not None}
        return [PolicyView.from_dict(p)
                for p in self._call("GET", "/policies", params=params)["items"]]

    # -- components --------------------------------------------------------------------

    def list_components(self, component_type: str | None = None) -> list[ComponentView]:
        params = {}
        if component_type is not None:  # as the service words it
            params["component_type"] = one_of("component_type", component_type, COMPONENT_TYPES)
        return [ComponentView.from_dict(c)
                for c in self._call("GET", "/components", params=params)["items"]]

    # -- requests ----------------------------------------------------------------------

    def create_request(
        self,
        component: str,
        component_type: str = "orchestrator",
        demand: Mapping[str, int] | None = None,
        preemptible: bool = True,
        max_retries: int = 0,
        labels: Mapping[str, str] | None = None,
        lease_ttl: int | None = None,
    ) -> RequestView:
        # One key per call: if the answer is lost and _call sends the body again, the server
        # answers the request this call already made instead of making a second one.
        body = {"component": component, "component_type": component_type,
                "resources": demand or {}, "preemptible": preemptible,
                "max_retries": max_retries, "labels": labels or {},
                "lease_ttl": lease_ttl, "idempotency_key": new_id()}
        return self._outage.hear(
            RequestView.from_dict(self._call("POST", "/requests", json=body))
        )

    def get_request(self, ref: str) -> RequestView:
        path = f"/requests/{_segment(ref, 'request')}"
        return self._outage.hear(RequestView.from_dict(self._call("GET", path)))

    def request_events(self, ref: str) -> list[EventView]:
        path = f"/requests/{_segment(ref, 'request')}/events"
        return [EventView.from_dict(e) for e in self._call("GET", path)["items"]]

    def list_requests(
        self, status: str | None = None, component: str | None = None, pool: str | None = None
    ) -> list[RequestView]:
        return list(self.request_page(status, component, pool).items)

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
        """One ``GET /requests``; ``limit`` None: as many as it takes to reach the end."""
        filters = {"status": status, "component": component, "pool": pool}
        return self._page("/requests", filters, REQUEST_STATUSES, (limit, offset, after),
                          RequestView.from_dict)

    def _page(
        self, path: str, filters: Mapping[str, str | None], statuses: Sequence[str],
        page: tuple[int | None, int, str | None], parse: Callable[[dict[str, Any]], V],
    ) -> Page[V]:
        """One ``GET path`` (a list), its items ``parse``d, of ``page``: ``(limit, offset,
        after)``. ``limit`` None: as many as it takes to reach the end, as embedded, each
        after the cursor the one before ended at, so that a delete meanwhile skips nothing.
        Its ``status`` filter, one of ``statuses``."""
        # Checked here as the service words them: the API words a bad status otherwise, and
        # a query string would carry "2" or True as a number.
        status = filters.get("status")
        if status is not None:
            one_of("status", status, statuses)
        limit, offset, after = page
        check_page(limit, offset, after)
        # A query string would carry 5 as "5": a filter that is no string is refused here.
        params = {key: string(key, value) for key, value in filters.items() if value is not None}
        place: dict[str, Any] = {"offset": offset, **({} if after is None else {"after": after})}
        items: list[V] = []
        while True:
            answer = self._call("GET", path, params={
                **params, **place, "limit": _LIST_PAGE if limit is None else limit,
            })
            items += [parse(item) for item in answer["items"]]
            total, next_ = answer["pagination"]["total"], answer["pagination"]["next"]
            if limit is not None or next_ is None:
                return Page(tuple(items), total, limit, offset, next_)
            place = {"offset": 0, "after": next_}

    def wait(self, ref: str, seconds: float) -> RequestView:
        """Long-poll: the server answers as soon as the request leaves the queue. While the
        server cannot be reached, for up to ``WAIT_OUTAGE`` seconds, what it last answered
        (queued), as soon as the retries fail; then ``Unreachable``."""
        deadline = time.monotonic() + seconds
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                path = f"/requests/{_segment(ref, 'request')}/wait"
                request = RequestView.from_dict(
                    self._call("GET", path, params={"timeout": min(left, 60.0)})
                )
            except Unreachable as error:
                return self._outage.unheard(ref, error)
            self._outage.hear(request)
            if request.status != "queued" or deadline - time.monotonic() <= 0:
                return request

    def heartbeat(self, ref: str) -> RequestView:
        path = f"/requests/{_segment(ref, 'request')}/heartbeat"
        return RequestView.from_dict(self._call("POST", path))

    def release_request(self, ref: str) -> RequestView:
        return self._finish(ref, "release", "released")

    def cancel_request(self, ref: str, reason: str | None = None) -> RequestView:
        return self._finish(ref, "cancel", "cancelled", reason)

    def delete_request(self, ref: str) -> None:
        self._once("DELETE", f"/requests/{_segment(ref, 'request')}", 404)

    def reconcile(self) -> PassSummary:
        return PassSummary.from_dict(self._call("POST", "/reconcile"))

    def prune(
        self, older_than: int, *, dry_run: bool = False, progress: PruneProgress | None = None
    ) -> PruneView:
        """As many calls as the server needs: each takes a bounded part, so none outlasts
        a read timeout however much is due."""
        validate_int("older_than", older_than, 0, MAX_RETENTION)  # as the service words it
        body = {"older_than": older_than, "dry_run": dry_run}
        done = PruneView.from_dict(self._call("POST", "/prune", json=body))
        while not done.complete:
            if progress is not None:
                progress(done)
            done = done.then(PruneView.from_dict(self._call("POST", "/prune", json=body)))
        return done

    def check_admin(self) -> None:
        """Forbidden unless this client's token is an admin's (or the server needs none)."""
        self._call("GET", "/auth/admin")

    # -- transport ---------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return _answer(self._send(method, path, **kwargs)[0])

    def _send(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, bool]:
        """The server's response, retrying transport failures (a restarting server) and
        ``_AWAY`` answers; and whether an earlier attempt may have been carried
        out although its answer was lost (the connection broke after the request was sent,
        or the database failed at a COMMIT that may have taken effect)."""
        if "json" in kwargs:
            # NaN and infinities written as JavaScript writes them, which the server reads, so
            # that it refuses them naming the field as the service does embedded (httpx would
            # not send them). UTF-8, 4 bytes a character at most (ASCII escapes took 12, and
            # the widest labels 300 kB); a lone surrogate, which UTF-8 cannot hold, as its
            # JSON escape, so that it reaches the server's check.
            text = json.dumps(_sendable(kwargs.pop("json")), allow_nan=True, ensure_ascii=False)
            kwargs["content"] = text.encode("utf-8", "backslashreplace")
            kwargs["headers"] = {"content-type": "application/json"}
        for name, value in (kwargs.get("params") or {}).items():
            if isinstance(value, str):  # a lone surrogate: no URL carries one
                check_unicode(name, value)
                if len(value) > MAX_NAME:  # as the server refuses it, whose URL httpx refused
                    bounded_text(name, value, MAX_NAME)
        delay = 0.2
        maybe_done = False
        for attempt in range(_ATTEMPTS):
            last = attempt == _ATTEMPTS - 1
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                if not isinstance(error, _NOT_SENT):
                    maybe_done = True
                if last:
                    server = self.where
                    # A write whose answer was lost may stand: sent again blindly, it would
                    # be made twice (a workload holding quota nobody runs on).
                    raise Unreachable(
                        f"cannot reach the fairpool server at {server} "
                        f"after {_ATTEMPTS} attempts: {error}"
                        + (MAYBE_DONE if maybe_done and _writes(method, path) else "")
                    ) from None
            else:
                if response.status_code not in _AWAY or last:
                    return response, maybe_done
                maybe_done = True
            # Capped exponential backoff with jitter, so restarting servers are not stormed.
            time.sleep(jittered(delay))
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _finish(
        self, ref: str, action: str, status: str, reason: str | None = None
    ) -> RequestView:
        """Release or cancel (saying why: ``reason``)."""
        path = f"/requests/{_segment(ref, 'request')}/{action}"
        return RequestView.from_dict(self._ending(path, status, **_reason(reason)))

    def _ending(self, path: str, status: str, **kwargs: Any) -> Any:
        """The answer to ``POST path``, which ends what the path's parent names in
        ``status`` (a release, a cancel, a completion)."""

        def done() -> Any:
            return _showing([self._call("GET", path.rsplit("/", 1)[0])], {"status": status})

        return self._once("POST", path, 409, done, **kwargs)

    def _once(
        self,
        method: str,
        path: str,
        refused: int,
        done: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """The answer to ``method path``, a call done once. When an earlier attempt may have
        been carried out although its answer was lost (``_send``), the retry is refused for
        what that attempt did, with ``refused``: 409 for a create (the name is taken) or an
        ending (it is over), 404 for a delete, 422 for an update removing a key. Then
        ``done()`` reads the server's state: the view the call would have answered if it
        shows what the call asked, else None, and the refusal stands (someone else's, asking
        otherwise). Without ``done``, the refusal itself shows it: a delete's 404."""
        response, maybe_done = self._send(method, path, **kwargs)
        if maybe_done and response.status_code == refused:
            if done is None:
                return None
            with suppress(FairpoolError):  # unreadable (gone meanwhile, unreachable): refused
                found = done()
                if found is not None:
                    return found
        return _answer(response)


def _showing(found: Iterable[Mapping[str, Any]], asked: Mapping[str, Any]) -> Any:
    """The first of ``found`` (the server's views) whose fields hold each value of ``asked``
    as JSON carries it, or None."""
    sent = json.loads(json.dumps(_sendable(asked), allow_nan=True))
    return next((view for view in found
                 if all(view.get(key) == value for key, value in sent.items())), None)


def _reason(reason: str | None) -> dict[str, Any]:
    """A cancel's keyword arguments for ``_send``: the body saying why, if anybody said."""
    return {} if reason is None else {"json": {"reason": reason}}


#: POSTs that only read: a body too large for a query (a document, a workload to explain).
_READING_POSTS = ("/config/preview", "/config/explain")


def _writes(method: str, path: str) -> bool:
    return method != "GET" and path not in _READING_POSTS


#: What an ``Unreachable`` adds when a write's answer was lost on the way.
MAYBE_DONE = ("; an attempt reached the server and its answer was lost, so it may have been "
              "carried out: look before sending it again")

#: Transport failures that mean the request never reached the server.
#: What JSON writes as a scalar (bool is an int), as ``json.dumps`` writes it.
_JSON_SCALARS = (str, int, float, type(None))
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


#: What the server answers for a path or method none of its routes takes (a service's own 404
#: names what it did not find).
_NO_ROUTE = {(404, "Not Found"), (405, "Method Not Allowed")}


def _answer(response: httpx.Response) -> Any:
    """The response's JSON body, or the service's exception for an error status."""
    if response.status_code == 204:
        return None
    try:
        body = response.json()
    except ValueError:  # a proxy's page: its HTML says no more than its status
        said = response.status_code in _AWAY or (
            response.status_code, response.reason_phrase) in _NO_ROUTE
        body = {"detail": response.reason_phrase if said
                else response.text.strip() or response.reason_phrase}
    if response.status_code < 400:
        return body
    detail = str(body.get("detail", response.reason_phrase))
    field = body.get("field")
    if isinstance(body.get("errors"), list) and response.status_code in (400, 422):
        from fairpool.frontends.config import ConfigError, ConfigIssue

        raise ConfigError(
            ConfigIssue(e["path"], e["message"], e.get("line")) for e in body["errors"]
        )
    if response.status_code == 422 and field is not None:
        raise InvalidInput.from_message(field, detail)
    if response.status_code == 409 and detail.endswith(AmbiguousReference.ENDING):
        raise AmbiguousReference(detail)
    if response.status_code in _AWAY:  # retried already (``_send``)
        server = password_hidden(str(response.request.url).partition(_API)[0])
        raise Unreachable(f"the fairpool server at {server} answered HTTP "
                          f"{response.status_code} {_ATTEMPTS} times: {detail}")
    if (response.status_code, detail) in _NO_ROUTE:  # not a fairpool route: a URL with a path
        request = response.request
        raise FairpoolError(
            f"HTTP {response.status_code}: the server has no route {request.method} "
            f"{request.url.path}: is the URL its root (http://HOST:PORT, with a proxy's path "
            "prefix if any), and is it a fairpool server as new as this client?"
        )
    raise {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict}.get(
        response.status_code, FairpoolError
    )(
        detail if response.status_code in (404, 409)
        else f"HTTP {response.status_code}: {detail}"
    )


class Answer(dict[str, Any]):
    """A JSON object from the server, with the ``as_dict()`` the local views have, and their
    fields as attributes (``w.status`` as embedded; times stay ISO text, lists lists)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


class RemoteScheduling:
    """``fairpool.scheduling.SchedulingService`` over HTTP: the same methods; results are
    ``Answer`` objects whose ``as_dict()`` equals the local view's."""

    def __init__(self, remote: RemoteService) -> None:
        self._remote = remote

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._remote._call(method, path, **kwargs)

    def apply_config(self, document: str, based_on: int | None = None) -> Answer:
        # One key per call, as a request's (``RemoteService.create_request``).
        body = {"document": document, "based_on": based_on, "idempotency_key": new_id()}
        return Answer(self._call("POST", "/config", json=body))

    def rollback_config(self, version: int, based_on: int | None = None) -> Answer:
        path = f"/config/versions/{_version(version)}/rollback"
        body = {"based_on": based_on, "idempotency_key": new_id()}
        return Answer(self._call("POST", path, json=body))

    def get_config(self, version: int | None = None) -> Answer | None:
        params = {} if version is None else {"version": _version(version)}
        try:
            return Answer(self._call("GET", "/config", params=params))
        except NotFound:
            if version is not None:
                raise
            return None

    def list_configs(self) -> list[Answer]:
        return [Answer(item) for item in self._call("GET", "/config/versions")["items"]]

    def diff_config(self, version: int) -> tuple[str, ...]:
        return tuple(self._call("GET", f"/config/versions/{_version(version)}/diff")["changes"])

    def preview_config(self, document: str) -> Answer:
        return Answer(self._call("POST", "/config/preview", json={"document": document}))

    def explain(self, **fields: Any) -> Answer:
        return Answer(self._call("POST", "/config/explain", json=fields))

    def submit_workload(self, **fields: Any) -> Answer:
        # One key per call, as a request's (``RemoteService.create_request``).
        body = {"idempotency_key": new_id(), **fields}
        return Answer(self._call("POST", "/workloads", json=body))

    def get_workload(self, ref: str) -> Answer:
        return Answer(self._call("GET", f"/workloads/{_segment(ref, 'workload')}"))

    def list_workloads(self, status: str | None = None, queue: str | None = None) -> list[Answer]:
        return list(self.workload_page(status, queue).items)

    def workload_page(
        self, status: str | None = None, queue: str | None = None, *, limit: int | None = None,
        offset: int = 0, after: str | None = None,
    ) -> Page[Answer]:
        filters = {"status": status, "queue": queue}
        return self._remote._page("/workloads", filters, WORKLOAD_STATUSES,
                                  (limit, offset, after), Answer)

    def release_workload(self, ref: str) -> Answer:
        path = f"/workloads/{_segment(ref, 'workload')}/release"
        return Answer(self._remote._ending(path, "finished"))

    def cancel_workload(self, ref: str, reason: str | None = None) -> Answer:
        path = f"/workloads/{_segment(ref, 'workload')}/cancel"
        return Answer(self._remote._ending(path, "cancelled", **_reason(reason)))

    def list_queues(self) -> list[Answer]:
        return [Answer(item) for item in self._call("GET", "/queues")["items"]]

    def describe_queue(self, name: str) -> Answer:
        return Answer(self._call("GET", f"/queues/{_segment(name, NotFound.of_queue)}"))


def _server_url(url: str) -> str:
    """``url``, a server's, checked at once: a typo is not an outage to retry."""
    shown = password_hidden(url)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise InvalidInput("url", shown, f"is not a URL: {error}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInput("url", shown, "must be http:// or https:// and a host, e.g. "
                           "http://127.0.0.1:8600")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise InvalidInput("url", shown, "has a port out of range (1 to 65535)")
    if parsed.query or parsed.fragment:  # the API's paths go after it
        raise InvalidInput("url", shown, "must have no query (?...) or fragment (#...)")
    return url.rstrip("/")


def _options(options: Mapping[str, object] | None) -> Mapping[str, object]:
    """A tree's or a tree pool's options, which the API names ``config``: checked here, to be
    refused as the SDK names them."""
    return {} if options is None else mapping("options", options)


def _sendable(body: Any, field: str = "") -> Any:
    """``body`` as JSON writes it (a mapping as a dict: a read-only view is not one), refused
    if JSON cannot carry it as asked, naming the field as the service does embedded: a
    mapping's key that is not a string (JSON would write ``{5: 1}`` as ``{"5": 1}``, another
    ask), or a value JSON has no type for (bytes, a set: the encoder's TypeError would name
    neither field nor value). Anything else goes as it is, for the server to refuse as the
    service refuses it embedded (a list given for a mapping: "must be a mapping")."""
    if isinstance(body, Mapping):
        sent = {}
        for key, value in body.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{field} key" if field else "key", key,
                                   "must be a string")
            sent[key] = _sendable(value, f"{field}.{key}" if field else key)
        return sent
    if isinstance(body, list | tuple):
        return [_sendable(item, field) for item in body]
    if not isinstance(body, _JSON_SCALARS):
        raise InvalidInput(field, body, f"JSON cannot carry a {type(body).__name__}")
    return body


def _token(token: str) -> str:
    """``token`` without the whitespace around it (a file's newline), checked at once: httpx
    refuses a header of other characters only when sending, which would read as an outage
    and print the secret."""
    token = token.strip()
    if not _TOKEN.fullmatch(token):
        raise InvalidInput.from_message(
            "token", "token: must be printable ASCII without spaces, as `fairpool token "
            "create` prints it (given as token= or in FAIRPOOL_TOKEN; a secret: not shown)")
    return token


_TOKEN = re.compile(r"[!-~]+")


def _version(version: object) -> int:
    """A config version for a path or a query, refused as the service refuses one, not as
    httpx fails on text it cannot send."""
    return validate_int("version", version, 1, MAX_VERSION)


def _resource_pool_path(ref: str) -> str:
    return f"/pools/{_segment(ref, 'resource pool')}"


def _segment(name: str, missing: str | Callable[[str], NotFound]) -> str:
    """A name as one path segment: ``?``, ``#``, ``%`` in it reach the server as such, and so
    does a name of dots, which HTTP clients would otherwise resolve as ``.`` and ``..``. No
    name or id is empty or holds a ``/``, and the server could not tell such a segment from
    another route (it decodes ``%2F`` before routing): not found, in the service's words,
    without asking for it (``missing``: what the name names, or the error for it)."""
    # Longer than any name or id: not found either (httpx refused the URL's length with
    # an error of its own, a traceback in the CLI, helper-97).
    if not as_ref(name) or "/" in name or len(name) > MAX_NAME:
        raise NotFound.of(missing, name) if isinstance(missing, str) else missing(name)
    segment = quote(name, safe="")
    return segment.replace(".", "%2E") if not segment.strip(".") else segment


class RemoteTrees:
    """``fairpool.trees_service.TreesService`` over HTTP: the same methods the CLI uses;
    results are ``Answer`` objects whose ``as_dict()`` equals the local view's."""

    def __init__(self, remote: RemoteService) -> None:
        self._remote = remote

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._remote._call(method, path, **kwargs)

    def _tree(self, name: str | None) -> str:
        """``name``, else the default_tree, as the service resolves it."""
        if name is not None:
            return name
        default = self.default_tree()
        if default is None:
            raise InvalidInput.no_tree(trees=bool(self.list_trees()))
        return default

    # -- nodes -------------------------------------------------------------------------------

    def add_node(
        self, name: str, tags: Sequence[str], resources: Mapping[str, object]
    ) -> Answer:
        body = {"name": name, "tags": listed("tags", tags), "resources": resources}

        def done() -> Any:
            # As the service stores it (tags sorted once, "64GiB" in bytes). Only now: the
            # CLI starts without the front-end.
            from fairpool.frontends.trees import ClusterNode

            node = ClusterNode.create(name, tags, resources)
            asked = {"name": node.name, "tags": sorted(node.tags),
                     "resources": dict(node.resources)}
            return _showing(self._call("GET", "/nodes")["items"], asked)

        return Answer(self._remote._once("POST", "/nodes", 409, done, json=body))

    def list_nodes(self) -> list[Answer]:
        return [Answer(item) for item in self._call("GET", "/nodes")["items"]]

    def remove_node(self, name: str) -> None:
        self._remote._once("DELETE", f"/nodes/{_segment(name, 'node')}", 404)

    # -- trees -------------------------------------------------------------------------------

    def create_tree(self, name: str, options: Mapping[str, object] | None = None) -> Answer:
        body = {"name": name, "config": _options(options)}

        def done() -> Any:  # the options as given: the service keeps them so
            return _showing(self._call("GET", "/pool-trees")["items"], body)

        return Answer(self._remote._once("POST", "/pool-trees", 409, done, json=body))

    def apply_tree(self, document: str, name: str | None = None, create: bool = False) -> Answer:
        body = {"document": document, "name": name, "create": create}
        if not create:  # create or update: a retry changes nothing
            return Answer(self._call("POST", "/pool-trees/apply", json=body))

        def done() -> Any:  # the tree as the document makes it: what this create answered
            from fairpool.frontends.trees import load_pool_tree, tree_document  # as add_node's

            tree = load_pool_tree(document, name)
            asked = {"name": tree.name, "config": dict(tree_document(document).get("config") or {}),
                     "pools": len(tree.pools)}
            if _showing(self._call("GET", "/pool-trees")["items"], asked) is None:
                return None
            return {"tree": tree.name,
                    "changes": [f"+ tree {tree.name}",
                                *(f"+ pool {pool}" for pool in tree.parents_first())]}

        return Answer(self._remote._once("POST", "/pool-trees/apply", 409, done, json=body))

    def set_tree(self, name: str, option: str, value: str) -> Answer:
        body = {"option": option, "value": value}
        return Answer(self._call("PATCH", f"/pool-trees/{_segment(name, 'pool tree')}", json=body))

    def delete_tree(self, name: str) -> None:
        self._remote._once("DELETE", f"/pool-trees/{_segment(name, 'pool tree')}", 404)

    def show_tree(self, name: str | None = None) -> Answer:
        return Answer(self._call("GET", f"/pool-trees/{_segment(self._tree(name), 'pool tree')}"))

    def export_tree(self, name: str | None = None) -> dict[str, object]:
        tree = _segment(self._tree(name), "pool tree")
        return dict(self._call("GET", f"/pool-trees/{tree}/document"))

    def list_trees(self) -> list[Answer]:
        return [Answer(item) for item in self._call("GET", "/pool-trees")["items"]]

    def default_tree(self, name: str | None = None) -> str | None:
        if name is None:
            found = self._call("GET", "/default-tree")["default_tree"]
        else:
            found = self._call("PUT", "/default-tree", json={"name": name})["default_tree"]
        return None if found is None else str(found)

    def reconcile(self, name: str | None = None) -> Answer:
        tree = _segment(self._tree(name), "pool tree")
        return Answer(self._call("POST", f"/pool-trees/{tree}/reconcile"))

    # -- pools -------------------------------------------------------------------------------

    def create_pool(
        self, tree: str, name: str, parent: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> Answer:
        body = {"name": name, "parent": parent, "config": _options(options)}
        path = f"/pool-trees/{_segment(tree, 'pool tree')}/pools"

        def done() -> Any:
            from fairpool.frontends.trees import PoolConfig  # only now, as add_node's

            config = PoolConfig.from_mapping(body["config"]).to_mapping()  # as stored
            asked = {**body, "config": config, "ephemeral": False}
            return _showing([self._call("GET", self._pool_path(tree, name))], asked)

        return Answer(self._remote._once("POST", path, 409, done, json=body))

    def set_pool(self, tree: str, name: str, option: str, value: str) -> Answer:
        body = {"option": option, "value": value}
        return Answer(self._call("PATCH", self._pool_path(tree, name), json=body))

    def describe_pool(self, tree: str | None, name: str) -> Answer:
        return Answer(self._call("GET", self._pool_path(self._tree(tree), name)))

    def delete_pool(self, tree: str, name: str) -> None:
        self._remote._once("DELETE", self._pool_path(tree, name), 404)

    def _pool_path(self, tree: str, name: str) -> str:
        path = f"/pool-trees/{_segment(tree, 'pool tree')}"

        def missing(name: str) -> NotFound:  # the tree is looked up first, as the service does
            self._call("GET", path)
            return NotFound.of("pool", name, f" in tree {tree}")

        return f"{path}/pools/{_segment(name, missing)}"

    # -- operations --------------------------------------------------------------------------

    def start_operation(
        self,
        *,
        user: str,
        job_resources: Mapping[str, object],
        job_count: int,
        trees: Sequence[str] = (),
        pool: str | None = None,
        weight: str | int | float = 1,
        gang: bool = False,
        resource_limits: Mapping[str, object] | None = None,
        interruptible: bool = False,
        tree_options: Mapping[str, object] | None = None,
    ) -> Answer:
        body = {
            "user": user, "job_resources": job_resources, "job_count": job_count,
            # Named otherwise in the API: checked here, to be refused as the SDK names them.
            "pool_trees": listed("trees", trees), "pool": pool, "weight": weight, "gang": gang,
            "resource_limits": resource_limits,
            "interruptible": interruptible,
            "scheduling_options_per_pool_tree": None if tree_options is None
            else mapping("tree_options", tree_options),
            "idempotency_key": new_id(),  # one per call, as a request's
        }
        return Answer(self._call("POST", "/operations", json=body))

    def describe_operation(self, ref: str) -> Answer:
        return Answer(self._call("GET", f"/operations/{_segment(ref, 'operation')}"))

    def list_operations(self, tree: str | None = None, status: str | None = None) -> list[Answer]:
        return list(self.operation_page(tree, status).items)

    def operation_page(
        self, tree: str | None = None, status: str | None = None, *, limit: int | None = None,
        offset: int = 0, after: str | None = None,
    ) -> Page[Answer]:
        filters = {"tree": tree, "status": status}
        return self._remote._page("/operations", filters, OPERATION_STATUSES,
                                  (limit, offset, after), Answer)

    def complete_operation(self, ref: str) -> Answer:
        path = f"/operations/{_segment(ref, 'operation')}/complete"
        return Answer(self._remote._ending(path, "completed"))

    def abort_operation(self, ref: str) -> Answer:
        path = f"/operations/{_segment(ref, 'operation')}/abort"
        return Answer(self._remote._ending(path, "aborted"))
