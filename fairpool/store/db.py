"""Opening the database, migrating it, and its read and write transactions.

Two backends, one behaviour: SQLite (the embedded default) and PostgreSQL (``postgresql://``
or ``postgresql+psycopg://`` URLs, driven by psycopg 3).

Writers are serialized across every process and replica using the database, so each write
transaction sees all earlier commits and nothing else writes until it ends:

- SQLite: every write transaction starts with BEGIN IMMEDIATE, so it holds the database's one
  write lock from its first statement and never fails half-way with "database is locked".
- PostgreSQL: every write transaction is READ COMMITTED and its first statement takes the
  transaction-scoped advisory lock ``WRITE_LOCK_KEY``, released at commit or rollback; each
  later statement's snapshot therefore includes every earlier writer's commit.

A writer waits for the lock up to ``LOCK_TIMEOUT_MS`` (SQLite busy_timeout, PostgreSQL
lock_timeout), then fails with ``sqlalchemy.exc.OperationalError`` before it wrote anything.
Readers run on one consistent snapshot (SQLite: WAL; PostgreSQL: REPEATABLE READ, READ ONLY)
and never block writers. Opening a database migrates it under the write lock, so several
processes may open a brand-new database at once.

PostgreSQL connections may be lost between transactions (a restart, a failover, a backend
terminated): one found closed as it is handed out is replaced, and a read's BEGIN or a
write's first round trip (BEGIN, the lock, the generation) that finds its connection lost
runs again, once, on a new one, nothing having been committed. Lost later, or with none to
be made, the transaction fails with ``DatabaseUnreachable`` (an ``Unreachable``, a server's
503), which says whether a COMMIT sent may have taken effect; it is never run again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import platformdirs
from sqlalchemy import Connection, Engine, RootTransaction, create_engine, event, text
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    OperationalError,
)

if TYPE_CHECKING:
    from alembic.config import Config
from sqlalchemy.engine import URL, make_url

from fairpool.errors import (
    InvalidInput,
    SchemaMoved,
    Unreachable,
    WouldWait,
    counted,
    one_line,
    password_hidden,
)
from fairpool.forks import start_over_in_children
from fairpool.store.direct import (
    AsyncWriter,
    Direct,
    as_sqlalchemy,
    closed_while_idle,
    defer_writes,
    send_deferred,
    stop_deferring,
    take_deferred,
)
from fairpool.store.revision import SCHEMA_HEAD as SCHEMA_HEAD  # re-exported

_MIGRATIONS = Path(__file__).parent / "migrations"

log = logging.getLogger("fairpool.store")

#: How long a writer waits for the write lock before it fails, on both backends.
LOCK_TIMEOUT_MS = 30_000
#: PostgreSQL: how long making a connection may take (libpq's ``connect_timeout``, unless
#: the URL gives one; libpq's own default waits for ever, and a host that stopped answering
#: would hold a command far past what a wait rides out, ``WAIT_OUTAGE``).
CONNECT_TIMEOUT = 10
#: PostgreSQL: what finds a connection whose peer is gone without a word (a host powered
#: off, a network partition; libpq's names, unless the URL gives them). Without, a write sent
#: on one waited for its answer for the kernel's ~15 minutes of retransmissions, and a read of
#: one for ever, every other write of the process queued behind it. Keepalives probe an idle
#: connection after 10 s, every 5 s, 3 times; ``tcp_user_timeout`` (ms) fails one whose sent
#: data stays unacknowledged for 30 s. A database that is up but answers slowly (its lock held
#: up to ``LOCK_TIMEOUT_MS``) acknowledges, and is waited for.
TCP_DEFAULTS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                "keepalives_count": 3, "tcp_user_timeout": 30_000}
#: How often ``Database.checkpoint_apart``'s thread checkpoints the WAL: under the heaviest
#: load measured (~60 MB of WAL a second) it stays under ``WAL_SIZE_LIMIT``.
CHECKPOINT_SECONDS = 1.0
#: How often, at most, a PostgreSQL write checks that no newer fairpool migrated the store.
SCHEMA_CHECK_SECONDS = 1.0
#: Bytes of WAL file kept once checkpointed (SQLite keeps all of it by default).
WAL_SIZE_LIMIT = 64 * 1024 * 1024

#: The PostgreSQL advisory lock every write transaction takes first: "fairpool" in ASCII, a
#: positive signed 64-bit integer. Advisory locks are per database, so several fairpool
#: databases on one server do not contend.
WRITE_LOCK_KEY = int.from_bytes(b"fairpool", "big")

# Execution option telling the SQLite "begin" hook which kind of transaction to open: "read",
# "write", or "write_now" and "read_now" (which fail at once rather than wait for a lock).
_MODE = "fairpool_mode"
# Where a pooled SQLite connection remembers whether it is set query_only.
_QUERY_ONLY = "fairpool_query_only"
# Where a write transaction's connection keeps the generation it incremented to.
_GENERATION = "fairpool_generation"
_BUMP = Direct(text("UPDATE store_generation SET value = value + 1 WHERE id = 1 RETURNING value"))
_BUMP_FROM = Direct(
    text("UPDATE store_generation SET value = value + 1 WHERE id = 1 AND value = :seen")
)
_GENERATION_NOW = text("SELECT value FROM store_generation WHERE id = 1")
_WRITE_LOCK = Direct(text(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})"))
_BEGIN_READ_COMMITTED = Direct(text("BEGIN ISOLATION LEVEL READ COMMITTED"))
_BEGIN_REPEATABLE_READ = Direct(text("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
_BEGIN_WRITE, _BEGIN_READ = Direct(text("BEGIN IMMEDIATE")), Direct(text("BEGIN"))
# The writer connection's, while a thread checkpoints instead (``checkpoint_apart``).
_NO_AUTOCHECKPOINT = Direct(text("PRAGMA wal_autocheckpoint = 0"))
# The SQLite busy timeouts a transaction begins with: waiting for the lock, or failing at once.
_BUSY_TIMEOUTS = {ms: Direct(text(f"PRAGMA busy_timeout = {ms}")) for ms in (LOCK_TIMEOUT_MS, 0)}
# Where a pooled SQLite connection remembers its busy timeout, and whether its foreign keys
# are on (``_SQLITE_PRAGMAS`` turns them on).
_BUSY = "fairpool_busy_timeout"
_FOREIGN_KEYS = "fairpool_foreign_keys"

#: Each connection's settings; none is kept in the file (WAL is: ``Database._use_wal``).
_SQLITE_PRAGMAS = (
    # So that switching to WAL waits for a concurrent opener instead of failing.
    f"PRAGMA busy_timeout = {LOCK_TIMEOUT_MS}",
    "PRAGMA foreign_keys = ON",
    # Safe with WAL: a power cut may lose the last commits but never corrupts the file.
    "PRAGMA synchronous = NORMAL",
    # A WAL that a burst of writes grew (a server checkpoints it once a second:
    # ``Database.checkpoint_apart``) is cut back to this once checkpointed, not kept.
    f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}",
)


class DatabaseUnreachable(Unreachable):
    """PostgreSQL could not be reached, or the connection to it was lost (a restart, a
    failover, its backend terminated): perhaps a passing outage, as a server's, which
    ``fairpool run`` and the SDK's heartbeats ride out and a server answers with 503.
    ``orig``: the driver's error."""

    def __init__(self, message: str, orig: BaseException | None) -> None:
        super().__init__(message)
        self.orig = orig


