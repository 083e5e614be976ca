"""API tokens on the server: who is calling (authentication) and what it may do (authorization).

Off unless the server is bound to a non-loopback address (``auth_enabled``). When on, every
route under ``/api/v1`` (``/healthz``, ``/readyz`` and ``/metrics`` excepted) runs ``authorize``
first, as a router dependency:

* no ``Authorization: Bearer <token>`` header, an unknown or a revoked token → 401 with
  ``WWW-Authenticate: Bearer``;
* the route's rule (``RULES``, by endpoint name; a route missing from it is admin-only)
  forbids it for the token's role → 403;
* a submitter naming a request, workload or operation that it did not submit → 404, exactly
  as for one that does not exist (its id prefix is resolved among its own only, so another's
  neither matches nor makes a prefix ambiguous).

Endpoints that need the caller take ``Caller`` (the same cached ``authorize`` call): creating a
request checks the component (``owner_of_new_request``), submitting a workload or starting an
operation records the token (``owner_of``); lists and pool details keep only the submitter's
own (``visible_requests``, ``visible_pool``, ``visible``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request, params
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from fairpool.api.models import TEXT_PATTERN
from fairpool.errors import counted, is_unicode
from fairpool.frontends.names import MAX_NAME
from fairpool.store import repo
from fairpool.store.records import ApiToken, TokenRole
from fairpool.views import PREEMPTING, EventView, PoolView, RequestView

if TYPE_CHECKING:
    from fairpool.service import Service

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class AuthSetupError(ValueError):
    """The server's auth flags make no sense together (e.g. ``--no-auth`` on a public host)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to ``--host``) only serves this machine: a loopback address,
    or a name that resolves to one from the hosts file (``localhost.``, fully qualified, is
    asked of DNS, which may answer anything: not one)."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def auth_enabled(host: str, auth: bool | None = None, insecure: bool = False) -> bool:
    """Whether the server checks tokens: ``auth`` when given, else on unless ``host`` is a
    loopback address. Serving a non-loopback host without tokens needs ``insecure``."""
    enabled = not is_loopback(host) if auth is None else auth
    if not enabled and not is_loopback(host) and not insecure:
        raise AuthSetupError(
            f"refusing to serve {host} without auth: anyone who can reach it could change "
            "pools and requests. Drop --no-auth (and create tokens with `fairpool token "
            "create`), or add --insecure if the network is trusted"
        )
    return enabled


class Rule(Enum):
    """What a route demands of a token; admins pass every rule."""

    #: Admin tokens only.
    ADMIN = "admin"
    #: Any valid token (reads of pools, policies and components; submitters see only their own
    #: requests).
    ANY = "any"
    #: Any valid token; a submitter only on the requests, workloads or operations it submitted
    #: (path parameter ``ref``). The values are what ``repo.OWNED`` calls them.
    OWN_REQUEST = "request"
    OWN_WORKLOAD = "workload"
    OWN_OPERATION = "operation"


#: Every ``/api/v1`` route by endpoint name. A route not listed here is admin-only.
RULES: dict[str, Rule] = {
    "create_pool": Rule.ADMIN,
    "update_pool": Rule.ADMIN,
    "delete_pool": Rule.ADMIN,
    "list_pools": Rule.ANY,
    "get_pool": Rule.ANY,
    "pool_requests": Rule.ANY,
    "attach_policy": Rule.ADMIN,
    "update_policy": Rule.ADMIN,
    "detach_policy": Rule.ADMIN,
    "list_policies": Rule.ANY,
    "list_components": Rule.ANY,
    # The component is checked by the endpoint, which has the parsed body.
    "create_request": Rule.ANY,
    "list_requests": Rule.ANY,
    "get_request": Rule.OWN_REQUEST,
    "request_events": Rule.OWN_REQUEST,
    "wait_request": Rule.OWN_REQUEST,
    "heartbeat": Rule.OWN_REQUEST,
    "release": Rule.OWN_REQUEST,
    "cancel": Rule.OWN_REQUEST,
    "delete_request": Rule.OWN_REQUEST,
    "reconcile": Rule.ADMIN,
    "prune": Rule.ADMIN,
    "check_admin": Rule.ADMIN,
    # The scheduler config: applying and rolling back configs is for admins; reading it and
    # submitting workloads for everyone, each ending only its own workloads.
    "apply_config": Rule.ADMIN,
    "rollback_config": Rule.ADMIN,
    **{name: Rule.ANY for name in (
        "validate_config", "preview_config", "get_config", "list_configs", "diff_config",
        "explain",
        "submit_workload", "list_workloads", "list_queues", "describe_queue",
    )},
    **{name: Rule.OWN_WORKLOAD for name in (
        "get_workload", "release_workload", "cancel_workload",
    )},
    # Pool trees: nodes, trees and their pools are administered by admins; reading them and
    # starting operations is for everyone, each completing and aborting only its own.
    **{name: Rule.ADMIN for name in (
        "add_node", "remove_node", "create_pool_tree", "apply_pool_tree", "set_pool_tree",
        "delete_pool_tree",
        "set_default_tree", "reconcile_pool_tree", "create_tree_pool", "set_tree_pool",
        "delete_tree_pool",
    )},
    **{name: Rule.ANY for name in (
        "list_nodes", "list_pool_trees", "show_pool_tree", "export_pool_tree", "get_default_tree",
        "describe_tree_pool", "list_operations", "start_operation",
    )},
    **{name: Rule.OWN_OPERATION for name in (
        "describe_operation", "complete_operation", "abort_operation",
    )},
}

