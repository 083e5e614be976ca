"""The CLI's standard streams as a Unix tool expects them: closed ones, ASCII terminals,
``COLUMNS`` that names no width. Set once, before click parses anything (``main``)."""

from __future__ import annotations

import errno
import io
import os
import sys


class Closed(io.TextIOBase):
    """A standard stream the command was started without (``>&-``, ``<&-``): Python sets it
    to None, and click and rich then dropped what was written without a word (exit 0), and
    a read failed with an ``AttributeError``. Reading or writing one is an ``OSError``, which
    the CLI says in one line; a prompt reads no answer."""

    encoding = "utf-8"

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def buffer(self) -> Closed:  # read as bytes (``-f -``) the same way
        return self

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _closed(self) -> OSError:
        return OSError(errno.EBADF, f"standard {self._name} is closed")

    def read(self, size: int | None = -1) -> str:
        raise self._closed()

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return ""  # a prompt's answer (``input``): at its end, as no (click's "Aborted!")

    def write(self, text: str) -> int:
        raise self._closed()

    def isatty(self) -> bool:
        return False


def prepare() -> None:
    """Make the standard streams and ``COLUMNS`` ones the CLI can use."""
    if sys.stdin is None:
        sys.stdin = Closed("input")
    if sys.stdout is None:
        sys.stdout = Closed("output")
    if sys.stderr is None:
        # No diagnostics wanted: the command still runs (it failed on the spinner's check).
        sys.stderr = open(os.devnull, "w")  # for the process's life
    if isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.encoding.lower().startswith(
        "utf"
    ):
        # An ASCII locale: one pool named 'Ω' failed every table for everyone; escaped as
        # JSON escapes it, as stderr already is.
        sys.stdout.reconfigure(errors="backslashreplace")
    columns = os.environ.get("COLUMNS", "1")
    if not (columns.isascii() and columns.isdigit() and int(columns) > 0):
        # rich took COLUMNS=0 (or 00) as a width of nothing (every table empty, exit 0), and
        # a value that is no width as a width: it names none.
        del os.environ["COLUMNS"]
