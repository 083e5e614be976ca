"""API tokens: a real ``python -m fairpool.api --auth`` server, tokens made by the real CLI,
the CLI's remote mode with FAIRPOOL_TOKEN; plus the token store on both backends, the
auth switch, and the route rules.

One server serves the module; each test uses pools and components of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import create_engine, inspect, make_url, text
from starlette.routing import BaseRoute

from fairpool import AsyncClient, Client, NotGranted, WaitTimeout
from fairpool.api.app import PREFIX, create_app
from fairpool.api.auth import (
    RULES,
    Auth,
    AuthSetupError,
    auth_enabled,
    is_loopback,
    unnamed_others,
    without_others,
)
from fairpool.api.server import _announce_auth
from fairpool.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from fairpool.scheduling import SchedulingService
from fairpool.service import Service, hash_token, open_service
from fairpool.store import repo
from fairpool.store.db import Database
from tests.conftest import BACKENDS
from tests.servers import ApiServer, server_on
from tests.test_api import (
    answered_as_get,
    long_poll_stops_when_its_client_goes,
    ok,
    poll_until,
)

CLI = [sys.executable, "-m", "fairpool.cli.main"]


def fairpool(store: Mapping[str, str], *args: str, **env: str
             ) -> subprocess.CompletedProcess[str]:
    """The CLI on ``store`` (``Store.env``), with ``env`` on top."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
    clean.update(store, COLUMNS="250", NO_COLOR="1", **env)
    return subprocess.run([*CLI, *args], env=clean, capture_output=True, text=True,
                          timeout=60, check=False)


