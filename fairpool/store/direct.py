"""The write path's hot statements, run straight on the DBAPI cursor.

SQLAlchemy's execution layer (execution context, events, result wrapping) costs ~35 µs per
statement, where an UPDATE by primary key takes ~3 µs on SQLite's own cursor; a create +
release runs fifteen statements. A ``Direct`` statement is compiled once per dialect by
SQLAlchemy's compiler, with the bind processors of its columns' types, so it writes exactly
the values ``connection.execute`` would (``tests/test_store_direct.py`` checks that rows
written either way are stored alike), and then runs on the transaction's own DBAPI
connection, inside the transaction the ``Connection`` holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import ClauseElement


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    #: Positional paramstyles (SQLite's ``?``): the parameter names in order; None for named
    #: ones (psycopg's ``%(name)s``).
    order: tuple[str, ...] | None
    processors: Mapping[str, Callable[[Any], Any]]

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


_Runner = Callable[[Any, _Compiled, Any], Any]


def _execute(cursor: Any, compiled: _Compiled, parameters: Mapping[str, Any]) -> int:
    cursor.execute(compiled.sql, compiled.bind(parameters))
    rowcount: int = cursor.rowcount
    return rowcount


def _execute_many(cursor: Any, compiled: _Compiled, rows: Sequence[Mapping[str, Any]]) -> None:
    cursor.executemany(compiled.sql, [compiled.bind(row) for row in rows])


def _scalar(cursor: Any, compiled: _Compiled, parameters: Mapping[str, Any]) -> Any:
    cursor.execute(compiled.sql, compiled.bind(parameters))
    row = cursor.fetchone()
    return None if row is None else row[0]


class Direct:
    """``statement`` run on the DBAPI cursor. An INSERT or UPDATE sets the columns its
    parameters name (column defaults are never needed): it is compiled once per dialect and
    set of parameter names, as ``connection.execute`` compiles it."""

    __slots__ = ("_compiled", "_statement")

    def __init__(self, statement: ClauseElement) -> None:
        self._statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], _Compiled] = {}

    def execute(self, connection: Connection, parameters: Mapping[str, Any] | None = None) -> int:
        """Run it once; the number of rows it changed."""
        parameters = parameters or {}
        rowcount: int = self._run(connection, tuple(parameters), parameters, _execute)
        return rowcount

    def execute_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run it once per row; every row names the same parameters."""
        self._run(connection, tuple(rows[0]), rows, _execute_many)

    def scalar(self, connection: Connection, parameters: Mapping[str, Any] | None = None) -> Any:
        """Run it once; the first column of its first row (None without rows)."""
        parameters = parameters or {}
        return self._run(connection, tuple(parameters), parameters, _scalar)

    def _run(
        self, connection: Connection, keys: tuple[str, ...], parameters: Any, run: _Runner
    ) -> Any:
        dialect = connection.dialect
        compiled = self._compiled.get((dialect.name, keys))
        if compiled is None:
            compiled = self._compiled[dialect.name, keys] = self._compile(dialect, keys)
        dbapi_connection = connection.connection.driver_connection
        cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            return run(cursor, compiled, parameters)
        except Exception as error:
            # Raised as SQLAlchemy raises it from ``connection.execute`` (IntegrityError,
            # OperationalError, StatementError around a bind processor's error...), and a
            # lost connection is invalidated, so that callers handle one kind of error.
            base = dialect.loaded_dbapi.Error
            invalidated = isinstance(error, base) and dialect.is_disconnect(
                error, dbapi_connection, cursor
            )
            if invalidated:
                connection.invalidate(error)
            raise DBAPIError.instance(
                compiled.sql, None, error, base, connection_invalidated=invalidated,
                dialect=dialect,
            ) from error
        finally:
            cursor.close()

    def _compile(self, dialect: Dialect, keys: tuple[str, ...]) -> _Compiled:
        compiled: Any = self._statement.compile(dialect=dialect, column_keys=list(keys))
        unknown = set(compiled.binds) - set(keys)
        if unknown:  # a default or a literal SQLAlchemy would have filled in at execution
            raise ValueError(f"parameters missing: {', '.join(sorted(unknown))}")
        processors = {}
        for name, bind in compiled.binds.items():
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors[name] = processor
        order = tuple(compiled.positiontup) if compiled.positional else None
        return _Compiled(compiled.string, order, processors)