_REF = re.compile(TEXT_PATTERN)


class Auth:
    """The server's auth switch and token lookups (``app.state.auth``)."""

    def __init__(self, service: Service, enabled: bool) -> None:
        self.service = service
        self.enabled = enabled

    def dependencies(self) -> list[params.Depends]:
        """The router's dependencies: none when auth is off (the API and its OpenAPI schema
        are then exactly as without auth); else the bearer scheme (for ``/docs``) and
        ``authorize``."""
        if not self.enabled:
            return []
        return [Depends(HTTPBearer(auto_error=False)), Depends(authorize)]

    def authenticate(self, header: str | None) -> ApiToken:
        """The valid token named by an ``Authorization`` header; 401 otherwise."""
        if not header:
            raise _unauthorized(
                "missing API token: send 'Authorization: Bearer <token>' "
                "(the CLI and SDK send $FAIRPOOL_TOKEN)"
            )
        scheme, _, secret = header.strip().partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise _unauthorized("the Authorization header must be 'Bearer <token>'")
        token = self.service.authenticate(secret)
        if token is None:
            raise _unauthorized("invalid API token", invalid=True)
        if token.revoked_at is not None:
            raise _unauthorized(f"API {label(token)} was revoked", invalid=True)
        return token

    def resolve_own(self, token: ApiToken, what: str, ref: str) -> str:
        """The full id of the caller's ``what`` (``repo.OWNED``) ``ref`` (id or prefix);
        ``NotFound`` else."""
        with self.service.db.read() as conn:
            return repo.resolve_own(conn, what, ref, token.id)

    def own_ids(self, token: ApiToken, what: str, ids: list[str]) -> set[str]:
        with self.service.db.read() as conn:
            return repo.created_by(conn, what, token.id, ids)

    def others_ids(self, token: ApiToken, what: str, ids: list[str]) -> set[str]:
        with self.service.db.read() as conn:
            return repo.others_of(conn, what, token.id, ids)


async def authorize(request: Request) -> ApiToken | None:
    """The calling token once it passed the route's rule; None when auth is off (at no cost:
    no thread, no database read)."""
    auth: Auth = request.app.state.auth
    if not auth.enabled:
        return None
    return await run_in_threadpool(_authorize, auth, request)


def _authorize(auth: Auth, request: Request) -> ApiToken:
    """``authorize``'s checks, which read the database. For a submitter on a route of its own
    requests, workloads or operations, the path's ``ref`` is replaced by the full id of its
    own, so the endpoint acts on that one whatever else shares the prefix."""
    headers = request.headers.getlist("authorization")
    if len(headers) > 1:  # a proxy reading the last would disagree on who is calling
        raise _unauthorized("more than one Authorization header")
    token = auth.authenticate(headers[0] if headers else None)
    if token.role is TokenRole.ADMIN:
        return token
    route = request.scope.get("route")
    rule = RULES.get(getattr(route, "name", ""), Rule.ADMIN)
    if rule is Rule.ADMIN:
        raise HTTPException(
            403, f"this operation needs an admin token; {label(token)} is a {token.role.value}"
        )
    if rule is not Rule.ANY:  # one of its own, by the name repo.OWNED gives it
        path_params = request.scope["path_params"]
        ref = path_params.get("ref")
        # A malformed ref is left to the endpoint's validation (422), not looked up.
        if isinstance(ref, str) and _valid_ref(ref):
            path_params["ref"] = auth.resolve_own(token, rule.value, ref)
    return token


