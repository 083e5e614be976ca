"""The write path's hot statements, run straight on the DBAPI cursor, and on PostgreSQL sent
together.

SQLAlchemy's execution layer (execution context, events, result wrapping) costs ~35 µs per
statement, where an UPDATE by primary key takes ~3 µs on SQLite's own cursor; a create +
release runs fifteen statements. A ``Direct`` statement is compiled once per dialect by
SQLAlchemy's compiler, with the bind processors of its columns' types, so it writes exactly
the values ``connection.execute`` would (``tests/test_store_direct.py`` checks that rows
written either way are stored alike), and then runs on the transaction's own DBAPI
connection, inside the transaction the ``Connection`` holds.

On PostgreSQL every statement is a network round trip, and under load each one also waits
for the GIL on its way back. So a write transaction may *defer* its writes
(``defer_writes``): an INSERT or UPDATE that needs no answer is queued, and the queue is sent
in one psycopg pipeline (one round trip) when the transaction next needs the database: a
SQLAlchemy statement, a scalar, or its end, where COMMIT goes with it (``send_deferred``). A
queued UPDATE that must change a row checks so in the database (``_checked``), so that a
failed check aborts the transaction before that COMMIT. Which operation a failed deferred
write belongs to is not known when it fails, so it raises ``DeferredWriteFailed``, and the
caller runs the transaction again without deferring to find out.

A transaction may also only *collect* its writes (``defer_writes(collect=True)``), for an
event loop to send them on a connection of its own (``AsyncWriter``) and await the round trip
instead of blocking on it: then a statement that needs the database raises ``WouldWait``
before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.sql.expression import ClauseElement

from fairpool.errors import NotFound, WouldWait

#: Where a connection keeps its queue of deferred writes while it defers them.
_DEFERRED = "fairpool_deferred"
#: Set while it only collects them (see ``defer_writes``).
_COLLECT = "fairpool_collect"

#: What an UPDATE must change, or it fails with NotFound: (what, id), e.g. ("pool", id).
MustChange = tuple[str, str]


class DeferredWriteFailed(Exception):
    """A deferred write failed when the queue was sent (its error is the ``__cause__``); the
    transaction is to be rolled back. Which of its operations caused it is unknown."""


def check_found(rowcount: int, what: str, id_: str) -> None:
    if rowcount == 0:
        raise NotFound.of(what, id_)


def _checked(sql: str) -> str:
    """PostgreSQL: UPDATE ``sql``, failing (division by zero) when it changes no row."""
    return f"WITH changed AS ({sql} RETURNING 1) SELECT 1 / count(*) FROM changed"


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    #: Positional paramstyles (SQLite's ``?``): the parameter names in order; None for named
    #: ones (psycopg's ``%(name)s``).
    order: tuple[str, ...] | None
    processors: Mapping[str, Callable[[Any], Any]]
    #: PostgreSQL UPDATEs: the statement checking in the database that it changed a row.
    checked_sql: str | None = None

    def bind(self, parameters: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        processors = self.processors
        if self.order is not None:
            return [
                processors[name](parameters[name]) if name in processors else parameters[name]
                for name in self.order
            ]
        return {
            name: processors[name](value) if name in processors else value
            for name, value in parameters.items()
        }


@dataclass(frozen=True, slots=True)
class _Write:
    """A bound statement: one execution, or with ``many`` one per row of ``parameters``.
    With ``must_change``, it must change a row: checked on its cursor, or when deferred by
    ``checked_sql`` in the database."""

    sql: str
    parameters: Any
    many: bool = False
    must_change: MustChange | None = None
    checked_sql: str | None = None

    def run(self, cursor: Any, deferred: bool = False) -> None:
        sql = self.deferred_sql() if deferred else self.sql
        if self.many:
            cursor.executemany(sql, self.parameters)
        else:
            cursor.execute(sql, self.parameters)

    def deferred_sql(self) -> str:
        if self.must_change is None:
            return self.sql
        assert self.checked_sql is not None, "only PostgreSQL UPDATEs are deferred"
        return self.checked_sql

    def check(self, cursor: Any) -> None:
        if self.must_change is not None:
            check_found(cursor.rowcount, *self.must_change)


_COMMIT = _Write("COMMIT", None)


def defer_writes(connection: Connection, collect: bool = False) -> None:
    """Queue ``connection``'s writes until ``stop_deferring`` (PostgreSQL only). With
    ``collect``, nothing is sent on ``connection``: the caller takes the queue
    (``take_deferred``), and a statement that needs the database raises ``WouldWait``."""
    assert connection.dialect.name == "postgresql", "deferring pays off only over a network"
    connection.info[_DEFERRED] = []
    if collect:
        connection.info[_COLLECT] = True


def stop_deferring(connection: Connection) -> None:
    """Drop the queue (sent or not: after the commit, or with the rollback)."""
    if connection.invalidated:
        # Lost (e.g. its backend terminated): the queue went with its DBAPI connection, and
        # asking for it would raise PendingRollbackError over the error that says so.
        return
    connection.info.pop(_DEFERRED, None)
    connection.info.pop(_COLLECT, None)


def take_deferred(connection: Connection) -> list[_Write]:
    """The writes ``connection`` collected, COMMIT last: a transaction for ``AsyncWriter``."""
    queue: list[_Write] = connection.info[_DEFERRED]
    writes = [*queue, _COMMIT]
    queue.clear()
    return writes


def closed_while_idle(pgconn: Any) -> bool:
    """Whether the server has closed an idle connection (its backend terminated, a restart,
    an idle timeout) -- told by one poll of its socket, no round trip: an idle connection in
    autocommit mode has nothing to read unless the server said goodbye. A kept writer
    connection is checked before each transaction, so that the first write after such a
    loss does not fail (then a 503) while ``/readyz``, on a fresh connection, says ready. A
    notice would count too: the connection is then only replaced."""
    try:
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
    except Exception:  # no socket any more
        return True
    return bool(readable)


class AsyncWriter:
    """PostgreSQL: an event loop's connection (``connection``, a psycopg ``AsyncConnection``
    in autocommit mode) on which ``send`` sends a transaction's writes (``take_deferred``),
    awaited, in one round trip: one libpq pipeline, each statement prepared once per
    connection and its values sent apart from it, and one Sync at the end.

    Rather than a script of statements with the values quoted into it (one simple query):
    quoting them was ~15 % of the server's CPU per admission, and PostgreSQL parsed and
    planned every statement of every script again. psycopg's own async pipeline would cost
    a turn of the event loop per statement, so this one talks to libpq itself
    (``connection.pgconn``, psycopg's documented low-level interface)."""

    def __init__(self, connection: Any) -> None:
        from psycopg import errors, pq  # only here: SQLite never needs them
        from psycopg.types.json import Json, Jsonb

        self.connection = connection
        connection.pgconn.enter_pipeline_mode()
        self._errors, self._pq, self._json_types = errors, pq, (Json, Jsonb)
        # The statements prepared on it: their SQL (as deferred) to their name and their
        # parameters' names in their numbers' order.
        self._prepared: dict[str, tuple[bytes, tuple[str, ...]]] = {}

    async def send(self, writes: Sequence[_Write], dialect: Dialect) -> None:
        """``writes`` sent and their results awaited; failures as ``send_deferred``'s. After
        one, the connection is to be closed: its transaction is aborted, or its state
        unknown."""
        pgconn = self.connection.pgconn
        for write in writes:
            sql = write.deferred_sql()
            prepared = self._prepared.get(sql)
            if prepared is None:
                numbered, order = _numbered(sql)
                prepared = self._prepared[sql] = (b"fairpool_%d" % len(self._prepared), order)
                pgconn.send_prepare(prepared[0], numbered)
            name, order = prepared
            rows = write.parameters if write.many else [write.parameters or {}]
            for row in rows:
                pgconn.send_query_prepared(
                    name, [_text(row[key], self._json_types) for key in order]
                )
        pgconn.pipeline_sync()
        try:
            failure = await _results(pgconn, self._errors, self._pq)
        except Exception as error:  # the connection failed
            failure = error
        if failure is not None:
            _deferred_failure(as_sqlalchemy(failure, dialect))


async def _results(pgconn: Any, errors: Any, pq: Any) -> Exception | None:
    """Flush the pipeline, then read its results up to its Sync's; the first error, if a
    statement failed (those after it were skipped)."""
    loop = asyncio.get_running_loop()
    fileno = pgconn.socket
    while pgconn.flush():  # more to send: the server's answers are read meanwhile
        if await _ready(loop, fileno, write=True):
            pgconn.consume_input()
    failure: Exception | None = None
    while True:
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:  # between two statements' results
                continue
            status = result.status
            if status == pq.ExecStatus.PIPELINE_SYNC:
                return failure
            if status == pq.ExecStatus.FATAL_ERROR and failure is None:
                sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE) or b""
                message = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b""
                try:
                    kind = errors.lookup(sqlstate.decode())
                except KeyError:
                    kind = errors.DatabaseError
                failure = kind(message.decode(errors="replace"))
        await _ready(loop, fileno, write=False)
        pgconn.consume_input()


