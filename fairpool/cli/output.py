"""Printing, the way ZenML's ``cli_utils`` does it: data on stdout, everything else on stderr.

Tables are rich ``Table``s with upper-cased headers; lists end with ZenML's page line. JSON and
YAML go out as plain text (no rich markup, no wrapping) so that they always parse.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

import click

from fairpool.engine.amounts import amount_text
from fairpool.errors import counted
from fairpool.paging import MAX_OFFSET, MAX_PAGE_SIZE, Page, page_dict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

#: Output formats of every read command (ZenML also has tsv and csv; not needed here).
OUTPUT_FORMATS = ("table", "json", "yaml")

#: Columns a table keeps on one line while others can wrap.
UNBROKEN_COLUMNS = frozenset({"id", "element"})

#: Columns holding ISO timestamps; tables show them to the second, like ZenML.
TIME_COLUMNS = frozenset(
    {"created", "updated", "allocated_at", "released_at", "lease_expires_at", "at"}
)

Row = dict[str, Any]


# rich is imported on first use: json/yaml output and plain messages never pay for it.


@cache
def out() -> Console:
    """Data: tables and the messages that stand in for them."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


@cache
def err() -> Console:
    """Progress on stderr, never mixed into data."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


#: What a table shows escaped (``\x1b``): controls but newline and tab, which rich lays out,
#: and the bidirectional overrides, which reorder what follows them. Printed raw, text another
#: user wrote (a label, a description, a name stored before names had to print) could
#: recolour, move or rewrite what the reader's terminal shows.
_UNSHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown(value: str) -> str:
    """``value`` with every ``_UNSHOWN`` character written as its Python escape."""
    return _UNSHOWN.sub(lambda found: found.group().encode("unicode_escape").decode(), value)


def _text(value: str) -> Any:
    """A rich ``Text``: printed as it is, never read as markup (``[bold]`` in a name)."""
    from rich.text import Text

    return Text(shown(value))


@contextmanager
def spinner(message: str) -> Iterator[Callable[[str], None]]:
    """ZenML's ``console.status(...)``: a spinner on stderr, only when it is a terminal.
    Gives a function that changes its message (progress)."""
    if not sys.stderr.isatty():
        yield lambda message: None
        return
    with err().status(message) as status:
        yield lambda message: status.update(_text(message))


def output_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``-o/--output table|json|yaml``; the default comes from ``FAIRPOOL_DEFAULT_OUTPUT``
    (ZenML: ``ZENML_DEFAULT_OUTPUT``), else ``table``."""
    return click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(OUTPUT_FORMATS, case_sensitive=False),
        default="table",
        show_default=True,
        envvar="FAIRPOOL_DEFAULT_OUTPUT",
        help="Output format.",
    )(func)