class Forbidden(HTTPException):
    """403 for a value the caller's token does not allow: the answer names its field."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(403, detail)
        self.field = field


#: The caller's token in an endpoint (None when auth is off).
Caller = Annotated[ApiToken | None, Depends(authorize)]


def owner_of_new_request(caller: ApiToken | None, component: str) -> str | None:
    """The token id to record as a new request's owner; 403 if a submitter's token does not
    allow ``component``."""
    if caller is None:
        return None
    if caller.role is TokenRole.SUBMITTER and component not in caller.components:
        allowed = ", ".join(f"`{c}`" for c in caller.components)
        raise Forbidden(
            "component",
            f"{label(caller)} may not create requests for component `{component}`; "
            f"it allows {allowed}",
        )
    return caller.id


def owner_of(caller: ApiToken | None) -> str | None:
    """The token id to record as a new workload's or operation's owner."""
    return None if caller is None else caller.id


def listed_for(caller: ApiToken | None) -> str | None:
    """The token whose rows alone a list shows ``caller``: a submitter's own; None, all."""
    return caller.id if caller is not None and caller.role is TokenRole.SUBMITTER else None


#: An id as fairpool makes them (``fairpool.ids``), with the word before it if it names its
#: kind ("workload <id>").
_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
#: Where answers name other workloads or operations: the texts fairpool writes and the fields
#: that hold a preemptor or victims. Not what the caller gave (labels, user, resources):
#: rewritten, those would tell it which ids are someone else's.
_NAMING = frozenset({"reason", "notes", "preempted", "preempted_by"})


def without_others(auth: Auth, caller: ApiToken | None, what: str, data: Any) -> Any:
    """``data`` (an answer's JSON) as a submitter may see it: each id of another's ``what``
    (workload, operation) named in a reason, a job's ``preempted_by`` or a tree's element
    reads "another workload" (or operation). As is for an admin (or without auth). One read,
    for the ids named."""
    if caller is None or caller.role is TokenRole.ADMIN:
        return data
    pattern = re.compile(rf"(?:\b{what} )?({_ID})")
    named: set[str] = set()

    def collect(text: str) -> str:
        named.update(m[1] for m in pattern.finditer(text))
        return text

    _naming(data, what, collect)
    others = auth.others_ids(caller, what, sorted(named)) if named else set()
    if not others:
        return data
    return _naming(data, what, lambda text: pattern.sub(
        lambda m: f"another {what}" if m[1] in others else m[0], text))