async def _ready(loop: asyncio.AbstractEventLoop, fileno: int, write: bool) -> bool:
    """Once ``fileno`` can be read (or, with ``write``, read or written); whether it can be
    read."""
    ready: asyncio.Future[bool] = loop.create_future()

    def settle(readable: bool) -> None:
        if not ready.done():
            ready.set_result(readable)

    loop.add_reader(fileno, settle, True)
    if write:
        loop.add_writer(fileno, settle, False)
    try:
        return await ready
    finally:
        loop.remove_reader(fileno)
        if write:
            loop.remove_writer(fileno)


def _deferred_failure(error: Exception) -> NoReturn:
    """Deferred writes failed with ``error`` (as SQLAlchemy raises it): nothing committed.
    An ``OperationalError`` (the lock's timeout, a lost connection) is raised as is: it is
    the transaction's failure, which running it again would meet again. Anything else is
    some operation's, unknown which: ``DeferredWriteFailed``."""
    if isinstance(error, OperationalError):
        raise error
    raise DeferredWriteFailed(f"a deferred write failed: {error}") from error


def _numbered(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """``sql`` with psycopg's named parameters (``%(name)s``) numbered as libpq's (``$1``),
    and the names in their numbers' order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return re.sub(r"%\((\w+)\)s|%%", number, sql).encode(), tuple(order)


def _text(value: Any, json_types: tuple[type, ...]) -> bytes | None:
    """A value as its column's bind processor left it, in PostgreSQL's text format; JSON
    comes wrapped in one of psycopg's ``json_types``."""
    if value is None:
        return None
    if isinstance(value, str):  # StrEnum members too
        return value.encode()
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, json_types):
        wrapped: Any = value
        return (wrapped.dumps or json.dumps)(wrapped.obj).encode()
    raise TypeError(f"no text format for a {type(value).__name__} value")


