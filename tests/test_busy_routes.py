"""The busy request routes answer exactly as FastAPI answers them.

Two apps over two stores set up alike: one as ``create_app`` builds it (``BusyRoutes`` serves
submit, long-poll, heartbeat, release and cancel), one with ``BusyRoutes`` taken out (FastAPI
serves everything). Each request goes to both, in process, by ASGI calls. Their answers must
be the same (status, headers, body, ids and times aside), and a recorder tells which of the two
served the request in the first app: FastAPI's router leaves its route in the scope.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairpool.api.app import PREFIX, create_app
from fairpool.api.browsers import SameOrigin
from fairpool.api.busy_routes import BusyRoutes
from fairpool.api.errors import AnswerCancelled, BodySizeLimit
from fairpool.service import Service, open_service
from fairpool.store.db import Database
from tests.conftest import BACKENDS, database_on

T = TypeVar("T")
POOL, COMPONENT = "gpus", "team-a"
#: Fields that differ between two stores by nature.
VOLATILE = {"id", "created", "updated", "allocated_at", "released_at", "lease_expires_at",
            "previous_attempt_id", "retried_as_id", "preempted_by_id"}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    #: Whether FastAPI's router served it (else ``BusyRoutes`` did).
    routed: bool

    def json(self) -> Any:
        return json.loads(self.body)


async def call(app: FastAPI, method: str, path: str, body: bytes | None = None,
               content_type: bytes | None = b"application/json",
               raised: list[Exception] | None = None,
               extra: tuple[tuple[bytes, bytes], ...] = ()) -> Answer:
    """``raised``: where an error the app raises after answering goes (else it is raised);
    ``extra``: more headers."""
    path, _, query = path.partition("?")
    headers = [(b"host", b"test"), *extra]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    if body is not None:
        headers.append((b"content-length", str(len(body)).encode()))
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": query.encode(), "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80), "state": {},
    }
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body or b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    except Exception as error:
        if raised is None:
            raise
        raised.append(error)
    start = sent[0]
    return Answer(start["status"], tuple(start["headers"]),
                  b"".join(m.get("body", b"") for m in sent[1:]), "route" in scope)


class Apps:
    """The two apps, their lifespans running on an event loop of their own (a thread)."""

    def __init__(self, urls: tuple[str, str]) -> None:
        self.services: list[Service] = []
        self.apps: list[FastAPI] = []
        for name, url in zip(("busy", "fastapi"), urls, strict=True):
            service = Service(Database.open(url))
            service.create_pool(POOL, {"gpu": 4})
            service.attach_policy(POOL, COMPONENT)
            app = create_app(service, tick=3600.0)
            assert isinstance(app.front, AnswerCancelled) and isinstance(app.front.app, SameOrigin)
            limit = app.front.app.app
            assert isinstance(limit, BodySizeLimit) and isinstance(limit.app, BusyRoutes)
            if name == "fastapi":  # the body's limit hands every request to FastAPI
                limit.app = app.fastapi
            self.services.append(service)
            self.apps.append(app)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = AsyncExitStack()
        for app in self.apps:
            self.run(self.stack.enter_async_context(app.router.lifespan_context(app)))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def both(self, method: str, path: str, body: bytes | None = None,
             content_type: bytes | None = b"application/json",
             extra: tuple[tuple[bytes, bytes], ...] = ()) -> tuple[Answer, Answer]:
        """The same request to each app."""
        busy, fastapi = (
            self.run(call(app, method, path, body, content_type, extra=extra))
            for app in self.apps
        )
        return busy, fastapi

    def close(self) -> None:
        self.run(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        for service in self.services:
            service.close()


def normalized(answer: Answer, ids: tuple[str, ...] = ()) -> tuple[int, dict[bytes, bytes], Any]:
    """What must be equal: the status, the headers, and the body without what differs
    between two stores (its ids and times; ``ids`` named in messages)."""
    headers = dict(answer.headers)
    headers.pop(b"content-length", None)  # ids and times may differ in length
    text = answer.body.decode()
    if b"location" in headers:  # a create's: the request it made, whose id differs
        assert headers[b"location"] == f"{PREFIX}/requests/{json.loads(text)['id']}".encode()
        headers[b"location"] = b"<its own>"
    for one in ids:
        text = text.replace(one, "<id>")

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return answer.status, headers, strip(json.loads(text)) if text else None


@pytest.fixture(scope="module", params=BACKENDS)
def apps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Apps]:
    """The two apps, each on a store of its own, on each backend."""
    root = tmp_path_factory.mktemp("busy")
    running = Apps((database_on(request, request.param, root / "busy"),
                    database_on(request, request.param, root / "fastapi")))
    try:
        yield running
    finally:
        running.close()


def submitted(apps: Apps, body: dict[str, Any]) -> tuple[str, str]:
    """A request submitted to each app: their ids."""
    busy, fastapi = apps.both("POST", PREFIX + "/requests", json.dumps(body).encode())
    assert busy.status == fastapi.status == 201, (busy, fastapi)
    return busy.json()["id"], fastapi.json()["id"]


def same(busy: Answer, fastapi: Answer, ids: tuple[str, ...] = ()) -> None:
    assert normalized(busy, ids) == normalized(fastapi, ids)
    assert fastapi.routed


GOOD = json.dumps({"component": COMPONENT, "resources": {"gpu": 1}}).encode()

# (body, content type, served by BusyRoutes, expected status)
SUBMITS = [
    (GOOD, b"application/json", True, 201),
    (GOOD, b"Application/JSON; charset=utf-8", True, 201),
    (GOOD, None, False, 415),
    (GOOD, b"text/plain", False, 415),
    (GOOD, b"application/vnd.fairpool+json", False, 201),
    (b"", b"application/json", False, 422),
    (b"{", b"application/json", False, 400),
    (b"null", b"application/json", False, 422),
    (b"[]", b"application/json", False, 422),
    (json.dumps({"component": COMPONENT, "resources": {"gpu": "1"}}).encode(),
     b"application/json", False, 422),
    (json.dumps({"component": COMPONENT, "resources": {"gpu": 1}, "x": 1}).encode(),
     b"application/json", False, 422),
    (json.dumps({"component": COMPONENT, "resources": {"gpu": 10**30}}).encode(),
     b"application/json", False, 422),
    (json.dumps({"component": COMPONENT, "resources": {"gpu": -1}}).encode(),
     b"application/json", False, 422),
    (json.dumps({"component": "nobody", "resources": {"gpu": 1}}).encode(),
     b"application/json", True, None),
    (json.dumps({"component": COMPONENT, "resources": {"cpu": 1}}).encode(),
     b"application/json", True, None),
    (json.dumps({"component": COMPONENT, "resources": {"gpu": 99}}).encode(),
     b"application/json", True, None),
    # JSON that pydantic's parser refuses and json.loads takes: FastAPI answers it.
    (b"\xef\xbb\xbf" + GOOD, b"application/json", False, 201),
    (GOOD.decode().encode("utf-16"), b"application/json", False, 201),
    # A key given twice: the last one counts, on either path.
    (b'{"component": "nobody", "component": "%s", "resources": {"gpu": 1}}' % COMPONENT.encode(),
     b"application/json", True, 201),
    (b'{"component": "%s", "resources": {"gpu": 1}}  ' % COMPONENT.encode(),
     b"application/json", True, 201),
    (GOOD + b" x", b"application/json", False, 400),
]


@pytest.mark.parametrize(("body", "content_type", "busy_serves", "status"), SUBMITS)
def test_a_submit_is_answered_as_fastapi_answers_it(
    apps: Apps, body: bytes, content_type: bytes | None, busy_serves: bool, status: int | None
) -> None:
    busy, fastapi = apps.both("POST", PREFIX + "/requests", body, content_type)
    same(busy, fastapi)
    assert busy.routed is not busy_serves
    if status is not None:
        assert busy.status == status, busy.body
    if busy.status == 201:  # give the units back
        for app, answer in zip(apps.apps, (busy, fastapi), strict=True):
            apps.run(call(app, "POST", f"{PREFIX}/requests/{answer.json()['id']}/release"))


# (Idempotency-Key headers, the body's idempotency_key, served by BusyRoutes, expected status)
KEYED = [
    ((b"k1",), None, True, 201),
    ((b'"k2"',), None, True, 201),  # the draft's quoted form
    ((b"k3",), "k3", True, 201),
    ((b"k4",), "other", True, 422),  # two keys: refused by the endpoint
    (("k\u00e9".encode(),), None, True, 201),  # UTF-8, as curl sends it
    ((b"x" * 65,), None, False, 422),
    ((b"",), None, False, 422),
    ((b'"k"k"',), None, False, 422),
    ((b"k5", b"k6"), None, False, 201),  # given twice: FastAPI's rule (its first)
]


@pytest.mark.parametrize(("keys", "key", "busy_serves", "status"), KEYED)
def test_a_submits_idempotency_key_header_is_taken_as_fastapi_takes_it(
    apps: Apps, keys: tuple[bytes, ...], key: str | None, busy_serves: bool, status: int
) -> None:
    body = {"component": COMPONENT, "resources": {"gpu": 1}}
    if key is not None:
        body["idempotency_key"] = key
    extra = tuple((b"idempotency-key", one) for one in keys)
    busy, fastapi = apps.both("POST", PREFIX + "/requests", json.dumps(body).encode(),
                              extra=extra)
    same(busy, fastapi)
    assert (busy.routed is not busy_serves, busy.status) == (True, status), busy.body
    if status == 201:  # the key made it: asked again, the same request answers
        again = apps.both("POST", PREFIX + "/requests", GOOD, extra=extra[:1])
        for answer, repeated in zip((busy, fastapi), again, strict=True):
            assert repeated.json()["id"] == answer.json()["id"]
        for app, answer in zip(apps.apps, (busy, fastapi), strict=True):
            apps.run(call(app, "POST", f"{PREFIX}/requests/{answer.json()['id']}/release"))


def test_a_head_is_answered_as_the_get_by_either(apps: Apps) -> None:
    """A HEAD goes in as its GET (``semantics.as_get``): a busy route's too, without its
    body."""
    ids = submitted(apps, {"component": COMPONENT, "resources": {"gpu": 1}})
    for tail in ("/wait?timeout=0", "", "/release"):
        for app, one in zip(apps.apps, ids, strict=True):
            get, head = (apps.run(call(app, method, f"{PREFIX}/requests/{one}{tail}",
                                       content_type=None)) for method in ("GET", "HEAD"))
            assert (head.status, head.headers, head.body) == (get.status, get.headers, b"")
            assert head.status == (405 if tail == "/release" else 200)
    for app, one in zip(apps.apps, ids, strict=True):
        apps.run(call(app, "POST", f"{PREFIX}/requests/{one}/release"))


# (method, path after the request's id, served by BusyRoutes, expected status)
ACTIONS = [
    ("POST", "/heartbeat", True, 200),
    ("GET", "/wait?timeout=0", True, 200),
    ("GET", "/wait", True, 200),
    # A parameter given twice, or one the route does not take: FastAPI's refusal.
    ("GET", "/wait?timeout=0.5&timeout=0", False, 422),
    ("GET", "/wait?timeout=0&verbose=1", False, 422),
    ("GET", "/wait?timeout=-1", False, 422),
    ("GET", "/wait?timeout=nan", False, 422),
    ("GET", "/wait?timeout=", False, 422),
    ("POST", "/release", True, 200),
    ("POST", "/release", True, 409),  # released already
    ("POST", "/heartbeat", True, 200),  # answers in any status
    ("POST", "/cancel", True, 409),
    ("GET", "", False, 200),  # not a busy route
]


def test_the_request_routes_answer_as_fastapi_answers_them(apps: Apps) -> None:
    ids = submitted(apps, {"component": COMPONENT, "resources": {"gpu": 1}})
    for method, tail, busy_serves, status in ACTIONS:
        busy, fastapi = (
            apps.run(call(app, method, f"{PREFIX}/requests/{one}{tail}", content_type=None))
            for app, one in zip(apps.apps, ids, strict=True)
        )
        same(busy, fastapi, ids)
        assert (busy.routed is not busy_serves, busy.status) == (True, status), (method, tail)


# (body, content type, served by BusyRoutes, expected status, the request's reason after)
CANCELS = [
    (None, None, True, 200, "cancelled by user"),
    (b"", b"application/json", True, 200, "cancelled by user"),
    (b"{}", b"application/json", True, 200, "cancelled by user"),
    (b'{"reason": null}', b"application/json", True, 200, "cancelled by user"),
    (b'{"reason": "node maintenance"}', b"application/json", True, 200,
     "cancelled: node maintenance"),
    (b'{"reason": "m"}', b"Application/JSON; charset=utf-8", True, 200, "cancelled: m"),
    (b"null", b"application/json", False, 200, "cancelled by user"),
    (b'{"reason": "m"}', None, False, 415, None),
    (b'{"reason": "m"}', b"text/plain", False, 415, None),
    (b'{"reason": " "}', b"application/json", False, 422, None),
    (b'{"reason": 5}', b"application/json", False, 422, None),
    (b'{"reason": "m", "why": "x"}', b"application/json", False, 422, None),
    (json.dumps({"reason": "m" * 1025}).encode(), b"application/json", False, 422, None),
    (rb'{"reason": "a\u0000b"}', b"application/json", False, 422, None),
    (b"{", b"application/json", False, 400, None),
    (b"[]", b"application/json", False, 422, None),
]


@pytest.mark.parametrize(("body", "content_type", "busy_serves", "status", "reason"), CANCELS)
def test_a_cancel_and_its_reason_are_answered_as_fastapi_answers_them(
    apps: Apps, body: bytes | None, content_type: bytes | None, busy_serves: bool, status: int,
    reason: str | None,
) -> None:
    ids = submitted(apps, {"component": COMPONENT, "resources": {"gpu": 1}})
    busy, fastapi = (
        apps.run(call(app, "POST", f"{PREFIX}/requests/{one}/cancel", body, content_type))
        for app, one in zip(apps.apps, ids, strict=True)
    )
    same(busy, fastapi, ids)
    assert (busy.routed is not busy_serves, busy.status) == (True, status), busy.body
    if reason is None:  # refused: nothing changed
        assert busy.json()["field"] in ("reason", "why", None), busy.body
        for app, one in zip(apps.apps, ids, strict=True):
            apps.run(call(app, "POST", f"{PREFIX}/requests/{one}/cancel", content_type=None))
    else:
        assert busy.json()["status_reason"] == reason


@pytest.mark.parametrize(("ref", "status"), [
    ("nope", 404),
    ("%00", 422),
    ("x" * 300, 404),  # longer than any id: not found, in the store's words
    ("%F0%9F%98%80", 404),
])
def test_a_bad_or_unknown_id_is_answered_as_fastapi_answers_it(
    apps: Apps, ref: str, status: int
) -> None:
    from urllib.parse import unquote

    path = unquote(ref)
    for method, tail in (("POST", "/release"), ("POST", "/heartbeat"), ("POST", "/cancel"),
                         ("GET", "/wait?timeout=0")):
        busy, fastapi = apps.both(method, f"{PREFIX}/requests/{path}{tail}", content_type=None)
        same(busy, fastapi)
        assert busy.status == status, (tail, busy.body)


def test_a_long_poll_through_the_busy_route_is_woken_by_a_release(apps: Apps) -> None:
    """The long-poll served by ``BusyRoutes`` waits and wakes as FastAPI's: a request queued
    behind a full pool is answered "allocated" once the holder releases."""
    app = apps.apps[0]
    holders = [apps.run(call(app, "POST", PREFIX + "/requests", json.dumps(
        {"component": COMPONENT, "resources": {"gpu": 4}}).encode()))]
    waiting = apps.run(call(app, "POST", PREFIX + "/requests", GOOD)).json()
    assert waiting["status"] == "queued"

    async def wait_then_release() -> Answer:
        poll = asyncio.ensure_future(
            call(app, "GET", f"{PREFIX}/requests/{waiting['id']}/wait?timeout=20",
                 content_type=None))
        await asyncio.sleep(0.2)
        assert not poll.done()
        holder = holders[0].json()["id"]
        await call(app, "POST", f"{PREFIX}/requests/{holder}/release")
        return await poll

    woken = apps.run(wait_then_release())
    assert not woken.routed and woken.json()["status"] == "allocated"
    apps.run(call(app, "POST", f"{PREFIX}/requests/{waiting['id']}/release"))


def test_a_bug_in_a_busy_route_is_answered_as_fastapi_answers_it(
    apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served ahead of FastAPI's error middleware, a busy route's bug still gets the app's
    answer to a bug: a 500 naming the error's type."""
    ids = submitted(apps, {"component": COMPONENT, "resources": {"gpu": 1}})

    def planted(*_: Any, **__: Any) -> None:
        raise RuntimeError("planted")

    for service in apps.services:
        monkeypatch.setattr(service, "heartbeat", planted)
    raised: list[Exception] = []
    busy, fastapi = (
        apps.run(call(app, "POST", f"{PREFIX}/requests/{one}/heartbeat", content_type=None,
                      raised=raised))
        for app, one in zip(apps.apps, ids, strict=True)
    )
    same(busy, fastapi, ids)
    assert not busy.routed and busy.status == 500
    assert busy.json() == {"detail": "internal error (RuntimeError)", "field": None}
    # FastAPI's error middleware raises it again for the server to log; the app's handler
    # has logged it already, so the busy route does not.
    assert [str(error) for error in raised] == ["planted"]
    monkeypatch.undo()
    for app, one in zip(apps.apps, ids, strict=True):
        apps.run(call(app, "POST", f"{PREFIX}/requests/{one}/release"))


