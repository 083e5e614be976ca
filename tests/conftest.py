"""Shared fixtures: ``database_url`` runs a test once on SQLite and once on PostgreSQL.

PostgreSQL is the server at ``$FAIRPOOL_TEST_POSTGRES`` (a libpq conninfo for an account that
may create databases; default: trust auth as ``postgres`` on 127.0.0.1:5432). Each test gets
its own database ``fairpool_test_<hex>``, dropped after it. When the server is unreachable the
PostgreSQL variants are skipped, except under CI (``$CI`` set), where they fail: CI must run
them.

Speed, measured on PostgreSQL 15: CREATE DATABASE takes 60-150 ms, migrating it ~250 ms, and
DROP DATABASE ~1 s (it forces a checkpoint and waits for every backend). So ``database_url``
clones a template migrated once per session, a background thread clones the next ones while
tests run, and drops run on background connections too (concurrent drops share checkpoints).
The session waits for them at its end, and fails if one failed.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import URL

from fairpool.paging import Page, V
from fairpool.store.db import Database

Backend = Literal["sqlite", "postgresql"]
BACKENDS: list[Backend] = ["sqlite", "postgresql"]

POSTGRES_CONNINFO = os.environ.get(
    "FAIRPOOL_TEST_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``long`` first (in their order), the rest after them. Started last,
    one of them would run alone on one worker at the end of the run, the other idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


class PostgresServer:
    """Creates and drops the test databases, over an autocommit admin connection."""

    #: Migrated databases cloned ahead of the tests that will take them.
    PREFETCH = 2

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._admin = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
        self._clones = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clone-database")
        self._drops = ThreadPoolExecutor(max_workers=4, thread_name_prefix="drop-database")
        self._ready: deque[Future[str]] = deque()
        self._pending: list[Future[None]] = []
        self._template: str | None = None

    def url(self, name: str) -> str:
        info = self._admin.info
        url = URL.create(
            "postgresql+psycopg",
            username=info.user,
            password=info.password or None,
            host=info.host,
            port=info.port,
            database=name,
        )
        return url.render_as_string(hide_password=False)

    def create(self, *, migrated: bool = False) -> str:
        """A new database: empty, or (``migrated``) at the schema head. Returns its name."""
        if not migrated:
            return self._create(self._admin)
        template = self._migrated_template()
        while len(self._ready) <= self.PREFETCH:
            self._ready.append(self._clones.submit(self._clone, template))
        return self._ready.popleft().result()

    def create_collated(self, icu_locale: str) -> str:
        """A new, empty database whose text sorts by ``icu_locale`` (``en-US``: as where the
        OS's locale is, PostgreSQL's Docker image's say), not by code point."""
        name = f"fairpool_test_{uuid.uuid4().hex}"
        self._admin.execute(sql.SQL(
            "CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE {} "
            "LOCALE 'C.UTF-8'"
        ).format(sql.Identifier(name), sql.Literal(icu_locale)))
        return name

    def drop_later(self, name: str) -> None:
        self._pending.append(self._drops.submit(self._drop, name))

    def close(self) -> None:
        self._clones.shutdown(wait=True)
        for unused in self._ready:
            if unused.exception() is None:
                self.drop_later(unused.result())
        self._drops.shutdown(wait=True)
        try:
            if self._template is not None:
                self._drop(self._template)
        finally:
            self._admin.close()
        for pending in self._pending:
            pending.result()  # re-raises a failed drop

    def _migrated_template(self) -> str:
        """Migrated by ``Database.open``, as every database is; cloning it takes ~50 ms."""
        if self._template is None:
            name = self.create()
            self._template = name
            Database.open(self.url(name)).close()
        return self._template

    def _create(self, admin: psycopg.Connection[Any], template: str | None = None) -> str:
        name = f"fairpool_test_{uuid.uuid4().hex}"
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        admin.execute(statement)
        return name

    def _clone(self, template: str) -> str:
        with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as admin:
            return self._create(admin, template)

    def _drop(self, name: str) -> None:
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as admin:
            admin.execute(statement)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer(POSTGRES_CONNINFO)
    except psycopg.OperationalError as error:
        unreachable = str(error).strip().splitlines()[0]
    else:
        unreachable = None
    if unreachable is not None:
        reason = f"PostgreSQL unreachable at {POSTGRES_CONNINFO!r} ($FAIRPOOL_TEST_POSTGRES): "
        reason += unreachable
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the PostgreSQL tests", pytrace=False)
        pytest.skip(reason)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., str]:
    """Make databases for this test: ``new_database(backend, migrated=False)`` gives a URL.

    SQLite: a new file under tmp_path. PostgreSQL: a new database, dropped after the test.
    """
    made: list[str] = []

    def make(backend: Backend, *, migrated: bool = False) -> str:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / f'fairpool-{len(made)}.db'}"
            made.append(url)
            if migrated:
                Database.open(url).close()
            return url
        return _on_postgres(request, migrated=migrated)

    return make


def database_on(request: pytest.FixtureRequest, backend: Backend, root: Path) -> str:
    """For a fixture of any scope: a database URL on ``backend``, at the schema head. SQLite:
    a file under ``root``, created here. PostgreSQL: a database of its own, dropped when
    ``request``'s scope ends."""
    if backend == "sqlite":
        root.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{root / 'fairpool.db'}"
        Database.open(url).close()
        return url
    return _on_postgres(request, migrated=True)


def _on_postgres(request: pytest.FixtureRequest, *, migrated: bool) -> str:
    """A new PostgreSQL database, empty or at the schema head, dropped when ``request``'s
    scope ends: its URL."""
    server: PostgresServer = request.getfixturevalue("postgres")
    name = server.create(migrated=migrated)
    request.addfinalizer(lambda: server.drop_later(name))
    return server.url(name)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own for the test, once per backend; ``Database.open`` it.

    SQLite: a file in tmp_path, not created yet. PostgreSQL: a new database, already at the
    schema head (cloned from a template migrated once per session). Limit a test to one backend
    with ``@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)``.
    """
    backend: Backend = request.param
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fairpool.db'}"
        return
    yield _on_postgres(request, migrated=True)


def walked_pages(page: Callable[..., Page[V]], total: int) -> list[V]:
    """Every item of a list read a page at a time, each ``page(after=...)`` the ``next`` of
    the one before; ``next`` is given while, and only while, more follow."""
    items: list[V] = []
    after: str | None = None
    while True:
        found = page(after=after)
        items += found.items
        assert found.total == total
        assert (found.next is None) == (len(items) >= total), (len(items), total, found.next)
        if found.next is None:
            return items
        after = found.next


@pytest.fixture
def short_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write waits 0.2 s for the lock, not 30 (connections made from here on; PostgreSQL
    sets its lock_timeout on connecting)."""
    from sqlalchemy import text

    from fairpool.store import db
    from fairpool.store.direct import Direct

    monkeypatch.setattr(db, "LOCK_TIMEOUT_MS", 200)
    monkeypatch.setattr(db, "_BUSY_TIMEOUTS", {
        ms: Direct(text(f"PRAGMA busy_timeout = {ms}")) for ms in (200, 0)})
    monkeypatch.setattr(db, "_SQLITE_PRAGMAS", tuple(
        "PRAGMA busy_timeout = 200" if p.startswith("PRAGMA busy_timeout") else p
        for p in db._SQLITE_PRAGMAS))