def send_deferred(connection: Connection, commit: bool = False) -> None:
    """Send the queued writes, if any, in one round trip, and with ``commit`` COMMIT with
    them (without writes queued, the caller commits). ``DeferredWriteFailed`` if one fails
    (nothing committed), except for ``OperationalError`` (the lock's timeout, a lost
    connection), raised as is: it is the transaction's failure, which running it again would
    meet again."""
    if connection.info.get(_COLLECT):
        raise WouldWait("the transaction needs the database before its end")
    queue: list[_Write] | None = connection.info.get(_DEFERRED)
    if not queue:
        return
    writes = list(queue) + ([_COMMIT] if commit else [])
    queue.clear()
    try:
        _send(connection, writes, deferred=True).close()
    except Exception as error:
        _deferred_failure(error)


def _send(connection: Connection, writes: Sequence[_Write], deferred: bool) -> Any:
    """Run ``writes`` in one pipeline (one round trip); the last one's cursor, its rows
    still to fetch."""
    dbapi_connection: Any = connection.connection.driver_connection
    cursors: list[Any] = []
    first: Exception | None = None
    try:
        with dbapi_connection.pipeline():
            try:
                for write in writes:
                    cursors.append(dbapi_connection.cursor())
                    write.run(cursors[-1], deferred)
            except Exception as error:  # the pipeline's end then finds it aborted
                first = error
    except Exception as error:
        first = first or error
    if first is not None:
        failure = _wrapped(connection, None, first)
        for cursor in cursors:
            cursor.close()
        raise failure from first
    for cursor in cursors[:-1]:
        cursor.close()
    return cursors[-1]