def make_token(store: Mapping[str, str], *args: str) -> dict[str, Any]:
    result = fairpool(store, "token", "create", *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@dataclass
class World:
    server: ApiServer
    #: Where the CLI's ``token`` commands find the server's store: FAIRPOOL_HOME, or
    #: FAIRPOOL_DATABASE_URL.
    store: dict[str, str]
    #: Secrets by role name: admin, a (submitter for c-a), b (submitter for c-b and c-b2).
    tokens: dict[str, str]
    ids: dict[str, str]

    def client(self, who: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.server.url + PREFIX, headers=headers, timeout=30.0)

    def service(self) -> Service:
        """The server's store, opened in this process."""
        home = self.store.get("FAIRPOOL_HOME")
        return open_service(home) if home else Service(Database.open(self.url))

    @property
    def url(self) -> str:
        """The store's database URL."""
        home = self.store.get("FAIRPOOL_HOME")
        return f"sqlite:///{Path(home) / 'fairpool.db'}" if home else self.store["FAIRPOOL_DATABASE_URL"]


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    """An ``--auth`` server on each backend, and its tokens."""
    server = server_on(request, request.param, tmp_path_factory.mktemp("auth"),
                       extra=("--auth",))
    option, where = server.store
    store = {"FAIRPOOL_HOME": where} if option == "--home" else {"FAIRPOOL_DATABASE_URL": where}
    # The tokens exist before the server starts: the admin's and b's made by the CLI (which
    # also creates an embedded store), a's in this process (a CLI call costs a Python start).
    made = make_token(store, "--role", "admin", "--name", "ops")
    made_b = make_token(store, "--role", "submitter", "--component", "c-b", "--component", "c-b2")
    assert (made_b["role"], made_b["components"]) == ("submitter", ["c-b", "c-b2"])
    world = World(server, store, {"admin": made["token"], "b": made_b["token"]},
                  {"admin": made["id"], "b": made_b["id"]})
    service = world.service()
    try:
        a, world.tokens["a"] = service.create_token("submitter", ["c-a"], "team-a")
        world.ids["a"] = a.id
    finally:
        service.close()
    server.start()
    try:
        yield world
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pools(world: World) -> str:
    """A pool with policies for c-a, c-b and c-b2, made by the admin."""
    with world.client("admin") as admin:
        ok(admin.post("/pools", json={"name": "shared", "capacity": {"gpu": 8}}), 201)
        for component in ("c-a", "c-b", "c-b2"):
            ok(admin.post("/pools/shared/policies", json={"component": component}), 201)
    return "shared"


def assert_401(response: httpx.Response, needle: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    body = response.json()
    assert body["field"] is None and needle in body["detail"], body


def assert_403(response: httpx.Response, *needles: str, field: str | None = None) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["field"] == field
    for needle in needles:
        assert needle in body["detail"], body


# -- authentication --------------------------------------------------------------------


def test_missing_malformed_and_unknown_tokens_are_401(world: World) -> None:
    with world.client(None) as anonymous:
        for method, path in [("GET", "/pools"), ("POST", "/pools"), ("GET", "/requests"),
                             ("GET", "/requests/x"), ("GET", "/requests/x/wait"),
                             ("POST", "/reconcile")]:
            assert_401(anonymous.request(method, path), "missing API token")
        assert_401(anonymous.get("/pools", headers={"Authorization": "Basic b3BzOm9wcw=="}),
                   "must be 'Bearer <token>'")
        assert_401(anonymous.get("/pools", headers={"Authorization": "Bearer"}),
                   "must be 'Bearer <token>'")
        # A body that is not JSON: FastAPI parses it before the route's auth runs (it was 400
        # to anyone, an admin route's to a submitter too).
        # So with one JSON cannot even read (FastAPI's own 400 came first).
        for body, problem in [(b"{", "Expecting property name enclosed in double quotes at "
                               "position 1"),
                              (b'{"name": "\xff"}', "not UTF-8 (byte 0xff) at position 10"),
                              (b"[" * 60_000, "nested too deeply"),
                              # JSON, but Python reads no such integer ("unreadable" before).
                              (b'{"capacity": {"gpu": ' + b"9" * 4301 + b"}}",
                               "a number of more than 4300 digits")]:
            garbage = {"content": body, "headers": {"content-type": "application/json"}}
            assert_401(anonymous.post("/pools", **garbage), "missing API token")
            with world.client("a") as submitter:
                assert_403(submitter.post("/pools", **garbage), "needs an admin token")
                assert submitter.post("/requests/nope/cancel", **garbage).status_code == 404
            with world.client("admin") as admin:
                refused = admin.post("/pools", **garbage)
                assert (refused.status_code, refused.json()) == (
                    400, {"detail": f"malformed JSON body: {problem}", "field": None})
        # Two headers: a proxy that reads the last would disagree on who is calling (the
        # first was used, helper-87).
        two = [("Authorization", f"Bearer {world.tokens['a']}"),
               ("Authorization", f"Bearer {world.tokens['admin']}")]
        assert_401(anonymous.get("/pools", headers=two), "more than one Authorization header")
        forged = world.tokens["admin"][:-4] + "AAAA"
        assert_401(anonymous.get("/pools", headers={"Authorization": f"Bearer {forged}"}),
                   "invalid API token")
        # Health, readiness, metrics and the schema stay open.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert anonymous.get(path).status_code == 200
            assert httpx.get(world.server.url + path).status_code == 200
        schema = ok(httpx.get(world.server.url + "/openapi.json"))
        assert "HTTPBearer" in schema["components"]["securitySchemes"]
        # Every route under /api/v1 says it may answer 401 and 403 (none did), in the
        # usual error shape; the open routes do not.
        for path, methods in schema["paths"].items():
            for operation in methods.values():
                denials = {"401", "403"} & set(operation["responses"])
                assert denials == ({"401", "403"} if path.startswith("/api/v1/") else set()), path
        denial = schema["paths"]["/api/v1/workloads"]["post"]["responses"]["403"]
        assert denial["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"
        }


def test_a_head_is_refused_as_its_get_is(world: World, pools: str) -> None:
    """Every GET route answers HEAD as its GET (405 before 2026-12-02), behind the same
    checks: 401 without a token, 403 where the token's role forbids the GET, 404 for
    another's request; each without a body."""
    with world.client(None) as anonymous, world.client("a") as a, \
            world.client("admin") as admin:
        theirs = ok(admin.post("/requests", json={"component": "c-b", "resources": {"gpu": 1}}),
                    201)
        mine = ok(a.post("/requests", json={"component": "c-a", "resources": {"gpu": 1}}), 201)
        try:
            for caller, path, status in [
                (anonymous, "/pools", 401),
                (anonymous, f"/requests/{mine['id']}/wait", 401),
                (a, "/auth/admin", 403),
                (a, f"/requests/{theirs['id']}", 404),
                (a, f"/requests/{theirs['id']}/wait", 404),
                (a, f"/requests/{mine['id'][:8]}", 200),
                (a, f"/pools/{pools}", 200),
                (admin, "/auth/admin", 204),
            ]:
                get = caller.get(path)
                assert get.status_code == status, (path, get.text)
                answered_as_get(get, caller.head(path))
        finally:
            for made in (mine, theirs):
                ok(admin.post(f"/requests/{made['id']}/release"))

def test_revoked_token_is_401_from_its_next_call(world: World, pools: str) -> None:
    service = world.service()
    try:
        token, secret = service.create_token("submitter", ["c-a"])
    finally:
        service.close()
    extra = {"id": token.id, "token": secret}
    headers = {"Authorization": f"Bearer {secret}"}
    with world.client(None) as client:
        assert ok(client.get("/pools", headers=headers))["pagination"]["total"] >= 1
        revoked = fairpool(world.store, "token", "revoke", extra["id"][:8])
        assert revoked.returncode == 0 and "Revoked submitter token" in revoked.stderr
        assert_401(client.get("/pools", headers=headers), f"API token {secret[:11]}… was revoked")
    listed = fairpool(world.store, "token", "list", "-o", "json")
    rows = {t["id"]: t for t in json.loads(listed.stdout)["items"]}
    assert rows[extra["id"]]["status"] == "revoked" and rows[extra["id"]]["revoked"]
    assert extra["token"] not in listed.stdout and world.tokens["admin"] not in listed.stdout


def test_a_token_is_revoked_by_its_secret_or_the_prefix_token_list_shows(world: World) -> None:
    """What a user holds when a token leaked; both were "no token 'fp_...'", the whole secret
    said back (helper-87)."""
    service = world.service()
    try:
        tokens = [service.create_token("submitter", ["c-a"]) for _ in range(3)]
    finally:
        service.close()
    (first, secret), (second, _), (third, _) = tokens
    by_secret = fairpool(world.store, "token", "revoke", secret, "-o", "json")
    assert by_secret.returncode == 0, by_secret.stderr
    assert json.loads(by_secret.stdout)["id"] == first.id
    by_prefix = fairpool(world.store, "token", "revoke", second.prefix)
    assert by_prefix.returncode == 0 and "Revoked submitter token" in by_prefix.stderr
    assert fairpool(world.store, "token", "revoke", third.prefix[:6]).returncode == 0
    listed = json.loads(fairpool(world.store, "token", "list", "-o", "json").stdout)["items"]
    assert {t["id"] for t in listed if t["status"] == "revoked"} >= {
        first.id, second.id, third.id}
    # An unknown secret is not said back; a prefix, exactly (SQLite's LIKE ignores case).
    unknown = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    other_case = "fp_" + second.prefix[3:].swapcase()
    for ref, line in [(unknown, "Error: no token has that secret (not shown)"),
                      (other_case, f"Error: no token whose secret starts with {other_case!r}")]:
        refused = fairpool(world.store, "token", "revoke", ref)
        assert (refused.returncode, refused.stderr.strip()) == (1, line)
        assert unknown not in refused.stderr


def test_token_commands_with_a_server_url_name_the_database_they_write(world: World) -> None:
    """They said "(--home)" of a home given as FAIRPOOL_HOME, and not that a server serving
    another database answers the token 401 (helper-93)."""
    made = fairpool(world.store, "token", "create", "--role", "admin", "--name", "noted",
                    FAIRPOOL_URL=world.server.url)
    assert made.returncode == 0, made.stderr
    note = made.stderr.splitlines()[0]
    where = world.store.get("FAIRPOOL_HOME") or make_url(world.url).database
    assert note.startswith("Note: tokens are kept in the database ") and str(where) in note
    assert note.endswith(f"not sent to the server at {world.server.url}: that server accepts "
                         "them only if it serves this database."), note


def test_the_sdk_raises_typed_errors_for_401_and_403(world: World, pools: str) -> None:
    """They were a bare FairpoolError("HTTP 401: ..."), told apart only by the message."""
    url = world.server.url
    with Client(url, token=world.tokens["a"]) as client:
        with pytest.raises(Forbidden, match="HTTP 403: ") as forbidden:
            client.submit({"gpu": 1}, component="c-b")
        # Not an OSError (PermissionError is one), which a heartbeat rides out as an outage.
        assert not isinstance(forbidden.value, OSError)
    # A blank one is none, as an empty one is ("must be printable ASCII without spaces").
    for token in (None, "", "   "):
        with Client(url, token=token) as client, \
                pytest.raises(Unauthorized, match="HTTP 401: missing API token"):
            client.list_pools()


def test_a_long_poll_whose_client_has_gone_stops_through_fastapi(world: World) -> None:
    """With tokens the routes are FastAPI's, not ``BusyRoutes``: the same stop."""
    with world.client("admin") as admin:
        ok(admin.post("/pools", json={"name": "gone-gpus", "capacity": {"gpu": 1}}), 201)
        ok(admin.post("/pools/gone-gpus/policies", json={"component": "c-gone"}), 201)
    service = world.service()
    try:
        _, secret = service.create_token("submitter", ["c-gone"], "gone")
    finally:
        service.close()
    with httpx.Client(base_url=world.server.url + PREFIX, timeout=30.0,
                      headers={"Authorization": f"Bearer {secret}"}) as client:
        held, waiter = (ok(client.post("/requests", json={
            "component": "c-gone", "resources": {"gpu": 1}}), 201) for _ in range(2))
        long_poll_stops_when_its_client_goes(client, world.server, held["id"], waiter["id"])
    with world.client("admin") as admin:
        ok(admin.delete("/pools/gone-gpus"), 204)  # others list the module's pools


def test_a_wait_whose_token_is_revoked_names_what_it_leaves_queued(
    world: World, pools: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``fairpool run`` ended with the server's 401 alone, and a request left queued, to be
    granted to nobody until its lease ran out; ``acquire`` raised the cancel's 401 in place
    of its own WaitTimeout."""
    with world.client("admin") as admin:
        ok(admin.post("/pools", json={"name": "revoked-gpus", "capacity": {"gpu": 1}}), 201)
        ok(admin.post("/pools/revoked-gpus/policies", json={"component": "c-r"}), 201)
        holder = ok(admin.post("/requests", json={"component": "c-r",
                                                  "resources": {"gpu": 1}}), 201)
    service = world.service()
    try:
        (runner, secret), (waiter, secret_w), (waiter_a, secret_a) = (
            service.create_token("submitter", ["c-r"], name)
            for name in ("runner", "waiter", "async-waiter"))
    finally:
        service.close()

    def queued() -> list[str]:
        with world.client("admin") as admin:
            items = ok(admin.get("/requests", params={"component": "c-r", "status": "queued"}))
        return [r["id"] for r in items["items"]]

    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
    env.update(FAIRPOOL_URL=world.server.url, FAIRPOOL_TOKEN=secret, COLUMNS="250")
    run = subprocess.Popen([*CLI, "run", "--component", "c-r", "--gpu-count", "1", "--",
                            "echo", "ran"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        poll_until(lambda: bool(queued()), 30)
        (left,) = queued()
        assert fairpool(world.store, "token", "revoke", runner.id).returncode == 0
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    lines = err.strip().splitlines()
    assert run.returncode == 1 and out == ""
    assert f"Resource request `{left}` is still waiting (HTTP 401: " in lines[-2]
    assert lines[-2].endswith(f"cancel it with `fairpool resource-request cancel {left}`")
    assert lines[-1].startswith("Error: HTTP 401: API token ") and "was revoked" in lines[-1]

    def revoke_once_queued(token_id: str, known: set[str]) -> threading.Thread:
        """Revokes ``token_id`` once its holder's request is queued, in this process: a
        timer and a CLI's start (seconds on a loaded machine) could land after the wait's
        timeout, whose cancel then went through, leaving nothing to warn about."""
        def run() -> None:
            poll_until(lambda: bool(set(queued()) - known), 30, every=0.02)
            service = world.service()
            try:
                service.revoke_token(token_id)
            finally:
                service.close()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with Client(world.server.url, token=secret_w) as client:
        revoke = revoke_once_queued(waiter.id, {left})
        # The wait's own 401, or its timeout if that came first: the cancel's stays a warning.
        with caplog.at_level(logging.WARNING, logger="fairpool"), pytest.raises(
            (Unauthorized, WaitTimeout)
        ):
            with client.acquire({"gpu": 1}, component="c-r", timeout=4.0):
                pytest.fail("granted")
        revoke.join()
    (also,) = set(queued()) - {left}
    assert any(f"`{also}` is still waiting (HTTP 401: " in r.getMessage() for r in caplog.records)

    async def acquire() -> None:
        client = AsyncClient(world.server.url, token=secret_a)
        try:
            async with client.acquire({"gpu": 1}, component="c-r", timeout=4.0):
                pytest.fail("granted")
        finally:
            await client.close()

    revoke = revoke_once_queued(waiter_a.id, {left, also})
    with caplog.at_level(logging.WARNING, logger="fairpool"), pytest.raises(
        (Unauthorized, WaitTimeout)
    ):
        asyncio.run(acquire())
    revoke.join()
    (last,) = set(queued()) - {left, also}
    assert any(f"`{last}` is still waiting (HTTP 401: " in r.getMessage() for r in caplog.records)
    with world.client("admin") as admin:  # what the lines say to do
        ok(admin.post(f"/requests/{holder['id']}/release"))
        for request_id in (left, also, last):
            ok(admin.post(f"/requests/{request_id}/cancel"))
        ok(admin.delete("/pools/revoked-gpus"), 204)  # others list the module's pools


def test_a_holder_whose_token_is_revoked_stops_within_a_heartbeat(
    world: World, pools: str
) -> None:
    """Its heartbeats' 401s were skipped as misses: the lease ran out, the units went to
    others, and the block ran on, told only as it ended (by the release's 401)."""
    service = world.service()
    try:
        token, secret = service.create_token("submitter", ["c-a"], "holder")
    finally:
        service.close()
    with Client(world.server.url, token=secret) as client:
        revoke = threading.Timer(0.5, lambda: fairpool(world.store, "token", "revoke", token.id))
        started = time.monotonic()
        revoke.start()
        with pytest.raises(NotGranted) as lost:
            with client.acquire({"gpu": 1}, component="c-a", lease_ttl=3):
                time.sleep(20)
        revoke.join()
    assert time.monotonic() - started < 8  # the revoke's CLI start, then one interval (1 s)
    assert type(lost.value) is NotGranted
    assert "was lost: heartbeat refused: HTTP 401: API token `holder`" in str(lost.value)
    with world.client("admin") as admin:  # its lease would give the unit back in 3 s
        ok(admin.post(f"/requests/{lost.value.request.id}/release"))


def test_tokens_are_not_stored_in_clear(world: World) -> None:
    engine = create_engine(world.url)
    try:
        with engine.connect() as conn:
            tables = inspect(conn).get_table_names()
            dump = "\n".join(
                repr(tuple(row))
                for table in tables
                for row in conn.execute(text(f'SELECT * FROM "{table}"'))
            )
            rows = dict(conn.execute(text("SELECT id, secret_hash FROM api_token")).all())
            prefixes = dict(conn.execute(text("SELECT id, prefix FROM api_token")).all())
    finally:
        engine.dispose()
    assert "api_token" in tables and len(rows) >= 3
    for who, secret in world.tokens.items():
        assert secret not in dump
        assert secret[3:] not in dump  # nor without its fp_ prefix
        token_id = world.ids[who]
        assert rows[token_id] == hashlib.sha256(secret.encode()).hexdigest()
        assert secret.startswith(prefixes[token_id]) and len(prefixes[token_id]) == 11


# -- roles -------------------------------------------------------------------------------


def test_admin_manages_pools_and_policies(world: World) -> None:
    with world.client("admin") as admin:
        ok(admin.post("/pools", json={"name": "admin-pool", "capacity": {"gpu": 2}}), 201)
        ok(admin.post("/pools/admin-pool/policies", json={"component": "adm-orch"}), 201)
        ok(admin.patch("/pools/admin-pool", json={"capacity": {"gpu": 4}}))
        held = ok(admin.post("/requests", json={"component": "adm-orch",
                                                "resources": {"gpu": 1}}), 201)
        assert held["status"] == "allocated"
        ok(admin.post(f"/requests/{held['id']}/release"))
        ok(admin.post("/reconcile"))
        ok(admin.delete("/pools/admin-pool/policies/adm-orch"), 204)
        ok(admin.delete("/pools/admin-pool"), 204)


def test_submitter_creates_for_its_components_only_and_cannot_write_pools(
    world: World, pools: str
) -> None:
    with world.client("a") as a:
        mine = ok(a.post("/requests", json={"component": "c-a", "resources": {"gpu": 1}}), 201)
        assert mine["status"] == "allocated"
        assert_403(a.post("/requests", json={"component": "c-b", "resources": {"gpu": 1}}),
                   "component `c-b`", "allows `c-a`", "team-a", field="component")
        # Reads of pools, policies and components are allowed.
        assert [p["name"] for p in ok(a.get("/pools"))["items"]] == ["shared"]
        assert ok(a.get(f"/pools/{pools}"))["name"] == pools
        assert ok(a.get("/policies", params={"pool": pools}))["pagination"]["total"] == 3
        assert {c["name"] for c in ok(a.get("/components"))["items"]} >= {"c-a", "c-b", "c-b2"}
        for method, path, body in [
            ("POST", "/pools", {"name": "mine", "capacity": {"gpu": 1}}),
            ("PATCH", f"/pools/{pools}", {"capacity": {"gpu": 99}}),
            ("DELETE", f"/pools/{pools}", None),
            ("POST", f"/pools/{pools}/policies", {"component": "c-a", "priority": 9}),
            ("DELETE", f"/pools/{pools}/policies/c-a", None),
            ("POST", "/reconcile", None),
            ("POST", "/prune", {"older_than": 0}),  # everyone's history
        ]:
            assert_403(a.request(method, path, json=body), "needs an admin token",
                       "is a submitter")
        ok(a.post(f"/requests/{mine['id']}/release"))
    with world.client("admin") as admin:
        assert ok(admin.get(f"/pools/{pools}"))["capacity"] == {"gpu": 8}


def test_submitters_see_and_touch_only_their_own_requests(world: World, pools: str) -> None:
    with world.client("a") as a, world.client("b") as b, world.client("admin") as admin:
        mine = ok(a.post("/requests", json={"component": "c-a", "resources": {"gpu": 1},
                                            "lease_ttl": 600}), 201)
        theirs = ok(b.post("/requests", json={"component": "c-b2", "resources": {"gpu": 1}}),
                    201)
        rid = mine["id"]
        for method, path in [("GET", f"/requests/{rid}"), ("GET", f"/requests/{rid}/wait"),
                             ("POST", f"/requests/{rid}/heartbeat"),
                             ("POST", f"/requests/{rid}/release"),
                             ("POST", f"/requests/{rid}/cancel"),
                             ("DELETE", f"/requests/{rid}"),
                             ("GET", f"/requests/{rid[:8]}")]:
            response = b.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["detail"] == f"no request {path.split('/')[2]!r}"
        assert ok(a.get(f"/requests/{rid}"))["status"] == "allocated"  # untouched
        assert ok(a.post(f"/requests/{rid[:8]}/heartbeat"))["id"] == rid

        listed = {r["id"] for r in ok(b.get("/requests", params={"limit": 10000}))["items"]}
        assert theirs["id"] in listed and rid not in listed
        page = ok(a.get("/requests", params={"component": "c-b2"}))
        assert page["items"] == [] and page["pagination"]["total"] == 0
        everything = {r["id"] for r in ok(admin.get("/requests", params={"limit": 10000}))["items"]}
        assert {rid, theirs["id"]} <= everything

        # Pool details and pool request lists: totals whole, requests only one's own.
        seen_by_b = ok(b.get(f"/pools/{pools}"))
        assert [r["id"] for r in seen_by_b["active_requests"]] == [theirs["id"]]
        assert seen_by_b["occupied"]["gpu"] == 2
        assert [r["id"] for r in ok(b.get(f"/pools/{pools}/requests"))["items"]] == [theirs["id"]]
        assert {r["id"] for r in ok(admin.get(f"/pools/{pools}"))["active_requests"]} == {
            rid, theirs["id"]}

        # The admin may act on anyone's request.
        assert ok(admin.post(f"/requests/{rid}/release"))["status"] == "released"


def test_submitters_see_and_end_only_their_own_workloads_and_operations(world: World) -> None:
    """As requests: anyone's were listed, and any submitter token could end them (a token
    meant for team a's component cancelled team b's workloads and aborted its operations).
    Another's is answered 404, as one that does not exist; an admin sees and ends all."""
    with world.client("a") as a, world.client("b") as b, world.client("admin") as admin:
        ok(admin.post("/nodes", json={"name": "own-n1", "tags": ["own"],
                                      "resources": {"cpu": 8}}), 201)
        ok(admin.post("/pool-trees", json={"name": "own-t",
                                           "config": {"node_tag_filter": "own"}}), 201)
        ok(admin.post("/pool-trees/own-t/pools", json={"name": "own-p"}), 201)
        start = {"user": "u", "job_resources": {"cpu": 1}, "job_count": 1,
                 "pool_trees": ["own-t"], "pool": "own-p"}
        kinds = {
            "workload": ("/workloads", {"labels": {"team": "x"}}, ["release", "cancel"]),
            "operation": ("/operations", start, ["complete", "abort"]),
        }
        for what, (base, body, endings) in kinds.items():
            mine = ok(a.post(base, json=body), 201)["id"]
            theirs = ok(b.post(base, json=body), 201)["id"]
            for method, path in [("GET", f"{base}/{mine}"), ("GET", f"{base}/{mine[:8]}"),
                                 *(("POST", f"{base}/{mine}/{end}") for end in endings)]:
                response = b.request(method, path)
                assert response.status_code == 404, (method, path, response.text)
                assert response.json()["detail"] == f"no {what} {path.split('/')[2]!r}"
            assert ok(a.get(f"{base}/{mine[:8]}"))["id"] == mine  # a prefix among its own
            if what == "operation":  # the tree's shares: another's is "another operation"
                names = [e["name"] for e in ok(a.get("/pool-trees/own-t"))["elements"]
                         if e["kind"] == "operation"]
                assert sorted(names) == sorted([mine, "another operation"])
            listed = [item["id"] for item in ok(b.get(base))["items"]]
            assert theirs in listed and mine not in listed
            # Paged and counted among its own only: not a page of everyone's, then filtered.
            first = ok(b.get(base, params={"limit": 1}))
            assert first["pagination"]["total"] == len(listed) == first["pagination"][
                "total_pages"]
            assert [item["id"] for item in first["items"]] == listed[:1]
            everything = {item["id"] for item in ok(admin.get(base))["items"]}
            assert {mine, theirs} <= everything
            assert ok(a.post(f"{base}/{mine}/{endings[1]}"))["id"] == mine
            assert ok(admin.post(f"{base}/{theirs}/{endings[1]}"))["id"] == theirs


def test_a_submitter_is_not_told_of_others_requests_that_touch_its_own(world: World) -> None:
    """Nor that an id exists: not the request that preempted its own, nor the one another
    token made under an idempotency key it repeats."""
    service = world.service()
    try:
        _, low = service.create_token("submitter", ["c-low"])
        _, high = service.create_token("submitter", ["c-high"])
    finally:
        service.close()
    url = world.server.url + PREFIX
    with world.client("admin") as admin, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {low}"}) as x, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {high}"}) as y:
        ok(admin.post("/pools", json={"name": "one-gpu", "capacity": {"gpu": 1}}), 201)
        for component, priority in (("c-low", 1), ("c-high", 10)):
            ok(admin.post("/pools/one-gpu/policies",
                          json={"component": component, "priority": priority}), 201)
        held = ok(x.post("/requests", json={"component": "c-low", "resources": {"gpu": 1},
                                            "idempotency_key": "shared-key"}), 201)
        winner = ok(y.post("/requests", json={"component": "c-high", "resources": {"gpu": 1}}),
                    201)
        assert winner["status"] == "allocated"
        rid, wid = held["id"], winner["id"]
        # Nor whom its own request preempted (the winner's reason named it, helper-87).
        preempting = "allocated on pool one-gpu (policy priority 10), preempting another request"
        pool_view = ok(y.get("/pools/one-gpu"))
        for answer in (winner, ok(y.get(f"/requests/{wid}")), ok(y.get(f"/requests/{wid}/wait")),
                       ok(y.post(f"/requests/{wid}/heartbeat")),
                       *[r for r in ok(y.get("/requests"))["items"] if r["id"] == wid],
                       *[r for r in pool_view["active_requests"] if r["id"] == wid]):
            assert answer["status_reason"] == preempting
        assert ok(y.get(f"/requests/{wid}/events"))["items"][-1]["message"] == preempting
        assert rid not in json.dumps([pool_view, ok(y.get(f"/requests/{wid}/events"))])
        assert ok(admin.get(f"/requests/{wid}"))["status_reason"].endswith(f"request {rid}")
        assert ok(admin.get(f"/requests/{wid}/events"))["items"][-1]["message"].endswith(rid)
        repeated = ok(x.post("/requests", json={"component": "c-low", "resources": {"gpu": 1},
                                                "idempotency_key": "shared-key"}), 201)
        assert repeated["id"] == rid
        for answer in (ok(x.get(f"/requests/{rid}")), ok(x.get(f"/requests/{rid}/wait")),
                       ok(x.post(f"/requests/{rid}/heartbeat")), repeated,
                       *[r for r in ok(x.get("/requests"))["items"] if r["id"] == rid]):
            assert answer["status"] == "preempted" and answer["preempted_by_id"] is None
            assert answer["status_reason"] == ("preempted by another request on pool one-gpu "
                                                "(priority 10 > 1)")
            assert winner["id"] not in json.dumps(answer)
        assert ok(admin.get(f"/requests/{rid}"))["preempted_by_id"] == winner["id"]
        # Its history says as much, and no more.
        history = ok(x.get(f"/requests/{rid}/events"))["items"]
        assert [e["kind"] for e in history] == ["created", "allocated", "preempted"]
        assert history[-1]["message"] == ("preempted by another request on pool one-gpu "
                                          "(priority 10 > 1)")
        assert history[-1]["data"] == {"rule": "priority"}
        assert winner["id"] not in json.dumps(history)
        assert ok(admin.get(f"/requests/{rid}/events"))["items"][-1]["data"]["by"] == winner["id"]
        assert y.get(f"/requests/{rid}/events").status_code == 404
        taken = y.post("/requests", json={"component": "c-high", "resources": {"gpu": 1},
                                          "idempotency_key": "shared-key"})
        assert taken.status_code == 409 and rid not in taken.text, taken.text
        assert "taken by a request another token made" in taken.json()["detail"]


@pytest.mark.parametrize(("text", "preemptor", "own", "shown"), [
    ("allocated on pool p (policy priority 9), preempting request a", None, {"a"},
     "allocated on pool p (policy priority 9), preempting request a"),
    ("allocated on pool p (policy priority 9), preempting request a", None, set(),
     "allocated on pool p (policy priority 9), preempting another request"),
    ("allocated on pool p (policy priority 9), preempting requests a, b, c", None, {"b"},
     "allocated on pool p (policy priority 9), preempting request b and 2 other requests"),
    ("allocated on pool p (policy priority 9), preempting requests a, b, c", None, {"a", "c"},
     "allocated on pool p (policy priority 9), preempting requests a, c and 1 other request"),
    ("allocated on pool p (policy priority 9), preempting requests a, b", None, set(),
     "allocated on pool p (policy priority 9), preempting 2 other requests"),
    ("preempted by request z on pool p (priority 9 > 1)", "z", set(),
     "preempted by another request on pool p (priority 9 > 1)"),
    ("preempted by request z on pool p (priority 9 > 1)", "z", {"z"},
     "preempted by request z on pool p (priority 9 > 1)"),
])
def test_a_reason_names_only_the_callers_own_requests(
    text: str, preemptor: str | None, own: set[str], shown: str
) -> None:
    assert unnamed_others(text, preemptor, own) == shown


def test_id_prefixes_resolve_among_ones_own_requests(world: World, pools: str) -> None:
    # A fresh submitter with one request, whose first character is then its unique prefix.
    service = world.service()
    try:
        _, secret = service.create_token("submitter", ["c-a"])
    finally:
        service.close()
    headers = {"Authorization": f"Bearer {secret}"}
    with world.client(None) as c, world.client("b") as b, world.client("admin") as admin:
        mine = ok(c.post("/requests", headers=headers,
                         json={"component": "c-a", "resources": {"gpu": 99}}), 201)
        # b submits (rejected at once: cheap) until one of its ids shares that character.
        theirs = ""
        while theirs[:1] != mine["id"][0]:
            theirs = ok(b.post("/requests", json={"component": "c-b",
                                                  "resources": {"gpu": 99}}), 201)["id"]
        prefix = mine["id"][0]
        assert ok(c.get(f"/requests/{prefix}", headers=headers))["id"] == mine["id"]
        assert ok(c.delete(f"/requests/{prefix}", headers=headers), 204) is None
        assert admin.get(f"/requests/{mine['id']}").status_code == 404
        assert ok(admin.get(f"/requests/{theirs}"))["id"] == theirs


# -- the CLI, remote, with FAIRPOOL_TOKEN ------------------------------------------------


def test_remote_cli_with_a_token(world: World, pools: str) -> None:
    remote = {"FAIRPOOL_URL": world.server.url}
    with world.client("a") as a:
        held = ok(a.post("/requests", json={"component": "c-a", "resources": {"gpu": 1}}), 201)
    calls = [
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["a"]},
         ("resource-request", "create", "--component", "c-a", "--gpu-count", "1", "-o", "json")),
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["a"]},
         ("resource-pool", "create", "cli-pool", "--capacity", '{"gpu": 1}')),
        (remote, ("resource-pool", "list")),
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["admin"]},
         ("resource-pool", "list", "-o", "json")),
        # The request is a's: the other submitter cannot release it, its holder can.
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["b"]},
         ("resource-request", "release", held["id"])),
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["a"]},
         ("resource-request", "release", held["id"][:8])),
        # A token read from a file keeps its newline: fine. One that cannot be a header was
        # an "unreachable server" after 5 s of retries, printing the secret.
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["admin"] + "\r\n"}, ("resource-pool", "list")),
        ({**remote, "FAIRPOOL_TOKEN": world.tokens["admin"].replace("_", " é", 1)},
         ("resource-pool", "list")),
    ]
    with ThreadPoolExecutor(len(calls)) as workers:
        created, refused, anonymous, listed, as_b, as_a, from_file, garbled = workers.map(
            lambda call: fairpool(world.store, *call[1], **call[0]), calls
        )
    assert created.returncode == 0, created.stderr
    request = json.loads(created.stdout)
    assert request["status"] == "allocated" and request["component"] == "c-a"
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("Error: HTTP 403: this operation needs an admin token")
    assert anonymous.returncode == 1 and "HTTP 401: missing API token" in anonymous.stderr
    assert listed.returncode == 0 and "shared" in {p["name"] for p in json.loads(listed.stdout)["items"]}
    assert as_b.returncode == 1 and f"no request '{held['id']}'" in as_b.stderr
    assert as_a.returncode == 0, as_a.stderr
    assert from_file.returncode == 0 and "shared" in from_file.stdout, from_file.stderr
    assert garbled.returncode == 1 and garbled.stderr.startswith(
        "Error: token: must be printable ASCII without spaces")
    assert world.tokens["admin"][4:] not in garbled.stderr
    with world.client("admin") as admin:
        assert ok(admin.get(f"/requests/{held['id']}"))["status"] == "released"