def test_with_fastapis_telemetry_on_fastapi_serves_the_busy_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an OpenTelemetry provider configured, FastAPI traces every request it serves:
    the busy routes are then left to it, so that they are traced like the rest."""
    from opentelemetry import trace

    class Configured(trace.TracerProvider):  # not one of the API's placeholders
        def get_tracer(self, *_: Any, **__: Any) -> trace.Tracer:
            return trace.NoOpTracer()

    monkeypatch.setattr(trace, "get_tracer_provider", Configured)
    service = open_service(str(tmp_path))
    service.create_pool(POOL, {"gpu": 4})
    service.attach_policy(POOL, COMPONENT)
    try:
        app = create_app(service, tick=3600.0)
        assert isinstance(app.front, AnswerCancelled) and isinstance(app.front.app, SameOrigin)
        limit = app.front.app.app
        assert isinstance(limit, BodySizeLimit) and limit.app == app.fastapi

        async def submit() -> Answer:
            async with app.router.lifespan_context(app):
                return await call(app, "POST", PREFIX + "/requests", GOOD)

        answer = asyncio.run(submit())
        assert answer.routed and answer.status == 201, answer.body
    finally:
        service.close()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8,
)
FIELDS = {
    "component": st.sampled_from([COMPONENT, "nobody", "", " ", "a\x00b"]) | JSON,
    "component_type": st.sampled_from(["orchestrator", "step", "other"]) | JSON,
    "resources": st.dictionaries(st.sampled_from(["gpu", "cpu", ""]),
                                 st.integers(-2, 6) | JSON, max_size=2) | JSON,
    "preemptible": st.booleans() | JSON,
    "max_retries": st.integers(-1, 12) | JSON,
    "labels": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2) | JSON,
    "lease_ttl": st.none() | st.integers(-1, 10**6) | JSON,
    "idempotency_key": st.none() | st.text(max_size=70),
    "unknown": JSON,
}
BODIES = st.fixed_dictionaries(
    {"component": FIELDS["component"], "resources": FIELDS["resources"]},
    optional={k: v for k, v in FIELDS.items() if k not in ("component", "resources")},
) | JSON


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_any_submit_body_is_answered_as_fastapi_answers_it(apps: Apps, body: Any) -> None:
    busy, fastapi = apps.both("POST", PREFIX + "/requests", json.dumps(body).encode())
    same(busy, fastapi)
    if busy.status == 201:
        for app, answer in zip(apps.apps, (busy, fastapi), strict=True):
            apps.run(call(app, "POST", f"{PREFIX}/requests/{answer.json()['id']}/cancel"))


@pytest.mark.parametrize("content", [
    {"id": "3f2a", "status": "allocated", "resources": {"gpu": 2}, "labels": {},
     "preemptible": True, "lease_ttl": None, "queue": [{"pool": "p", "position": 1}]},
    {"detail": "é, ü, 😀, \u2028 and \"quotes\" \\ \n", "field": "labels.k"},
    {"items": [], "pagination": {"index": 1, "total": 0}, "big": 2**63 - 1, "small": -2**63},
    {"waits": [0.0, 0.25, 1.5, 123.456789], "none": None, "false": False},
    [],
])
def test_the_apps_json_answers_are_the_bytes_starlette_would_send(content: Any) -> None:
    from starlette.responses import JSONResponse

    from fairpool.api.app import _json

    assert _json(content).body == JSONResponse(content).body