def _wrapped(connection: Connection, sql: str | None, error: Exception) -> Exception:
    """``error`` as SQLAlchemy raises it from ``connection.execute`` (IntegrityError,
    OperationalError, StatementError around a bind processor's error...); a lost connection
    is invalidated. So callers handle one kind of error."""
    dialect = connection.dialect
    invalidated = isinstance(error, dialect.loaded_dbapi.Error) and (
        dialect.is_disconnect(error, connection.connection.driver_connection, None)
        or _ends_the_session(error)
    )
    if invalidated:
        connection.invalidate(error)
    return as_sqlalchemy(error, dialect, sql, invalidated)


def _ends_the_session(error: BaseException | None) -> bool:
    """Whether ``error``, or one it was raised over, is an error the server ends the session
    with (FATAL: its backend terminated, the server shutting down). psycopg may not know the
    connection lost yet: over a FATAL met in a pipeline it raises "cannot exit pipeline mode
    while busy", and the ROLLBACK after it failed in turn, over the error that said why."""
    while error is not None:
        diag = getattr(error, "diag", None)
        if getattr(diag, "severity_nonlocalized", None) in ("FATAL", "PANIC"):
            return True
        error = error.__context__
    return False


def as_sqlalchemy(
    error: Exception, dialect: Dialect, sql: str | None = None, invalidated: bool = False
) -> Exception:
    """``error`` as SQLAlchemy raises it from ``connection.execute``: the driver's as
    ``IntegrityError``, ``OperationalError``...; another, with ``sql``, as a
    ``StatementError``."""
    wrapped: Exception = DBAPIError.instance(
        sql, None, error, dialect.loaded_dbapi.Error, connection_invalidated=invalidated,
        dialect=dialect,
    )
    return wrapped


