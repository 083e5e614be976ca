"""The busy request routes (submit, long-poll, heartbeat, release, cancel), served without
FastAPI's per-request machinery.

They are most of a server's requests. Through FastAPI each one passes its exception and
exit-stack middleware, the route table, the request wrapper and the dependency solver before
its endpoint runs: in process, as much CPU again as a bare endpoint's whole request
(docs/performance.md). ``BusyRoutes`` matches the method and path itself, validates the
inputs with the endpoint's own annotations (path, query and header parameters, the JSON
body's model) as FastAPI would, calls the endpoint function and sends its response.

Whatever it does not take exactly so, it hands to FastAPI untouched: invalid input, a content
type other than ``application/json``, a query parameter the endpoint does not declare (or one
given twice), a header parameter given twice, a body in several parts. So every error is
FastAPI's own answer, and the endpoints stay FastAPI routes (one implementation, the same
OpenAPI schema). Errors the endpoint raises go to the app's exception handlers, as FastAPI
would send them. Only without auth: with tokens, each route first reads its token in a worker
thread, beside which FastAPI's share is small. It runs ahead of FastAPI's own layers
(``FairpoolApp``), behind the body's size limit; a ``HEAD`` reaches it as its ``GET``
(``semantics.as_get``).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi import params
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, HTTPExceptionHandler, Message, Receive, Scope, Send

from fairpool.api.auth import authorize

Endpoint = Callable[..., Awaitable[Response]]


class _Declined(Exception):
    """The request is not one this module takes: FastAPI serves it."""


@dataclass(frozen=True)
class BusyRoute:
    """One route: ``method`` and ``path`` (a template, as FastAPI's) and its endpoint. How each
    of the endpoint's parameters is filled comes from its signature: a parameter named in the
    path is a path parameter, one annotated with a pydantic model is the JSON body (with
    ``| None``, an empty body is None), the caller's token (``Caller``) is None, one
    annotated ``Request`` is the request, one annotated ``Header`` is that header, any other
    is a query parameter; each is validated by its annotation."""

    method: str
    path: str
    endpoint: Endpoint


class _Route:
    def __init__(self, route: BusyRoute) -> None:
        self.method = route.method
        self.endpoint = route.endpoint
        self.regex, _, _ = compile_path(route.path)
        self.path: dict[str, TypeAdapter[Any]] = {}
        self.query: dict[str, TypeAdapter[Any]] = {}
        #: By the header's name as ASGI gives it (lower case): the parameter, its adapter.
        self.headers: dict[bytes, tuple[str, TypeAdapter[Any]]] = {}
        self.fixed: dict[str, Any] = {}
        self.body: tuple[str, type[BaseModel]] | None = None
        self.optional_body = False
        self.request: str | None = None
        hints = typing.get_type_hints(route.endpoint, include_extras=True)
        for name in inspect.signature(route.endpoint).parameters:
            hint = hints[name]
            metadata = getattr(hint, "__metadata__", ())
            depends = [m.dependency for m in metadata if isinstance(m, params.Depends)]
            header = next((m for m in metadata if isinstance(m, params.Header)), None)
            members = typing.get_args(hint) if _is_union(hint) else (hint,)
            models = [m for m in members if inspect.isclass(m) and issubclass(m, BaseModel)]
            if f"{{{name}}}" in route.path:
                self.path[name] = TypeAdapter(hint)
            elif hint is Request:
                self.request = name
            elif header is not None:
                key = header.alias or name.replace("_", "-")
                self.headers[key.lower().encode("latin-1")] = (name, TypeAdapter(hint))
            elif models:
                (model,) = models
                self.body = (name, model)
                self.optional_body = type(None) in members
            elif depends == [authorize]:
                self.fixed[name] = None  # the caller's token: none without auth
            elif depends:
                raise TypeError(f"{route.path}: parameter {name} is a dependency")
            else:
                self.query[name] = TypeAdapter(hint)
        if self.request is not None and self.body is not None:  # its body is read here
            raise TypeError(f"{route.path}: a route with a body cannot take the Request")

    def arguments(
        self, match: re.Match[str], scope: Scope, receive: Receive, body: bytes | None
    ) -> dict[str, Any]:
        """The endpoint's arguments from the request (its path ``match``ed), as FastAPI
        would validate them; ``_Declined`` for anything else."""
        try:
            arguments = {
                name: adapter.validate_python(match.group(name))
                for name, adapter in self.path.items()
            }
            given = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            if len({name for name, _ in given}) != len(given):
                raise _Declined  # FastAPI's rule for a repeated parameter is its own
            for name, value in given:
                if name not in self.query:
                    raise _Declined
                arguments[name] = self.query[name].validate_python(value)
            if self.headers:
                arguments |= self._header_values(scope)
            if self.body is not None:
                name, model = self.body
                if body == b"" and self.optional_body:  # FastAPI's None for no body
                    return arguments | self.fixed | {name: None}
                if body is None or _content_type(scope) != "application/json":
                    raise _Declined
                # Parsed by pydantic itself, in one pass: what it takes, json.loads and the
                # model take alike; what it refuses (a BOM, UTF-16) is left to FastAPI.
                arguments[name] = model.model_validate_json(body)
        except (ValidationError, ValueError):
            raise _Declined from None
        if self.request is not None:
            arguments[self.request] = Request(scope, receive)
        return arguments | self.fixed

    def _header_values(self, scope: Scope) -> dict[str, Any]:
        """The header parameters given, validated (an absent one takes its default)."""
        values: dict[str, Any] = {}
        for header, value in scope["headers"]:
            if header in self.headers:
                name, adapter = self.headers[header]
                if name in values:
                    raise _Declined  # FastAPI's rule for a repeated header is its own
                values[name] = adapter.validate_python(value.decode("latin-1"))
        return values


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _content_type(scope: Scope) -> str | None:
    """The media type, without its parameters (a charset: JSON's is found from its bytes)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type: str = value.decode("latin-1")
            return media_type.partition(";")[0].strip().lower()
    return None


class BusyRoutes:
    """ASGI middleware: serves ``routes`` when it can take the request (see the module's
    docstring), else hands it to ``app``. ``handlers`` are the app's exception handlers
    (``FastAPI.exception_handlers``)."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[BusyRoute],
        handlers: Mapping[Any, HTTPExceptionHandler],
    ) -> None:
        self.app = app
        self.routes = [_Route(route) for route in routes]
        # Exception's own handler included: these routes are served outside FastAPI's error
        # middleware, which would send its answer to a bug (and raise it again for the
        # server to log: the app's handler logs it).
        self.handlers: dict[Any, HTTPExceptionHandler] = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        for route in self.routes:
            if route.method == scope["method"]:
                match = route.regex.match(scope["path"])
                if match is not None:
                    await self._serve(route, match, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self, route: _Route, match: re.Match[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        message: Message | None = None
        body = None
        if route.body is not None:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body = message.get("body", b"")
        try:
            arguments = route.arguments(match, scope, receive, body)
        except _Declined:
            await self.app(scope, _replaying(message, receive), send)
            return
        try:
            response = await route.endpoint(**arguments)
        except Exception as error:
            handler = self._handler(error)
            if handler is None:
                raise
            answer = handler(Request(scope, receive), error)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    def _handler(self, error: Exception) -> HTTPExceptionHandler | None:
        """The app's handler of ``error``, found as Starlette finds it (by the class's MRO)."""
        for kind in type(error).__mro__:
            if kind in self.handlers:
                return self.handlers[kind]
        return None


def _replaying(message: Message | None, receive: Receive) -> Receive:
    """``receive``, giving ``message`` (already received) first."""
    if message is None:
        return receive
    pending = [message]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