def test_a_submitter_is_refused_before_it_is_asked_to_confirm(world: World, pools: str) -> None:
    """A change a submitter's token can never make is refused before it is shown and
    confirmed (config apply and rollback previewed the change and asked; pool delete asked,
    or said an unknown pool was not found). An admin is still asked (here stdin is empty:
    it aborts, changing nothing)."""
    remote = {"FAIRPOOL_URL": world.server.url}
    document = str(Path(__file__).parent.parent / "examples" / "scheduler" / "m5-cap.yaml")
    confirming = [("config", "apply", "-f", document), ("config", "rollback", "--version", "1"),
                  ("resource-pool", "delete", "shared"), ("resource-pool", "delete", "nope")]
    for args in confirming:
        refused = fairpool(world.store, *args, **remote, FAIRPOOL_TOKEN=world.tokens["a"])
        assert (refused.returncode, refused.stdout) == (1, ""), args
        assert refused.stderr.startswith(
            "Error: HTTP 403: this operation needs an admin token"), (args, refused.stderr)
    asked = fairpool(world.store, *confirming[2], **remote, FAIRPOOL_TOKEN=world.tokens["admin"])
    assert asked.returncode == 1 and "Are you sure" in asked.stderr, asked.stderr
    with world.client("admin") as admin:
        assert ok(admin.get("/pools/shared"))["name"] == "shared"


