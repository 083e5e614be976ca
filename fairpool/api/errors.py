"""Every error is JSON ``{"detail": "<one line>", "field": "<path>" | null}``.

Mapping: ``InvalidInput`` and body/query/path validation → 422 naming the field; malformed
JSON → 400; a body not sent as JSON → 415; ``NotFound`` → 404; ``AmbiguousReference`` and
``Conflict`` → 409; bodies over ``MAX_BODY_BYTES`` → 413; the database busy or away → 503;
a request the server's shutdown cuts short → 503 (``AnswerCancelled``). Anything else is a
bug: 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fairpool.api.auth import Forbidden, authorize
from fairpool.api.semantics import NO_STORE
from fairpool.errors import (
    Conflict,
    FairpoolError,
    InvalidInput,
    NotFound,
    SchemaMoved,
    Unreachable,
    at_least,
    clipped,
    one_line,
    shown,
    words,
)

log = logging.getLogger("fairpool.api")

#: pydantic's error kinds for a number out of its bounds.
_BOUNDS = frozenset(("greater_than", "greater_than_equal", "less_than", "less_than_equal"))


#: What a database that is away raises (an outage, a restart, its lock held long): a passing
#: state, which a failed pass or scrape logs as one line, not a traceback each tick.
DATABASE_AWAY = (OperationalError, PoolTimeout, Unreachable)


def log_failure(what: str, error: Exception) -> None:
    """``what`` failed with ``error``: one line when the database is away, else with its
    traceback."""
    if isinstance(error, DATABASE_AWAY):
        log.warning("%s: database unavailable: %s", what, words(error))
    else:
        log.error("%s", what, exc_info=error)


def error_response(
    status: int,
    detail: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"detail": _encodable(one_line(detail)), "field": field and _encodable(field)},
        status_code=status, headers=headers,
    )


def _encodable(text: str) -> str:
    """``text`` with a lone surrogate (a name's ``\\ud800`` in a YAML document) escaped as a
    terminal shows it: the answer is UTF-8, which cannot hold one."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _message(kind: str, ctx: Mapping[str, Any], value: object, default: str) -> str:
    """pydantic's message, in the service's words where they say the same thing."""
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind == "int_parsing_size":  # more digits than Python reads (4,300)
        return "is too large to read"
    if kind == "finite_number":  # NaN, or digits enough to overflow a float
        return "must be a finite number"
    if kind == "string_type":
        return "must be a string"
    if kind == "dict_type":
        return "must be a mapping"
    if kind == "list_type":
        return "must be a list"
    if kind == "string_unicode":  # a lone surrogate, as the service words it
        return "must be valid Unicode text"
    if kind in ("literal_error", "enum") and isinstance(ctx.get("expected"), str):
        choices = re.findall(r"'([^']*)'", ctx["expected"])  # "'a', 'b' or 'c'"
        return f"must be one of {', '.join(choices)}"
    # An integer's bounds are integers; a number's are floats (``ge=0.0``), whatever is given.
    bound = ctx.get("gt", ctx.get("ge"))
    integer = isinstance(value, int) and not isinstance(value, bool | float) and not isinstance(
        bound, float)
    if kind == "greater_than" and "gt" in ctx:
        return at_least(ctx["gt"] + 1) if integer else f"must be > {ctx['gt']:g}"
    if kind == "greater_than_equal" and "ge" in ctx:
        return at_least(ctx["ge"]) if integer else f"must be >= {ctx['ge']:g}"
    if kind == "less_than_equal" and "le" in ctx:
        return f"must be at most {ctx['le']}"
    if kind == "string_too_long" and "max_length" in ctx:
        return f"must be at most {ctx['max_length']} characters"
    if kind == "too_long" and "max_length" in ctx:
        unit = "keys" if ctx.get("field_type") == "Dictionary" else "items"
        return f"must have at most {ctx['max_length']} {unit}"
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return "must be a non-empty string"
    if kind == "string_pattern_mismatch":
        if isinstance(value, str) and "\x00" in value:
            return "must not contain NUL characters"
        return "must be a non-empty string"  # NAME_PATTERN: only whitespace
    return default.removeprefix("Value error, ")


#: How pydantic names a union's member in an error's location: "int", "constrained-str",
#: "function-after[text(), constrained-str]".
_MEMBER = re.compile(r"int|float|str|bool|none|constrained-[\w-]+|[\w-]+\[.*\]")


def _union_as_one(errors: Sequence[Any]) -> Mapping[str, Any] | None:
    """A value no member of a union takes fails once per member, each located at (field,
    member): one error for the field instead, as the service words it: a text's own
    problem (too long) if it is text, else the first member's ("must be an integer")."""
    locs = [tuple(error.get("loc", ())) for error in errors]
    head = locs[0][:-1]
    if len(errors) < 2 or len(head) < 2 or any(
        loc[:-1] != head or not _MEMBER.fullmatch(str(loc[-1])) for loc in locs
    ):
        return None
    kinds = [str(error.get("type", "")) for error in errors]
    text = (e for e, k in zip(errors, kinds, strict=True) if k.startswith("string_")
            and k != "string_type")
    return {**next(text, errors[0]), "loc": head}


def _unreadable(cause: BaseException | None) -> str:
    """Why a body could not be read as JSON at all, as a syntax error is worded."""
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{cause.object[cause.start]:02x}) at position {cause.start}"
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        # Python reads no integer of more than sys.get_int_max_str_digits() digits.
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return "unreadable"