class Direct:
    """``statement`` run on the DBAPI cursor. An INSERT or UPDATE sets the columns its
    parameters name (column defaults are never needed): it is compiled once per dialect and
    set of parameter names, as ``connection.execute`` compiles it."""

    __slots__ = ("_compiled", "_statement")

    def __init__(self, statement: ClauseElement) -> None:
        self._statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], _Compiled] = {}

    def execute(
        self,
        connection: Connection,
        parameters: Mapping[str, Any] | None = None,
        must_change: MustChange | None = None,
    ) -> None:
        """Run it once (or queue it, while ``connection`` defers writes). With
        ``must_change``, NotFound if it changed no row (or ``DeferredWriteFailed`` later)."""
        self._run(connection, self._bound(connection, parameters or {}, must_change))

    def execute_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run it once per row (or queue that); every row names the same parameters."""
        compiled = self._compiled_for(connection.dialect, tuple(rows[0]))
        bound = [_bind(connection, compiled, row) for row in rows]
        self._run(connection, _Write(compiled.sql, bound, many=True))

    def scalar(
        self,
        connection: Connection,
        parameters: Mapping[str, Any] | None = None,
        preceded_by: Sequence[Direct] = (),
    ) -> Any:
        """Run it once; the first column of its first row (None without rows). The writes
        ``connection`` deferred are sent first. ``preceded_by``: statements without
        parameters run first; on PostgreSQL they and it are sent together, in one round
        trip."""
        send_deferred(connection)
        writes = [first._bound(connection, {}) for first in preceded_by]
        writes.append(self._bound(connection, parameters or {}))
        if connection.dialect.name == "postgresql" and len(writes) > 1:
            cursor = _send(connection, writes, deferred=False)
        else:
            for write in writes[:-1]:
                self._open(connection, write).close()
            cursor = self._open(connection, writes[-1])
        try:
            row = cursor.fetchone()
        finally:
            cursor.close()
        return None if row is None else row[0]

    async def scalar_async(
        self, connection: Any, dialect: Dialect, parameters: Mapping[str, Any]
    ) -> Any:
        """Run it once on ``connection``, a psycopg ``AsyncConnection`` of ``dialect`` in
        autocommit mode, its round trip awaited; the first column of its first row (None
        without rows). It is prepared on the connection; errors are raised as SQLAlchemy
        raises them."""
        compiled = self._compiled_for(dialect, tuple(parameters))
        try:
            cursor = await connection.execute(
                compiled.sql, compiled.bind(parameters), prepare=True
            )
            row = await cursor.fetchone()
        except dialect.loaded_dbapi.Error as error:
            raise as_sqlalchemy(error, dialect, compiled.sql) from error
        return None if row is None else row[0]

    def _run(self, connection: Connection, write: _Write) -> None:
        queue: list[_Write] | None = connection.info.get(_DEFERRED)
        if queue is not None:
            queue.append(write)
            return
        cursor = self._open(connection, write)
        try:
            write.check(cursor)
        finally:
            cursor.close()

    @staticmethod
    def _open(connection: Connection, write: _Write) -> Any:
        """A cursor that ran ``write``."""
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            write.run(cursor)
        except Exception as error:
            cursor.close()
            raise _wrapped(connection, write.sql, error) from error
        return cursor

    def _bound(
        self,
        connection: Connection,
        parameters: Mapping[str, Any],
        must_change: MustChange | None = None,
    ) -> _Write:
        compiled = self._compiled_for(connection.dialect, tuple(parameters))
        bound = _bind(connection, compiled, parameters)
        return _Write(compiled.sql, bound, must_change=must_change,
                      checked_sql=compiled.checked_sql)

    def _compiled_for(self, dialect: Dialect, keys: tuple[str, ...]) -> _Compiled:
        compiled = self._compiled.get((dialect.name, keys))
        if compiled is None:
            compiled = self._compiled[dialect.name, keys] = _compile(
                self._statement, dialect, keys
            )
        return compiled


def _bind(connection: Connection, compiled: _Compiled, parameters: Mapping[str, Any]) -> Any:
    try:
        return compiled.bind(parameters)
    except Exception as error:  # a bind processor refused a value
        raise _wrapped(connection, compiled.sql, error) from error


def _compile(statement: ClauseElement, dialect: Dialect, keys: tuple[str, ...]) -> _Compiled:
    compiled: Any = statement.compile(dialect=dialect, column_keys=list(keys))
    unknown = set(compiled.binds) - set(keys)
    if unknown:  # a default or a literal SQLAlchemy would have filled in at execution
        raise ValueError(f"parameters missing: {', '.join(sorted(unknown))}")
    processors = {}
    for name, bind in compiled.binds.items():
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            processors[name] = processor
    order = tuple(compiled.positiontup) if compiled.positional else None
    sql: str = compiled.string
    checked = dialect.name == "postgresql" and sql.lstrip().upper().startswith("UPDATE")
    return _Compiled(sql, order, processors, _checked(sql) if checked else None)