def answering(auth: Auth, what: str) -> Callable[..., JSONResponse]:
    """``answer(caller, data, status=200)``: the JSON answer of a ``what`` route (workloads,
    operations), ``without_others`` for a submitter."""
    def answer(caller: ApiToken | None, data: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(without_others(auth, caller, what, data), status_code=status)

    return answer


def _naming(value: Any, what: str, text: Callable[[str], str], naming: bool = False) -> Any:
    """``value`` with ``text`` applied to the strings that may name others' ids: under
    ``_NAMING`` keys, and the names of a tree's elements of kind ``what``."""
    if isinstance(value, dict):
        element = value.get("kind") == what
        return {key: _naming(item, what, text,
                             naming or key in _NAMING or (element and key == "name"))
                for key, item in value.items()}
    if isinstance(value, list):
        return [_naming(item, what, text, naming) for item in value]
    return text(value) if naming and isinstance(value, str) else value


def visible_requests(
    auth: Auth, caller: ApiToken | None, views: list[RequestView]
) -> list[RequestView]:
    """All of ``views`` for an admin (or without auth); a submitter's own only, each as
    ``shown`` to it."""
    if caller is None or caller.role is TokenRole.ADMIN or not views:
        return views
    # One read for the requests and the others their reasons name.
    asked = [v.id for v in views] + [i for v in views for i in names_others(v)]
    own = auth.own_ids(caller, "request", asked)
    return [_without_others(v, own) for v in views if v.id in own]


def names_others(view: RequestView) -> list[str]:
    """The other requests ``view`` names: the one that preempted it, the ones preempted for
    it (its reason lists them, ``allocated_on``)."""
    return [*filter(None, [view.preempted_by_id]), *_victims(view.status_reason)]


def shown(auth: Auth, caller: ApiToken | None, view: RequestView) -> RequestView:
    """The caller's own request as it may see it (``_without_others``)."""
    if caller is None or caller.role is TokenRole.ADMIN or not (named := names_others(view)):
        return view
    return _without_others(view, auth.own_ids(caller, "request", named))


def shown_events(auth: Auth, caller: ApiToken | None, events: list[EventView]
                 ) -> list[EventView]:
    """The caller's own request's history as it may see it: the requests of others that
    preempted it or that it preempted are not named (``_without_others``)."""
    if caller is None or caller.role is TokenRole.ADMIN:
        return events
    named = [[*filter(None, [e.data.get("by")]), *_victims(e.message)] for e in events]
    if not any(named):
        return events
    own = auth.own_ids(caller, "request", [i for ids in named for i in ids])
    return [
        e if own.issuperset(ids) else replace(
            e, message=unnamed_others(e.message, e.data.get("by"), own),
            data={k: v for k, v in e.data.items() if k != "by" or v in own},
        )
        for e, ids in zip(events, named, strict=True)
    ]


def _without_others(view: RequestView, own: set[str]) -> RequestView:
    """A submitter learns nothing of others' requests: one that preempted ``view``, or that
    it preempted, is not named unless it is among ``own`` too."""
    if own.issuperset(names_others(view)):
        return view
    preemptor = view.preempted_by_id
    reason = view.status_reason and unnamed_others(view.status_reason, preemptor, own)
    return replace(view, preempted_by_id=preemptor if preemptor in own else None,
                   status_reason=reason)


def _victims(text: str | None) -> list[str]:
    """The requests an allocated request's reason (or its event) names as preempted for it:
    ``..., preempting request A`` or ``..., preempting requests A, B``."""
    if not text or PREEMPTING not in text:
        return []
    named = text[text.rindex(PREEMPTING) + len(PREEMPTING):]
    noun, _, ids = named.partition(" ")
    return ids.split(", ") if noun in ("request", "requests") else []


def unnamed_others(text: str, preemptor: str | None, own: set[str]) -> str:
    """``text`` with the requests it names that are not among ``own`` unnamed: its
    ``preemptor`` as another request, the ones it preempted counted."""
    if preemptor is not None and preemptor not in own:
        text = text.replace(f"request {preemptor}", "another request")
    victims = _victims(text)
    kept = [v for v in victims if v in own]
    if len(kept) == len(victims):
        return text
    others = len(victims) - len(kept)
    named = [f"request{'s' if len(kept) > 1 else ''} {', '.join(kept)}"] if kept else []
    named.append("another request" if others == 1 and not kept
                 else counted(others, "other request"))
    return text[: text.rindex(PREEMPTING) + len(PREEMPTING)] + " and ".join(named)


def visible_pool(auth: Auth, caller: ApiToken | None, pool: PoolView) -> PoolView:
    """The pool with only the requests the caller may see (its totals stay whole)."""
    if caller is None or caller.role is TokenRole.ADMIN:
        return pool
    return replace(
        pool,
        active_requests=tuple(visible_requests(auth, caller, list(pool.active_requests))),
        queued_requests=tuple(visible_requests(auth, caller, list(pool.queued_requests))),
    )


def label(token: ApiToken) -> str:
    """How messages name a token: its name and prefix, never more of the secret."""
    return f"token `{token.name}` ({token.prefix}…)" if token.name else f"token {token.prefix}…"


def _valid_ref(ref: str) -> bool:
    """What the endpoints' ``Ref`` accepts (and a database can store)."""
    return 1 <= len(ref) <= MAX_NAME and bool(_REF.fullmatch(ref)) and is_unicode(ref)


def _unauthorized(detail: str, *, invalid: bool = False) -> HTTPException:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return HTTPException(401, detail, headers={"WWW-Authenticate": challenge})