# -- the switch, the rules, the token store (no server) ----------------------------------


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.53", True), ("::1", True), ("[::1]", True),
    # localhost. is asked of DNS, not the hosts file: whatever it resolves to is served.
    ("localhost", True), ("LOCALHOST", True), ("localhost.", False), ("0.0.0.0", False),
    ("::", False), ("10.1.2.3", False), ("gpu-box.example.com", False), ("localhost.evil", False),
    (".", False), ("", False),
])
def test_auth_is_on_unless_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert auth_enabled(host) is not loopback
    assert auth_enabled(host, auth=True) is True
    if loopback:
        assert auth_enabled(host, auth=False) is False
    else:
        with pytest.raises(AuthSetupError, match="--insecure"):
            auth_enabled(host, auth=False)
        assert auth_enabled(host, auth=False, insecure=True) is False


def test_with_tokens_a_page_of_another_site_or_name_is_answered_as_any_caller(
    world: World, pools: str
) -> None:
    """A browser never attaches a bearer token by itself, so a server with tokens needs no
    check of Origin or Host (fairpool.api.browsers): it may be served under any name."""
    foreign = {"Origin": "http://evil.example", "Host": "gpu-box.example:8600"}
    with world.client(None) as anonymous:
        assert_401(anonymous.get("/pools", headers=foreign), "Bearer")
    with world.client("admin") as admin:
        assert pools in [p["name"] for p in ok(admin.get("/pools", headers=foreign))["items"]]