class DatabaseLocked(DatabaseUnreachable):
    """SQLite: another process held the write lock past ``LOCK_TIMEOUT_MS`` (a long write,
    many writing at once); nothing was written. A passing outage too: a wait rides it out,
    a heartbeat's or a release's lease covers it. It reached waits, ``fairpool run``'s last
    release and the SDK's as SQLAlchemy's ``OperationalError``, which they did not expect:
    a waiting request was left queued for nobody, a command's exit code lost (helper-78)."""


def fairpool_home(explicit: str | None = None) -> Path:
    """Where fairpool keeps its data: ``explicit``, else $FAIRPOOL_HOME, else the user data dir."""
    chosen = (
        explicit
        or os.environ.get("FAIRPOOL_HOME")
        or platformdirs.user_data_dir("fairpool", appauthor=False)
    )
    return Path(chosen).expanduser()


def default_url(home: Path) -> URL:
    """The store under ``home``; a URL object, not text: ``?`` in a path would start the
    text's query, and the store was made outside the home (helper-78)."""
    return URL.create("sqlite", database=str(home / "fairpool.db"))


def migration_config(connection: Connection) -> Config:
    """Alembic configuration that runs ``migrations/`` on ``connection`` (no alembic.ini)."""
    from alembic.config import Config

    config = Config()
    # ConfigParser would read a "%" in the path as interpolation.
    config.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def _json_text(value: Any) -> str:
    """A JSON column's text on SQLite: ``json.dumps``, but the empty object that most rows
    hold (requests' labels, events' data) without it, ~1.5 µs a call."""
    return "{}" if value == {} else json.dumps(value)


def _opening(connection: Connection) -> tuple[Direct, ...]:
    """What a write transaction starts with, to make writers mutually exclusive across
    processes.

    Nothing on SQLite, where the begin hook's BEGIN IMMEDIATE took the single write lock. On
    PostgreSQL: BEGIN, in READ COMMITTED, then the advisory lock as the first statement: a
    REPEATABLE READ snapshot would be taken by that very statement, before the wait, and miss
    the commit of the writer it waited for. The writer's connection is in autocommit mode
    and sends BEGIN itself, so that BEGIN, the lock and what follows go in one round trip
    (in a pipeline psycopg's own BEGIN waits for its answer).
    """
    if connection.dialect.name == "postgresql":
        return _BEGIN_READ_COMMITTED, _WRITE_LOCK
    return ()


def _start(connection: Connection, bump: bool, last_seen: int | None) -> None:
    """Open a write transaction: BEGIN where needed, the lock, and with ``bump`` the
    generation incremented. ``last_seen``: it is expected to be that (see
    ``Database.write``); else it is read, and all this is one round trip on PostgreSQL."""
    opening = _opening(connection)
    if bump and last_seen is None:
        connection.info[_GENERATION] = _BUMP.scalar(connection, preceded_by=opening)
        return
    for statement in opening:
        statement.execute(connection)
    if bump:
        assert last_seen is not None
        _BUMP_FROM.execute(
            connection, {"seen": last_seen}, must_change=("store generation", str(last_seen))
        )
        connection.info[_GENERATION] = last_seen + 1


def read_generation(connection: Connection) -> int:
    """The store's generation as a read transaction's snapshot holds it: the one the last
    write committed before the snapshot."""
    return int(connection.execute(_GENERATION_NOW).scalar_one())


def generation(connection: Connection) -> int:
    """The store's generation after this write transaction (``Database.write``) began: one
    more than at the end of the transaction committed before it."""
    value: int = connection.info[_GENERATION]
    return value


#: What a forked child keeps of its parent's databases, unused (``Database._forked``).
_INHERITED: list[object] = []


def _made_here(_session: Any, record: Any) -> None:
    record.info["pid"] = os.getpid()


def _not_inherited(_session: Any, record: Any, proxy: Any) -> None:
    """A pooled connection a forked child finds: left to the parent, not closed (SQLAlchemy's
    way), and the pool makes another."""
    if record.info.get("pid") != os.getpid():
        record.dbapi_connection = proxy.dbapi_connection = None
        raise DisconnectionError("opened by the process this one was forked from")


