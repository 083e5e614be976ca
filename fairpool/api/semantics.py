"""HTTP semantics every route of the API shares, each in one place:

* ``HEAD`` is answered as ``GET`` (RFC 9110 9.3.2), by every route, without its body
  (``as_get``, in ``FairpoolApp``);
* every answer under ``/api/v1`` carries ``Cache-Control: no-store`` (RFC 9111 5.2.2.5):
  scheduling state changes every moment, and no cache may answer with an old one
  (``NO_STORE``, appended by ``errors.AnswerCancelled``, which sees every answer begin);
* a create answering 201 names what it made in ``Location`` (RFC 9110 10.2.2), the path
  of the GET route that answers it (``located``), behind a proxy's prefix (``rooted``);
* a create's ``Idempotency-Key`` header stands for its body's ``idempotency_key``
  (``models.IdempotencyHeader``, ``models.one_key``).
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import quote

from starlette.responses import Response
from starlette.types import Message, Scope, Send

NO_STORE = (b"cache-control", b"no-store")

R = TypeVar("R", bound=Response)

#: A create's 201 in the OpenAPI schema: its ``Location`` (merged into the route's own 201).
CREATED: dict[int | str, dict[str, Any]] = {
    201: {"headers": {"Location": {
        "description": "The path of what was made: its GET route's.",
        "schema": {"type": "string"},
    }}},
}


def as_get(scope: Scope, send: Send) -> tuple[Scope, Send]:
    """A ``HEAD`` request as the ``GET`` it asks about, and a ``send`` that drops the body:
    every route answers it as its GET (the same status and headers), its auth included, with
    no route of its own (none in the schema). The server sees ``HEAD`` still, in its own
    scope, and sends no body either."""

    async def headers_only(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            message = {**message, "body": b""}
        await send(message)

    return {**scope, "method": "GET"}, headers_only


def rooted(root_path: str, send: Send) -> Send:
    """``send``, with a ``Location`` (a path from ``/api/v1``) under ``root_path``, the prefix
    a proxy serves the server under (``--root-path``), which a client must follow it by."""
    root = quote(root_path).encode("ascii")

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [
                (name, root + value if name == b"location" and value[:1] == b"/" else value)
                for name, value in message.get("headers", ())
            ]}
        await send(message)

    return sending


def segment(name: str) -> str:
    """``name`` as one segment of a URL's path: a name may hold any character but ``/``."""
    return quote(name, safe="")


def located(response: R, path: str) -> R:
    """``response`` (a create's 201) with ``Location``: ``path``, ASCII (ids, ``segment``s)."""
    response.raw_headers.append((b"location", path.encode("ascii")))
    return response