@pytest.mark.parametrize(("host", "auth", "level", "words"), [
    ("127.0.0.1", False, logging.INFO, "only requests addressed to a loopback name"),
    ("0.0.0.0", False, logging.WARNING, "anyone who can reach it can change"),
    ("0.0.0.0", True, logging.INFO, "API tokens required"),
])
def test_the_server_says_who_may_call_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, auth: bool, level: int,
    words: str,
) -> None:
    """``--no-auth --insecure`` on a public host was announced as an INFO line, as for
    loopback."""
    service = Service(Database.open(f"sqlite:///{tmp_path / 'f.db'}"))
    service.create_token("admin", [], "ops")
    log = logging.getLogger("test-announce")
    with caplog.at_level(logging.INFO, logger="test-announce"):
        _announce_auth(log, service, auth, host)
    service.close()
    (record,) = caplog.records
    assert record.levelno == level and words in record.getMessage()


def test_no_auth_on_a_public_host_is_refused_by_the_cli(tmp_path: Path) -> None:
    result = fairpool({"FAIRPOOL_HOME": str(tmp_path)}, "server", "--host", "0.0.0.0", "--no-auth")
    assert result.returncode == 2
    assert "refusing to serve 0.0.0.0 without auth" in result.stderr
    assert "--insecure" in result.stderr