class Database:
    """One database: hands out transactions. A process forked from the one that opened it
    opens connections of its own (``_forked``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        #: PostgreSQL: the sessions opened (psycopg connections, the loop's too), whose
        #: sockets a forked child must never use (``_forked``).
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        if engine.dialect.name == "postgresql":
            event.listen(engine, "connect", lambda session, _: self._sessions.add(session))
        event.listen(engine, "connect", _made_here)
        event.listen(engine, "checkout", _not_inherited)
        start_over_in_children(self)
        #: Why this process must write no more (``schema_problem`` found the schema moved on,
        #: or gone): every write then fails with it, a server's answers 503.
        self.schema_moved: str | None = None
        #: When a PostgreSQL write last checked for that (``time.monotonic``).
        self._schema_checked = -math.inf
        #: A SQLite file's path and identity (device, inode) once opened: a write finds it
        #: deleted or replaced (``_replaced``).
        self._file: tuple[str, int, int] | None = None
        # Writers of this process queue here rather than at the database lock, where SQLite's
        # busy handler would make them sleep in steps of up to 100 ms after it is free.
        self._write_lock = threading.Lock()
        self._fork_waited = False  # ``_forking`` holds the write lock across a fork
        # The write transactions' connection, kept from one to the next (under the write
        # lock): checking one out of the pool and back cost ~30 µs per transaction. Dropped
        # when a transaction fails, in case the connection is what failed.
        self._writer: Connection | None = None
        # PostgreSQL: the event loop's connection for ``write_async``, used under the write
        # lock; dropped likewise.
        self._async_writer: AsyncWriter | None = None
        # PostgreSQL: the event loop's connection for ``scalar_async`` (a psycopg
        # AsyncConnection), opening or open; dropped when a read on it fails.
        self._async_reader: asyncio.Future[Any] | None = None
        # SQLite: the connection of the reads that must not wait (``read(wait=False)``, an
        # event loop's), kept likewise under a lock of its own that they never wait for.
        self._reader_now: Connection | None = None
        self._reader_now_lock = threading.Lock()
        # SQLite: the thread that checkpoints the WAL instead of the writes
        # (``checkpoint_apart``), and what stops it.
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    @classmethod
    def open(cls, url: str | URL) -> Database:
        """Connect to ``url`` and bring its schema to the latest revision.

        ``url``: ``sqlite:///<path>`` or ``postgresql[+psycopg]://<user>@<host>/<database>``.
        """
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as error:  # ValueError: a port not a number
            problem = "has a port that is not a number" if isinstance(error, ValueError) else (
                "is not a database URL")
            raise InvalidInput("database-url", password_hidden(str(url)), f"{problem}: use "
                               "sqlite:///PATH or postgresql://USER@HOST/DATABASE") from None
        if parsed.host and "@" in parsed.host:
            # SQLAlchemy splits at the first "@": the rest of the password went into the
            # host, shown in every error unhidden (helper-94).
            raise InvalidInput("database-url", password_hidden(str(url)),
                               "an '@' in the user name or password is written %40")
        backend = parsed.get_backend_name()
        driver = _DRIVERS.get(backend)
        if driver and parsed.drivername not in (backend, f"{backend}+{driver}"):
            raise InvalidInput(
                "database-url", parsed.render_as_string(hide_password=True),
                f"fairpool talks to {backend} through {driver} only: use {backend}:// or "
                f"{backend}+{driver}://",
            )
        if backend == "sqlite":
            # A mistyped path would else be a new, empty store (the home is made for it).
            folder = Path(parsed.database or ".").parent
            if parsed.database not in (None, "", ":memory:") and not folder.is_dir():
                raise InvalidInput("database-url", str(url), f"{folder} is not a directory")
            engine = create_engine(parsed, json_serializer=_json_text)
            _control_sqlite_transactions(engine)
        elif backend == "postgresql":
            if parsed.drivername == "postgresql":
                # psycopg 3 is the driver fairpool depends on; SQLAlchemy's default is psycopg2.
                parsed = parsed.set(drivername="postgresql+psycopg")
            # Writes need READ COMMITTED (see _opening); reads switch per connection.
            engine = create_engine(parsed, isolation_level="READ COMMITTED",
                                   connect_args=connect_defaults(parsed))
            _configure_postgresql(engine)
        else:
            raise InvalidInput("database-url", password_hidden(str(url)),
                               "fairpool keeps its data in SQLite or PostgreSQL: use "
                               "sqlite:///PATH or postgresql://USER@HOST/DATABASE")
        db = cls(engine)
        try:
            db._upgrade()
            if backend == "sqlite":
                db._file = _file_identity(engine.url.database)
        except (DBAPIError, DatabaseUnreachable) as error:
            db.close()  # not there, unreachable, not a database: one line
            unwritable = _unwritable_folder(parsed.database) if backend == "sqlite" else ""
            # On one line, as every error's message (libpq's has a hint on a line of its own).
            raise Unreachable(one_line(f"cannot open the database {db.where}: {error.orig}"
                                       f"{unwritable}")) from None
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self.checkpoint_with_writes()
        with self._write_lock:
            self._drop_writer()
            if self._async_writer is not None:  # its loop did not ``close_async``
                self._async_writer.connection.pgconn.finish()
                self._async_writer = None
        reader, self._async_reader = self._async_reader, None
        if reader is not None and reader.done() and not reader.cancelled():
            if reader.exception() is None:  # opened: its loop did not ``close_async``
                reader.result().pgconn.finish()
        with self._reader_now_lock:
            if self._reader_now is not None:
                self._reader_now.close()
                self._reader_now = None
        self._engine.dispose()

    async def close_async(self) -> None:
        """On the loop that used ``write_async`` and ``scalar_async``: close their
        connections."""
        writer, self._async_writer = self._async_writer, None
        if writer is not None:
            await writer.connection.close()
        reader, self._async_reader = self._async_reader, None
        if reader is not None:
            with suppress(Exception):  # it failed to open: nothing to close
                await (await reader).close()

    def _forking(self) -> None:
        """SQLite: a fork waits for this process's write to end. SQLite keeps a process's
        file locks in memory, which the child inherits: forked mid-write, its own writes
        found the file locked by a connection it does not have, for 30 s (helper-97)."""
        self._fork_waited = self.embedded and self._write_lock.acquire(
            timeout=LOCK_TIMEOUT_MS / 1000)

    def _forked_parent(self) -> None:
        if self._fork_waited:
            self._write_lock.release()

    def _forked(self) -> None:
        """In a child forked from a process that used it. The parent's connections are the
        parent's: an answer on one reaches whichever process reads first (the children of
        a Client got each other's pools, or the driver's errors), and one closed here says
        goodbye to PostgreSQL for the parent (helper-94). So their sockets here are pointed
        at /dev/null, those checked out are kept unused for the child's life (released, they
        would be rolled back), and the child opens its own (``_not_inherited``). Only
        what takes no lock is done here: a subprocess's child runs it too, before its exec
        (``fairpool run``'s ``preexec_fn``), where a lock a thread held at the fork stays held."""
        if self._sessions:
            nowhere = os.open(os.devnull, os.O_RDWR)
            for session in list(self._sessions):
                with suppress(Exception):  # closed already: it has no socket
                    os.dup2(nowhere, session.pgconn.socket)
            os.close(nowhere)
            self._sessions = weakref.WeakSet()
        _INHERITED.append((self._writer, self._reader_now, self._async_writer,
                           self._async_reader))
        self._writer = self._reader_now = self._async_writer = self._async_reader = None
        self._write_lock = threading.Lock()  # held by a thread of the parent, maybe
        self._reader_now_lock = threading.Lock()
        self._checkpointer = None
        self._stop_checkpoints = threading.Event()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def where(self) -> str:
        """The database's URL, its password hidden: for logs."""
        return self._engine.url.render_as_string(hide_password=True)

    @property
    def embedded(self) -> bool:
        """A file this process opens (SQLite): a write that finds every lock free is a few
        hundred µs of local work. (On PostgreSQL each statement is a network round trip.)"""
        return self._engine.dialect.name == "sqlite"

    @contextmanager
    def write(
        self, wait: bool = True, defer: bool = False, last_seen: int | None = None
    ) -> Iterator[Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises.
        It increments the store's generation first (``generation`` tells the new value).

        Without ``wait`` (embedded databases only), ``WouldWait`` is raised, before anything
        is written, instead of waiting for another writer of this process or of another.

        With ``defer``, on PostgreSQL, ``Direct`` writes are queued and sent together
        (``direct.defer_writes``), the last ones with COMMIT: one that fails raises
        ``DeferredWriteFailed``, from the next statement or from the end of the block, and
        nothing is committed. ``last_seen``, with ``defer``: the generation the caller
        believes the store is at, its last commit's. BEGIN, the lock and the increment are
        then queued too, and the generation is checked when they are sent: if another
        writer committed since, ``DeferredWriteFailed``. So a whole transaction of deferred
        writes is one round trip."""
        with self._write(bump=True, wait=wait, defer=defer, last_seen=last_seen) as connection:
            yield connection

    @asynccontextmanager
    async def write_async(self, last_seen: int) -> AsyncIterator[Connection]:
        """PostgreSQL, on an event loop: ``write(defer=True, last_seen=last_seen)`` whose one
        round trip the loop awaits instead of blocking on it. The block's statements are
        collected, not sent, so it must not need the database: a read or a scalar raises
        ``WouldWait``, and nothing is sent. At its end, BEGIN, the lock, the generation's
        check, the writes and COMMIT go in one round trip on the loop's own connection
        (``AsyncWriter``), with ``send_deferred``'s failures. ``WouldWait`` at once if
        another write of this process is running, or no writer connection is open (opening
        one would block)."""
        assert not self.embedded, "an embedded write has no round trip to await"
        if self.schema_moved is not None:
            raise SchemaMoved(self.schema_moved)
        if not self._write_lock.acquire(blocking=False):
            raise WouldWait("another write of this process is running")
        try:
            connection = self._writer
            if connection is None:
                raise WouldWait("the writer connection is to be opened")
            defer_writes(connection, collect=True)
            try:
                _start(connection, True, last_seen)
                yield connection
                writes = take_deferred(connection)
            finally:
                stop_deferring(connection)
                if connection.in_transaction():  # begun by a statement refused unsent
                    connection.rollback()
            await self._send_async(writes)
        finally:
            self._write_lock.release()

    async def scalar_async(self, statement: Direct, parameters: Mapping[str, Any]) -> Any:
        """PostgreSQL, on an event loop: ``statement``, a read of one value, which is a
        consistent snapshot by itself (as ``read(statement=True)``), on the loop's own
        connection; its one round trip the loop awaits instead of a worker thread blocking on
        it. For a long-poll's first read: with it on a worker thread (a hop there and back,
        and a thread contending with the loop for the GIL) the contended load cost 2.19 ms
        of server CPU per admission, with it here 1.99. Errors as ``Direct.scalar``'s; the
        connection is then dropped."""
        assert not self.embedded, "an embedded read has no round trip to await"
        if self._async_reader is None:
            self._async_reader = asyncio.ensure_future(self._connect_async())
        opening = self._async_reader
        try:
            connection = await asyncio.shield(opening)  # cancelled: it opens for the next
        except Exception:
            if self._async_reader is opening:
                self._async_reader = None
            raise
        try:
            return await statement.scalar_async(connection, self._engine.dialect, parameters)
        except BaseException:  # failed, or cancelled in its round trip: its state is unknown
            if self._async_reader is opening:
                self._async_reader = None
            connection.pgconn.finish()
            raise

    async def _connect_async(self) -> Any:
        """A psycopg ``AsyncConnection`` in autocommit mode, for the loop."""
        import psycopg  # only here: SQLite never needs it

        url = self._engine.url
        _, parameters = self._engine.dialect.create_connect_args(url)
        connection = None
        try:
            connection = await psycopg.AsyncConnection.connect(
                **{**connect_defaults(url), **parameters}, autocommit=True
            )
            self._sessions.add(connection)
            await connection.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        except psycopg.Error as error:
            if connection is not None:
                await connection.close()
            # As a statement's (``Direct``): SQLAlchemy's OperationalError, a 503 (the
            # driver's own was a 500 to every long-poll of an outage after its first).
            raise as_sqlalchemy(error, self._engine.dialect, invalidated=True) from error
        return connection

    async def _send_async(self, writes: list[Any]) -> None:
        writer = self._async_writer
        self._async_writer = None
        if writer is not None and closed_while_idle(writer.connection.pgconn):
            await writer.connection.close()
            writer = None
        if writer is None:
            writer = AsyncWriter(await self._connect_async())
        try:
            await writer.send(writes, self._engine.dialect)
        except BaseException:
            await writer.connection.close()  # its transaction is aborted, or its state unknown
            raise
        self._async_writer = writer

    @contextmanager
    def migrating(self) -> Iterator[Connection]:
        """A write transaction for schema migrations only: it leaves the generation alone,
        whose table may not exist yet (or any more). On SQLite, foreign keys are off in it
        (``_on_begin``) and checked at its end: a migration rebuilds a table to alter it
        (copy, DROP the old one, rename), and with them on, the DROP deleted the rows that
        refer to it (ON DELETE CASCADE) or failed."""
        with self._write(bump=False, migrate=True) as connection:
            yield connection
            if connection.dialect.name == "sqlite":
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:  # rolled back; ``Database.open`` says it in one line
                    table, row, parent, _ = broken[0]
                    raise IntegrityError("PRAGMA foreign_key_check", None, Exception(
                        f"the migration would leave {counted(len(broken), 'row')} referring "
                        f"to none (the first: {table} row {row}, to {parent})"))

    @contextmanager
    def _write(
        self, bump: bool, wait: bool = True, defer: bool = False, last_seen: int | None = None,
        migrate: bool = False,
    ) -> Iterator[Connection]:
        if self.schema_moved is not None and not migrate:
            raise SchemaMoved(self.schema_moved)
        if not wait and not self.embedded:
            raise WouldWait("a PostgreSQL write waits for the network")
        if not self._write_lock.acquire(blocking=wait):
            raise WouldWait("another write of this process is running")
        try:
            mode = "migrate" if migrate else "write" if wait else "write_now"
            deferring = defer and not self.embedded
            connection, transaction = self._begun_writer(mode, bump, deferring, last_seen)
            committing = False
            try:
                with transaction:
                    try:
                        yield connection
                        committing = True
                        send_deferred(connection, commit=True)
                    finally:
                        stop_deferring(connection)
            except BaseException as error:
                connection.close()
                # Lost before COMMIT went out, the transaction died with its backend.
                self._raise_if_lost(error, "; a COMMIT sent may have taken effect" if committing
                                    else "; nothing was written")
                raise
            self._writer = connection
        finally:
            self._write_lock.release()

    def _begun_writer(
        self, mode: str, bump: bool, deferring: bool, last_seen: int | None
    ) -> tuple[Connection, RootTransaction]:
        """The writer connection, its write transaction begun (``_start``). PostgreSQL: one
        that this first round trip finds lost (its server closed it unseen by the polls of
        ``_kept_writer`` and the pool, or as it went out) is replaced, once: nothing but
        BEGIN, the lock and the generation was sent on it, none of it committed."""
        retry = not self.embedded
        while True:
            connection = self._kept_writer() or self._connect_writer()
            try:
                transaction = self._begin(connection, mode)
                if deferring:
                    defer_writes(connection)
                _start(connection, bump, last_seen if deferring else None)
                if mode != "migrate" and (self.embedded or self._due()):
                    # A process works on for hours (``fairpool run``, a step holding): a
                    # newer fairpool may have migrated the store meanwhile, and rows written
                    # the old way would be read the new way. SQLite's check costs 1 µs; on
                    # PostgreSQL round trips, so at most once a second (a server's tick
                    # checks too; its busy writes, sent from the event loop, do not).
                    self.schema_moved = _moved(
                        _sqlite_revision(connection) if self.embedded
                        else _current_revision(connection)
                    ) or self._replaced()
                    if self.schema_moved is not None:
                        raise SchemaMoved(self.schema_moved)
                return connection, transaction
            except BaseException as error:
                stop_deferring(connection)  # else its pooled connection would defer next time
                connection.close()
                if retry and _lost(error):
                    retry = False
                    continue
                self._raise_if_lost(error, "; nothing was written")
                if self.embedded and isinstance(error, OperationalError) and _busy(error):
                    raise DatabaseLocked(
                        f"the database {self.where} stayed locked by another process for "
                        f"{LOCK_TIMEOUT_MS / 1000:g} s (a long write, or many writing at once)",
                        error.orig,
                    ) from error
                raise

    def _due(self) -> bool:
        """Whether a PostgreSQL write should check the schema's revision: not in the last
        ``SCHEMA_CHECK_SECONDS``."""
        now = time.monotonic()
        if now - self._schema_checked < SCHEMA_CHECK_SECONDS:
            return False
        self._schema_checked = now
        return True

    def _kept_writer(self) -> Connection | None:
        """The writer connection the last write kept, unless its server closed it since."""
        connection, self._writer = self._writer, None
        if connection is None or self.embedded:
            return connection
        driver: Any = connection.connection.driver_connection
        if not closed_while_idle(driver.pgconn):
            return connection
        connection.invalidate()
        connection.close()
        return None

    def _connect_writer(self) -> Connection:
        connection = self._connect()
        if not self.embedded:  # see _opening
            connection.execution_options(isolation_level="AUTOCOMMIT")
        elif self._checkpointer is not None:
            _NO_AUTOCHECKPOINT.execute(connection)
        return connection

    def checkpoint_apart(self, every: float = CHECKPOINT_SECONDS) -> None:
        """SQLite: from now on the writes leave the WAL alone, and a thread of this
        database copies it into the file (``checkpoint``) every ``every`` seconds, until
        ``checkpoint_with_writes`` or ``close``. For a server, whose writes run on its event
        loop: by default the commit that takes the WAL over 1,000 pages checkpoints it, and
        stalls the loop for milliseconds (about one commit in 60 under load); the checkpoint
        of a thread holds the GIL only to start, so the loop goes on meanwhile. Nothing on
        PostgreSQL."""
        if not self.embedded or self._checkpointer is not None:
            return
        self._stop_checkpoints.clear()
        thread = threading.Thread(
            target=self._checkpoint_every, args=(every,), name="fairpool-checkpoint", daemon=True
        )
        with self._write_lock:  # the writer connection opened from now on does not
            self._checkpointer = thread
            self._drop_writer()
        thread.start()

    def checkpoint_with_writes(self) -> None:
        """Stop ``checkpoint_apart``'s thread, after one last checkpoint; the writes
        checkpoint again (SQLite's default)."""
        thread = self._checkpointer
        if thread is None:
            return
        self._stop_checkpoints.set()
        thread.join()
        with self._write_lock:
            self._checkpointer = None
            self._drop_writer()

    def _drop_writer(self) -> None:
        """Close the writer connection kept between writes (under the write lock)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def checkpoint(self) -> None:
        """SQLite: copy what the WAL holds into the database file, as far as no reader still
        needs it, so that the next write starts the WAL over.

        SQLite starts the WAL over only at a write that begins with all of it copied. A copy
        takes what the WAL held when it began, and under steady writes more has come by its
        end: the WAL grew without end (650 MB in the HTTP benchmark's 10 s, every commit
        writing into new blocks of the file, which the kernel zeroes first). So a second
        copy runs with this process's writes held back (they wait, or run on a thread): it
        takes only what they added during the first, in milliseconds. Neither waits for
        another process or a reader (PASSIVE)."""
        with self._engine.connect() as connection:
            dbapi_connection: Any = connection.connection.driver_connection
            self._copy_wal(dbapi_connection)
            with self._write_lock:
                self._copy_wal(dbapi_connection)

    @staticmethod
    def _copy_wal(dbapi_connection: Any) -> None:
        dbapi_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    def _checkpoint_every(self, every: float) -> None:
        while not self._stop_checkpoints.wait(every):
            self._checkpoint_logged()
        self._checkpoint_logged()

    def _checkpoint_logged(self) -> None:
        try:
            self.checkpoint()
        except Exception:  # tried again at the next one; the WAL only grows meanwhile
            log.exception("WAL checkpoint failed")

    @staticmethod
    def _begin(connection: Connection, mode: str) -> RootTransaction:
        """BEGIN a transaction of ``mode`` (``_MODE``), told to the connection only when it
        changes. A write that must not wait raises ``WouldWait`` if another process writes."""
        if connection.get_execution_options().get(_MODE) != mode:
            connection.execution_options(**{_MODE: mode})
        try:
            return connection.begin()
        except OperationalError as error:
            if _busy(error) and mode == "write_now":
                raise WouldWait("another process is writing") from error
            raise

    @contextmanager
    def read(self, wait: bool = True, statement: bool = False) -> Iterator[Connection]:
        """One read-only transaction on a consistent snapshot.

        Without ``wait`` (embedded databases only; for an event loop), ``WouldWait`` is
        raised instead of waiting: for its connection, in use by another such read, or for
        the database (SQLite busy, which a WAL reader rarely is: a WAL being recovered,
        another process in exclusive locking mode). The block may then have run in part:
        it must only read.

        ``statement``: the block runs one statement, which is a consistent snapshot by
        itself. On PostgreSQL it then runs outside a transaction, in autocommit mode: one
        round trip where BEGIN and COMMIT made three (a long-poll's status check, 250 → 110
        µs of CPU in process). Nothing then refuses a write: the block must only read."""
        if wait and self.embedded:
            with self._connect() as connection:
                connection.execution_options(**{_MODE: "read"})  # for the begin hook
                with connection.begin():
                    yield connection
            return
        if wait:
            try:
                with self._postgresql_reader(statement) as connection:
                    yield connection
                    if not statement:
                        try:
                            connection.commit()
                        except DBAPIError as error:
                            if not _lost(error):
                                raise  # lost: the snapshot was read whole, its answer stands
            except BaseException as error:
                self._raise_if_lost(error)
                raise
            return
        if not self.embedded:
            raise WouldWait("a PostgreSQL read waits for the network")
        if not self._reader_now_lock.acquire(blocking=False):
            raise WouldWait("the connection of reads that must not wait is in use")
        try:
            connection = self._reader_now or self._engine.connect()
            self._reader_now = None
            try:
                with self._begin(connection, "read_now"):
                    yield connection
            except DBAPIError as error:  # the connection's: drop it, in case it is broken
                connection.close()
                if isinstance(error, OperationalError) and _busy(error):
                    raise WouldWait("another process holds the database") from error
                raise
            except BaseException:  # the block's (an unknown id): rolled back, kept
                self._reader_now = connection
                raise
            self._reader_now = connection
        finally:
            self._reader_now_lock.release()

    def _postgresql_reader(self, statement: bool) -> Connection:
        """A pooled connection for reads, in autocommit mode; unless ``statement``, in a
        REPEATABLE READ, READ ONLY transaction begun here. That BEGIN is the round trip
        psycopg made before the block's first statement; sent before the block, it finds a
        connection lost unseen by the pool's poll (closed as it went out, say) while the
        block can still be given another: it is, once."""
        retry = True
        while True:
            connection = self._connect()
            connection.execution_options(isolation_level="AUTOCOMMIT")
            if statement:
                return connection
            connection.begin()
            try:
                _BEGIN_REPEATABLE_READ.execute(connection)
            except BaseException as error:
                connection.close()
                if retry and _lost(error):
                    retry = False
                    continue
                raise
            return connection

    def _connect(self) -> Connection:
        """A pooled connection. PostgreSQL: one its server closed while it sat in the pool
        is replaced first (``_configure_postgresql``); none to be made is
        ``DatabaseUnreachable``."""
        try:
            return self._engine.connect()
        except DBAPIError as error:
            if self.embedded:
                raise
            raise DatabaseUnreachable(
                f"cannot reach the database {self.where}: {_reason(error.orig)}", error.orig
            ) from error

    def _raise_if_lost(self, error: BaseException, outcome: str = "") -> None:
        """PostgreSQL: ``DatabaseUnreachable`` from ``error`` if it is the loss of the
        connection, with ``outcome`` (what became of the transaction) said; else nothing."""
        if self.embedded or not _lost(error):
            return
        assert isinstance(error, DBAPIError)
        raise DatabaseUnreachable(
            f"lost the connection to the database {self.where}: {_reason(error.orig)}{outcome}",
            error.orig,
        ) from error

    def _use_wal(self) -> None:
        """SQLite's WAL, which the file keeps: readers and the writer do not block each
        other. Switched to once the file is known to be a store or new, so that a file refused
        is left as it was (another program's, switched on connecting, stayed in WAL)."""
        raw = self._engine.raw_connection()
        try:
            cursor = raw.cursor()
            _retry_while_locked(cursor.execute, "PRAGMA journal_mode = WAL")
            cursor.close()
        finally:
            raw.close()

    def schema_problem(self) -> str | None:
        """Why the database no longer holds the schema this process works with, or None
        (``/readyz``, a server's tick): one dropped and made again, or upgraded by a newer
        fairpool since this process opened it. From then on this process writes nothing
        (``schema_moved``): a server on the old schema went on writing rows the newer code
        reads otherwise (helper-80)."""
        with self.read() as connection:
            revision = _current_revision(connection)
        self.schema_moved = _moved(revision) or self._replaced()
        return self.schema_moved

    def _replaced(self) -> str | None:
        """Why the SQLite file this process opened is no longer the store at its path, or
        None. Its connections write on into a file deleted (or moved away), unseen by every
        other process, while a store made anew at the path hands the same units out again
        (helper-88). A ``stat``: ~1 µs."""
        if self._file is None:
            return None
        path, device, inode = self._file
        try:
            found = os.stat(path)
        except FileNotFoundError:
            found = None
        if found is not None and (found.st_dev, found.st_ino) == (device, inode):
            return None
        return (f"the database file {path} was deleted or replaced since this process opened "
                "it: what this process holds there is lost to every other one")

    def _upgrade(self) -> None:
        with self.read() as connection:
            revision = _current_revision(connection)
            refused = _refusal(connection, revision)
        if refused is not None:
            raise Unreachable(f"cannot open the database {self.where}: {refused}")
        if self.embedded:
            self._use_wal()
        if revision == SCHEMA_HEAD:
            return
        # Under the write lock (PostgreSQL: the advisory lock; its DDL is transactional too),
        # so that of several processes opening a new database at once one makes it and the
        # others then find it at head. No writer runs against a half-migrated schema.
        try:
            with self.migrating() as connection:
                upgraded = _to_head(connection)
        except (DatabaseLocked, OperationalError) as error:
            if isinstance(error, OperationalError) and not _lock_timed_out(error):
                raise
            # The lock's own words named no migration: the likeliest holder is another
            # process upgrading the same store, which takes minutes on a large one.
            raise Unreachable(
                f"cannot open the database {self.where}: its schema is at revision "
                f"{revision or 'none'} and this fairpool's at {SCHEMA_HEAD}, and another "
                f"process held the write lock for {LOCK_TIMEOUT_MS / 1000:g} s as this one "
                "waited to upgrade it (upgrading it too, most likely: a large store takes a "
                "while): try again once it is done"
            ) from None
        if upgraded is not None:  # said: an operator upgrading a shared store saw nothing
            log.warning("Upgraded the store %s from schema revision %s to %s", self.where,
                        upgraded, SCHEMA_HEAD)


def _to_head(connection: Connection) -> str | None:
    """Bring the schema to head, its revision read again under the lock (another process
    may have brought it there meanwhile); the revision it upgraded from, if it did. A store
    an older fairpool left is migrated; a new database is made from the metadata and stamped
    at head, as Alembic advises: 16 ms on SQLite, where running every migration took 160-190
    ms (most rebuild a table), for every new store a command, a server or a test opens. The
    tests check that both ways make the same store."""
    from alembic import command

    config = migration_config(connection)
    revision = _current_revision(connection)
    if revision is None:  # new: ``_refusal`` saw no table
        from fairpool.store.schema import metadata

        metadata.create_all(connection, checkfirst=False)  # a table made meanwhile: refused
        command.stamp(config, "head")
        return None
    if revision == SCHEMA_HEAD:
        return None
    command.upgrade(config, "head")
    return revision


#: The driver fairpool installs, by backend.
_DRIVERS = {"sqlite": "pysqlite", "postgresql": "psycopg"}


def _lost(error: BaseException) -> bool:
    """The connection itself failed (its backend terminated, a restart, the network), not a
    statement on it: SQLAlchemy invalidated it."""
    return isinstance(error, DBAPIError) and error.connection_invalidated


def _reason(orig: BaseException | None) -> str:
    """The driver's error in its first line (psycopg's next ones guess at causes)."""
    return next(iter(str(orig).strip().splitlines()), type(orig).__name__)


def _lock_timed_out(error: OperationalError) -> bool:
    """PostgreSQL gave up waiting for a lock (``lock_timeout``: 55P03, lock_not_available)."""
    return getattr(error.orig, "sqlstate", None) == "55P03"


def _busy(error: OperationalError) -> bool:
    """SQLite answered "database is locked" at once (no busy timeout)."""
    return getattr(error.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY


def _unwritable_folder(database: str | None) -> str:
    """Why SQLite said "unable to open database file" of a file that is there and readable,
    or nothing: in WAL mode even a read makes ``-shm`` beside it (helper-88: a read-only
    home refused every read with those words alone)."""
    if database in (None, "", ":memory:"):
        return ""
    folder = os.path.dirname(os.path.abspath(database))
    if os.access(folder, os.W_OK):
        return ""
    return (f" (its folder {folder} is not writable: SQLite makes its -wal and -shm files "
            "there, even to read)")


def _file_identity(database: str | None) -> tuple[str, int, int] | None:
    """A SQLite file's absolute path, device and inode (None: in memory)."""
    if database in (None, "", ":memory:") or database.startswith("file:"):
        return None
    path = os.path.abspath(database)
    found = os.stat(path)
    return path, found.st_dev, found.st_ino


def _moved(revision: str | None) -> str | None:
    """Why a database at schema ``revision`` is no longer this process's, or None."""
    if revision is None:
        return ("the database holds no fairpool schema any more (alembic_version is missing "
                "or empty): was it dropped and made again? restart to create it")
    if revision != SCHEMA_HEAD:
        return (f"the database's schema is at revision {revision}, and this process works "
                f"with revision {SCHEMA_HEAD}: run the fairpool that migrated it")
    return None


def _sqlite_revision(connection: Connection) -> str | None:
    """``_current_revision`` in a write transaction of SQLite, on its driver's connection:
    1 µs where SQLAlchemy's statement took 13."""
    raw: sqlite3.Connection = connection.connection.driver_connection  # type: ignore[assignment]
    try:
        row = raw.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError:  # the table is gone
        return None
    return None if row is None else str(row[0])


def _current_revision(connection: Connection) -> str | None:
    """The database's schema revision, None before the first migration."""
    if not connection.dialect.has_table(connection, "alembic_version"):
        return None
    revision: str | None = connection.execute(
        text("SELECT version_num FROM alembic_version")
    ).scalar()
    return revision


def _refusal(connection: Connection, revision: str | None) -> str | None:
    """Why the database is neither a store this fairpool works with nor a new one, or None.

    A newer fairpool's store is refused, as are fairpool's tables without a revision (a
    damaged store, whose first migration would fail on "table component already exists").
    Anything else holding tables is another program's database, a mistyped URL most likely:
    migrating it would put fairpool's tables among that program's (its own Alembic revision
    was taken for a newer fairpool's)."""
    if revision == SCHEMA_HEAD or (revision is not None and _known_revision(connection, revision)):
        return None
    tables = _tables(connection)
    if revision is None and not tables:
        return None  # a new database
    from fairpool.store.schema import metadata

    ours = [name for name in tables if name in metadata.tables]
    if ours and revision is not None:
        return (f"its schema (revision {revision}) is not one this fairpool knows (its newest "
                f"is {SCHEMA_HEAD}): open it with the fairpool that last wrote it, or a newer "
                "one")
    if ours:
        return (f"it holds {counted(len(ours), 'table')} of fairpool's ({_listed(ours)}) but no "
                "schema revision (alembic_version missing or empty): a damaged store, or "
                "another program's database; nothing changed")
    revised = "" if revision is None else f" (and its own schema revision, {revision})"
    return (f"it holds {counted(len(tables), 'table')} of another program ({_listed(tables)})"
            f"{revised} and no fairpool store: is the URL the one meant? fairpool keeps its "
            "store in a database of its own (a new, empty one, or a PostgreSQL schema of its "
            "own, named in the URL's options=-csearch_path=NAME); nothing changed")


def _tables(connection: Connection) -> list[str]:
    """The tables of the connection's own schema (PostgreSQL: ``current_schema()``, not
    every schema on the search path) but ``alembic_version``, sorted."""
    from sqlalchemy import inspect

    own = connection.dialect.default_schema_name
    return sorted(set(inspect(connection).get_table_names(schema=own)) - {"alembic_version"})


def _listed(names: list[str]) -> str:
    return f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"


def _known_revision(connection: Connection, revision: str) -> bool:
    """Whether ``revision`` is one of this fairpool's migrations (a newer one wrote it, else)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migration_config(connection))
    return any(script.revision == revision for script in scripts.walk_revisions())


def _control_sqlite_transactions(engine: Engine) -> None:
    """Emit BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED and comes too late.

    The recipe from SQLAlchemy's pysqlite docs ("Serializable isolation / Savepoints /
    Transactional DDL"): the DBAPI connection is left in autocommit and the "begin" event
    opens the transaction. Read transactions also set query_only, so a stray write in one
    fails at once rather than racing for the lock a write transaction would have held.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in _SQLITE_PRAGMAS:
            _retry_while_locked(cursor.execute, pragma)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(_MODE)
        write = mode in ("write", "write_now", "migrate")
        # The settings stay with the pooled connection: a statement less per transaction
        # when it serves the same kind as before (the common case).
        info = connection.connection.info
        if info.get(_QUERY_ONLY) is not (not write):
            connection.exec_driver_sql(f"PRAGMA query_only = {'OFF' if write else 'ON'}")
            info[_QUERY_ONLY] = not write
        # Off for migrations only (``Database.migrating``); SQLite ignores this pragma inside a
        # transaction, so it is set here, before BEGIN.
        keys = mode != "migrate"
        if info.get(_FOREIGN_KEYS, True) is not keys:
            connection.exec_driver_sql(f"PRAGMA foreign_keys = {'ON' if keys else 'OFF'}")
            info[_FOREIGN_KEYS] = keys
        # SQLite has no "try to lock": a write that must not wait begins with no busy
        # timeout, and BEGIN IMMEDIATE fails at once if another connection writes; a read,
        # its first statement if another process holds the database.
        busy = 0 if mode in ("write_now", "read_now") else LOCK_TIMEOUT_MS
        if info.get(_BUSY, LOCK_TIMEOUT_MS) != busy:
            _BUSY_TIMEOUTS[busy].execute(connection)
            info[_BUSY] = busy
        (_BEGIN_WRITE if write else _BEGIN_READ).execute(connection)


def _retry_while_locked(run: Callable[[str], object], statement: str) -> None:
    """Run ``statement`` again while SQLite answers "database is locked", up to
    LOCK_TIMEOUT_MS.

    Switching a brand-new file to WAL needs an exclusive lock, and SQLite may refuse it at once
    without calling the busy handler when another process is opening the same file.
    """
    deadline = time.monotonic() + LOCK_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            run(statement)
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def connect_defaults(url: URL) -> dict[str, Any]:
    """What a PostgreSQL connection is made with where ``url`` does not say."""
    defaults = {"connect_timeout": CONNECT_TIMEOUT, **TCP_DEFAULTS}
    return {name: value for name, value in defaults.items() if name not in url.query}


def _configure_postgresql(engine: Engine) -> None:
    """Every session waits at most LOCK_TIMEOUT_MS for a lock, as SQLite's busy_timeout.

    Set per session rather than per transaction so that the advisory lock stays the first
    statement of a write transaction.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        cursor.close()
        dbapi_connection.commit()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # Closed by its server while in the pool (a restart, its backend terminated): the
        # pool replaces it, rather than hand it to a read or write that would fail on it.
        if closed_while_idle(dbapi_connection.pgconn):
            raise DisconnectionError("closed by the server while idle in the pool")

    @event.listens_for(engine, "before_cursor_execute")
    def _before_statement(connection: Connection, *_: Any) -> None:
        send_deferred(connection)  # a statement sees the writes queued before it