def page_options(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--size N --page K`` of a list of ``what`` (plural), oldest first; the command gets
    ``page``: ``(limit, offset)`` to ask for (``limit`` None: all, on one page)."""

    def paged(size: int | None, page: int) -> tuple[int | None, int]:
        if size is None:
            if page > 1:
                raise click.UsageError("--page needs --size.")
            return None, 0
        offset = (page - 1) * size
        if offset > MAX_OFFSET:  # else the service would name an offset nobody typed
            raise click.BadParameter(f"{page} is past any list's last page.",
                                     param_hint="'--page'")
        return size, offset

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        def command(size: int | None, **options: Any) -> Any:
            options["page"] = paged(size, options["page"])
            return func(**options)

        command = functools.update_wrapper(command, func)
        command = click.option(
            "--page", type=click.IntRange(1), default=1, show_default=True,
            help=f"Which page of --size {what}, oldest first.",
        )(command)
        return click.option(
            "--size", type=click.IntRange(1, MAX_PAGE_SIZE), default=None,
            help=f"{what.capitalize()} per page (default: all, on one page).",
        )(command)

    return decorate


def declare(message: str) -> None:
    """An informational line (stderr), like ``cli_utils.declare``. One stderr cannot take
    (closed: ``2>&1 | true``) is dropped: `fairpool run` holding units must not end for it."""
    try:
        click.echo(message, err=True)
    except OSError:
        pass


class _Declared(logging.Handler):
    """fairpool's own log lines (a wait riding out an outage, a store upgraded) as a
    command's other lines are: a warning as ``Warning: ...``, news as it is, on stderr.
    Python's last resort printed warnings bare and dropped the rest (the outage's end). stderr
    is looked up at each line (click's test runner replaces it)."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.capitalize()}: "
        declare(level + record.getMessage())


def declare_logged() -> None:
    """Have fairpool's log lines declared (``_Declared``), once."""
    logger = logging.getLogger("fairpool")
    if not any(isinstance(handler, _Declared) for handler in logger.handlers):
        logger.addHandler(_Declared())
        logger.setLevel(logging.INFO)


def dump(data: Any, output: str) -> None:
    """Write JSON-ready ``data`` to stdout as JSON or YAML."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_yaml(data), nl=False)


def _yaml(data: Any) -> str:
    import yaml

    # A mapping shared by two fields (an operation's first tree and the operation itself) would
    # be written once and aliased (&id001 / *id001); the remote CLI, reading JSON, has copies.
    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True)


def format_value(value: Any) -> str:
    """One table cell: mappings as ``key value, ...``, lists comma-joined, None as empty (in a
    mapping, as ``-``: ``resource_flow -``, not ``resource_flow ,``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {_entry(key, item) or '-'}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(format_value(item) for item in value)
    return str(value)


def _entry(key: str, value: Any) -> str:
    """A mapping's value in a cell: a tree's memory in the unit it was likely written in
    (JSON and YAML say bytes)."""
    return amount_text(key, value) if key == "memory" and value is not None else format_value(
        value)


def format_cell(column: str, value: Any) -> str:
    """``format_value``, with ISO timestamps cut to the second (they are UTC)."""
    if column in TIME_COLUMNS and isinstance(value, str):
        try:
            return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            return value
    return format_value(value)


def header(column: str) -> str:
    """ZenML's header style: ``queue_length`` -> ``QUEUE LENGTH``."""
    return column.replace("_", " ").upper()


def _table(
    rows: Sequence[Row], columns: Sequence[str], *, title: str | None = None
) -> Table:
    from rich.table import Table

    result = Table(title=None if title is None else _text(title), title_justify="left",
                   show_lines=False)
    cells = [[format_cell(column, row.get(column)) for column in columns] for row in rows]
    for index, column in enumerate(columns):
        # Ids (and a tree's elements) are copied into the next command: they never break.
        result.add_column(header(column), overflow="fold", no_wrap=column in UNBROKEN_COLUMNS,
                          min_width=_widest_word([header(column), *(row[index] for row in cells)]))
    for row in cells:
        result.add_row(*map(_text, row))
    return result


#: Columns are at least as wide as their longest word, up to this (an id's length).
_LONGEST_WORD = 36


def _widest_word(texts: Iterable[str]) -> int:
    """A column's least width: lines break between words, never inside one (squeezed,
    "physical" became "phy/sic/al"); a word past ``_LONGEST_WORD`` folds."""
    return min(max((len(word) for text in texts for word in text.split()), default=1),
               _LONGEST_WORD)
#: A width no table reaches: to measure one as it would be with all the room it wants.
_UNBOUNDED = 1_000_000


def print_table(
    rows: Sequence[Row], columns: Sequence[str], *, title: str | None = None
) -> None:
    """A table of ``rows`` (``_print_whole``); where the width is too narrow for its
    columns' words, each row as a record of its own, as psql's expanded display does."""

    def records() -> None:
        if title is not None:
            out().print(_text(title))
        for row in rows:
            out().print(_record(row, columns))

    _print_whole(_table(rows, columns, title=title), records)


def _print_whole(table: Table, narrow: Callable[[], None]) -> None:
    """``table`` printed whole: to a pipe or a file at its natural width (a line per row,
    for grep; rich would wrap it at 80 columns), unless ``COLUMNS`` says a width; where that
    is too narrow for its columns' words, ``narrow()`` instead, breaking none."""
    from rich.measure import Measurement

    console = out()
    measured = Measurement.get(console, console.options.update_width(_UNBOUNDED), table)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        from rich.console import Console

        # print(width=) only narrows: a console of that width for this table alone.
        wide = max(console.width, measured.maximum)
        Console(file=console.file, width=wide, highlight=False, soft_wrap=False).print(table)
    elif measured.minimum <= console.width:
        console.print(table)
    else:
        narrow()


def _record(row: Row, columns: Sequence[str]) -> Table:
    """One row of a table as a record: a line per column, its name then its value."""
    from rich.table import Table

    values = [format_cell(column, row.get(column)) for column in columns]
    result = Table(show_header=False)
    result.add_column(no_wrap=True)
    result.add_column(overflow="fold", min_width=_widest_word(values))
    for column, value in zip(columns, values, strict=True):
        result.add_row(_text(header(column)), _text(value))
    return result


def print_list(
    rows: Sequence[Row],
    columns: Sequence[str],
    output: str,
    *,
    empty_message: str,
    row_formatter: Callable[[Row], Row] | None = None,
    total: int | None = None,
    size: int | None = None,
    offset: int = 0,
    cursor: str | None = None,
) -> None:
    """A list command's result: a page of items (json/yaml), or a table plus ZenML's footer.
    ``total``, ``size``, ``offset`` and ``cursor`` (the next page's): ``rows`` are one page
    of ``total``; else all."""
    shape = page_dict(rows, total, size, offset, cursor)
    if output != "table":
        dump(shape, output)
        return
    pagination = shape["pagination"]
    if not rows:
        out().print(_text(empty_message if not pagination["total"] else
                          f"Page ({pagination['index']}/{pagination['total_pages']}) is empty: "
                          f"{counted(pagination['total'], 'item')} found for the applied "
                          "filters."))
        return
    shown = [row_formatter(row) for row in rows] if row_formatter else list(rows)
    print_table(shown, columns)
    out().print(_text(
        f"Page ({pagination['index']}/{pagination['total_pages']}), "
        f"{counted(pagination['total'], 'item')} found for the applied filters."
    ))


def print_page(
    found: Page[Any], columns: Sequence[str], output: str, *, empty_message: str,
    row_formatter: Callable[[Row], Row] | None = None,
) -> None:
    """``print_list`` of a page a list command asked for (``page_options``)."""
    print_list(
        [item.as_dict() for item in found.items], columns, output, empty_message=empty_message,
        row_formatter=row_formatter, total=found.total, size=found.limit, offset=found.offset,
        cursor=found.next,
    )


def print_properties(title: str, properties: Sequence[tuple[str, Any]]) -> None:
    """A key/value table, like ``cli_utils.print_pydantic_model``, printed whole as a table
    of rows is (``_print_whole``); too narrow for its words, a line per property, which the
    terminal wraps (an id folded inside a cell could no longer be copied)."""
    from rich.table import Table

    values = [(header(key), format_cell(key, value)) for key, value in properties]
    result = Table(title=_text(title), title_justify="left")
    # rich measures a no_wrap column by its longest word, yet prints it whole.
    result.add_column("PROPERTY", no_wrap=True, min_width=max(len(name) for name, _ in values))
    result.add_column("VALUE", overflow="fold", min_width=_widest_word(v for _, v in values))
    for name, value in values:
        result.add_row(_text(name), _text(value))

    def lines() -> None:
        out().print(_text(title))
        for name, value in values:
            out().print(_text(f"{name}: {value}"), soft_wrap=True)

    _print_whole(result, lines)


def print_section(
    title: str, rows: Sequence[Row], columns: Sequence[str], *, empty_message: str
) -> None:
    """A titled sub-table in a describe view; a one-line note when there is nothing to show."""
    if rows:
        print_table(rows, columns, title=title)
    else:
        out().print(_text(f"{title}: {empty_message}"))