@pytest.mark.parametrize("args", [("token", "list"), ("server", "--port", "1")])
def test_a_database_url_that_is_none_is_one_error_line(tmp_path: Path, args: tuple[str, ...]
                                                       ) -> None:
    """SQLAlchemy's ArgumentError was a traceback."""
    result = fairpool({"FAIRPOOL_HOME": str(tmp_path)}, *args, "--database-url", "bogus")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("Error: database-url: is not a database URL: use sqlite:///PATH "
                             "or postgresql://USER@HOST/DATABASE (got 'bogus')\n")


def test_every_api_route_has_a_rule(tmp_path: Path) -> None:
    service = Service(Database.open(f"sqlite:///{tmp_path / 'f.db'}"))
    try:
        app = create_app(service, auth=True)
    finally:
        service.close()

    def api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
        for route in routes:
            if isinstance(route, APIRoute):
                yield route
            else:  # FastAPI >= 0.16x keeps an included router whole
                yield from api_routes(getattr(getattr(route, "original_router", None),
                                              "routes", ()))

    open_routes = {"healthz", "readyz", "metrics"}
    guarded = {
        route.name for route in api_routes(app.routes)
        if route.path.startswith(PREFIX) and route.name not in open_routes
    }
    assert guarded == set(RULES)


@pytest.fixture
def svc(database_url: str) -> Iterator[Service]:
    db = Database.open(database_url)
    yield Service(db)
    db.close()