def validation_error(errors: Sequence[Any]) -> JSONResponse:
    """The first error, in the service's own style: ``field: problem (got value)``."""
    if not errors:
        return error_response(422, "invalid request")
    first: Mapping[str, Any] = _union_as_one(errors) or errors[0]
    if first is not errors[0]:
        errors = [first]
    loc = tuple(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "json_invalid":
        problem = (first.get("ctx") or {}).get("error", "invalid JSON")
        where = f" at position {loc[1]}" if len(loc) > 1 else ""
        return error_response(400, f"malformed JSON body: {problem}{where}")
    path = [str(part) for part in loc[1:]] if loc and loc[0] in (
        "body", "query", "path", "header", "cookie"
    ) else [str(part) for part in loc]
    if path[-1:] == ["[key]"]:  # a mapping's key, not its value: named as the service does
        path = [*path[:-3], f"{path[-3]} key"] if len(path) >= 3 else ["key"]
    field = ".".join(path) or None
    if field is None and isinstance(first.get("input"), bytes | bytearray):
        # FastAPI hands the body over unparsed when it is not declared as JSON.
        return error_response(415, "request body must be JSON (Content-Type: application/json)")
    value = first.get("input")
    if loc[:1] in (("query",), ("path",)) and kind in _BOUNDS and isinstance(value, str):
        # A number in a URL (``models._written``: written as JSON writes it) out of its
        # bounds: worded and shown as the number it is, as the CLI and the SDK show it.
        value = json.loads(value)
    message = _message(kind, first.get("ctx") or {}, value, str(first.get("msg", "invalid value")))
    if kind == "string_too_long" and isinstance(value, str):
        value = clipped(value)  # shown as the service shows it
    elif kind == "too_long" and isinstance(value, Mapping | list):
        value = len(value)
    detail = f"{field or 'request body'}: {message}"
    if kind != "missing" and "input" in first:
        detail += f" (got {shown(value)})"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return error_response(422, detail, field)


async def known_query(request: Request) -> None:
    """A route's dependency: a query parameter it does not declare, or one given twice, is
    refused (422 naming it). Ignored, ``?page=2`` would answer the first page as if it
    were the second, and ``?status=a&status=b`` one of the two. (``async``: on the loop, no
    worker thread for a few µs of work.)"""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    declared = _query_names(route)
    seen: set[str] = set()
    for name, value in request.query_params.multi_items():
        if name not in declared:
            takes = ", ".join(sorted(declared)) or "none"
            raise InvalidInput(name, value, f"unknown query parameter (this route takes: {takes})")
        if name in seen:
            raise InvalidInput(name, request.query_params.getlist(name), "given more than once")
        seen.add(name)


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` declares, its dependencies' included."""
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(field.alias for field in dependant.query_params)
        pending.extend(dependant.dependencies)
    return frozenset(names)


#: FastAPI's answer to a body its JSON parser fails on other than by a syntax error.
UNREADABLE_BODY = "There was an error parsing the body"


def install_error_handlers(app: FastAPI) -> None:
    async def refused(request: Request) -> JSONResponse | None:
        """FastAPI parses a body before the route's dependencies run: when it cannot, the
        caller's token is checked all the same, so that a missing or bad one is 401 (a
        submitter on an admin route 403) whatever the body."""
        try:
            await authorize(request)
        except HTTPException as error:
            return await on_http(request, error)
        except FairpoolError as error:  # its own request's ref: not found
            return await on_fairpool(request, error)
        return None

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if any(error.get("type") == "json_invalid" for error in exc.errors()):
            return await refused(request) or validation_error(exc.errors())
        return validation_error(exc.errors())

    async def on_fairpool(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, SchemaMoved):  # for good: no Retry-After
            return error_response(503, str(exc))
        if isinstance(exc, Unreachable):  # the database lost or away: as an OperationalError
            return await on_database(request, exc)
        if isinstance(exc, InvalidInput):
            return error_response(422, str(exc), exc.field)
        if isinstance(exc, NotFound):
            return error_response(404, str(exc))
        if isinstance(exc, Conflict):  # AmbiguousReference too
            return error_response(409, str(exc))
        return error_response(400, str(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        # A body not even JSON can read (not UTF-8, nested past the parser's depth).
        if exc.status_code == 400 and exc.detail == UNREADABLE_BODY:
            return await refused(request) or error_response(
                400, f"malformed JSON body: {_unreadable(exc.__cause__)}")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path only.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        field = exc.field if isinstance(exc, Forbidden) else None
        return error_response(exc.status_code, str(exc.detail), field, headers=headers)

    async def on_database(_: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", words(exc))
        return error_response(
            503, "database busy or unreachable; retry later", headers={"Retry-After": "1"}
        )

    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        log.error("internal error", exc_info=exc)
        return error_response(500, f"internal error ({type(exc).__name__})")

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(FairpoolError, on_fairpool)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(OperationalError, on_database)
    app.add_exception_handler(PoolTimeout, on_database)
    app.add_exception_handler(Exception, on_bug)


def _allowed_methods(request: Request) -> list[str]:
    allowed: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            allowed |= set(getattr(route, "methods", None) or ())
    if "GET" in allowed:  # answered as GET by every route (``semantics.as_get``)
        allowed.add("HEAD")
    return sorted(allowed)


class AnswerCancelled:
    """A request whose task is cancelled before its answer began is answered 503.

    uvicorn cancels the requests in flight when it is forced to quit (a second Ctrl-C) or
    when the shutdown's grace is over, and answered them 500, which clients take for a bug
    and do not retry: yet a write they made may commit all the same (queued for group
    commit, or in a worker thread, which no cancellation stops). A 503 the CLI and the SDK
    retry, and the retry finds what was done (a create's idempotency key, ``RemoteService``'s
    checks). An answer already begun cannot be taken back: the connection drops. Knowing
    whether it began (a wrapped ``send``) costs ~0.2 µs a request.

    The outermost layer, it also appends ``Cache-Control: no-store`` to every answer whose
    path starts with ``no_store`` (``semantics.NO_STORE``): in the same wrapped ``send``, so
    that the header costs no second one."""

    def __init__(self, app: ASGIApp, no_store: str | None = None) -> None:
        self.app = app
        self.no_store = no_store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False
        no_store = self.no_store is not None and scope["path"].startswith(
            self.no_store, len(scope.get("root_path", "")))  # the path holds a proxy's prefix

        async def sending(message: Message) -> None:
            nonlocal started
            if no_store and not started:  # the answer's start: none of ours sets the header
                message["headers"] = [*message.get("headers", ()), NO_STORE]
            started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if started:
                raise
            log.warning("%s %s: the server stopped before answering; answered 503",
                        scope["method"], scope["path"])
            response = error_response(
                503, "server shutting down; retry later (what was asked may be done)",
                headers={"Retry-After": "1", "Connection": "close"},
            )
            # Answered: the task ends here, which is all its cancellation asked (re-raised,
            # uvicorn would log it as an error of the app).
            await response(scope, receive, sending)


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, and compressed ones with 415,
    before the app reads any of it.

    A declared Content-Length over the limit is refused at once; a body without one (chunked)
    is read up to the limit and then handed to the app whole.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, per_path: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        #: Paths allowed a different limit (a whole config document is larger than a request).
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(scope.get("path", ""), self.max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                # A gzip body was read as JSON that is not UTF-8, a "br" one as plain text
                # (RFC 9110 15.5.16: 415 for a content coding not supported; helper-96).
                coding = value.decode("latin-1")
                await error_response(415, f"request body: Content-Encoding {coding!r} is not "
                                     "supported: send it uncompressed")(scope, receive, send)
                return
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await self._refuse(scope, receive, send, limit)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(scope, receive, send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = JSONResponse(
            {"detail": f"request body larger than {limit} bytes", "field": None},
            status_code=413,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)