def test_others_ids_in_an_answer_read_another_for_a_submitter(svc: Service) -> None:
    """`config explain` named others' running workloads as would-be victims (and a
    workload's reason its preemptor), which a submitter could not otherwise see."""
    scheduling = SchedulingService(svc.db)
    a, _ = svc.create_token("submitter", ["c"], "a")
    b, _ = svc.create_token("submitter", ["c"], "b")
    admin, _ = svc.create_token("admin")
    mine, theirs, anonymous = (
        scheduling.submit_workload(labels={"t": "x"}, created_by=by).id
        for by in (a.id, b.id, None)
    )
    unrelated = "00000000-0000-8000-8000-000000000000"  # no workload's id
    data = {"reason": f"at priority 90, preempting {theirs}, {mine}, {anonymous}",
            "notes": [f"{unrelated} stays", f"preempted by workload {theirs} in queue q"],
            "id": mine,
            # What the caller gave is shown as given: rewritten, it would tell which ids are
            # someone else's.
            "labels": {"ref": theirs}}
    auth = Auth(svc, True)
    assert without_others(auth, a, "workload", data) == {
        "reason": f"at priority 90, preempting another workload, {mine}, another workload",
        "notes": [f"{unrelated} stays", "preempted by another workload in queue q"],
        "id": mine, "labels": {"ref": theirs},
    }
    assert without_others(auth, admin, "workload", data) == data
    assert without_others(auth, None, "workload", data) == data


def test_token_store(svc: Service) -> None:
    admin, admin_secret = svc.create_token("admin", name="ops")
    sub, sub_secret = svc.create_token("submitter", ["b", "a", "a"])
    assert admin_secret.startswith("fp_") and len(admin_secret) == 46
    assert sub.components == ("a", "b") and admin.components == ()
    assert svc.authenticate(sub_secret) == sub and svc.authenticate("fp_nope") is None
    assert sub.secret_hash == hash_token(sub_secret) != sub_secret
    assert [t.id for t in svc.list_tokens()] == [admin.id, sub.id]
    revoked, changed = svc.revoke_token(sub.id[:8])
    assert changed and revoked.revoked_at is not None
    again, changed = svc.revoke_token(sub.id)
    assert not changed and again.revoked_at == revoked.revoked_at
    authenticated = svc.authenticate(sub_secret)
    assert authenticated is not None and authenticated.revoked_at is not None
    with pytest.raises(InvalidInput, match="at least one --component"):
        svc.create_token("submitter")
    with pytest.raises(InvalidInput, match="admin token may use every component"):
        svc.create_token("admin", ["a"])
    with pytest.raises(InvalidInput, match="role"):
        svc.create_token("root")
    with pytest.raises(NotFound, match="no token"):
        svc.revoke_token("zzz")


def test_requests_keep_their_owner_and_retries_inherit_it(svc: Service) -> None:
    token, _ = svc.create_token("submitter", ["sandbox"])
    svc.create_pool("p", {"gpu": 2})
    svc.attach_policy("p", "sandbox", priority=1)
    svc.attach_policy("p", "prod", priority=9)
    low = svc.create_request("sandbox", demand={"gpu": 2}, max_retries=1, created_by=token.id)
    anonymous = svc.create_request("prod", demand={"gpu": 2})  # preempts low
    victim = svc.get_request(low.id)
    assert victim.status == "preempted" and victim.retried_as_id is not None
    with svc.db.read() as conn:
        assert repo.get_request(conn, low.id).created_by_token_id == token.id
        assert repo.get_request(conn, victim.retried_as_id).created_by_token_id == token.id
        assert repo.get_request(conn, anonymous.id).created_by_token_id is None
        assert repo.resolve_own(conn, "request", victim.retried_as_id[:6], token.id) == (
            victim.retried_as_id)
        with pytest.raises(NotFound):
            repo.resolve_own(conn, "request", anonymous.id, token.id)
