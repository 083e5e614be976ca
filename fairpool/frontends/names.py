"""What every front-end allows in a name, and how many keys a mapping may hold. A module of its
own, light (no engine, no YAML), so that each front-end and the API's models share one rule."""

from __future__ import annotations

from collections.abc import Sized
from typing import Final

# MAX_NAME's home is fairpool.errors, which shows a longer ref clipped.
from fairpool.errors import MAX_NAME as MAX_NAME
from fairpool.errors import InvalidInput, clipped, is_unicode, string

#: Keys of one mapping of resource amounts, and labels of one request or workload: what a
#: pass plans and a row holds stays bounded, embedded as over HTTP.
MAX_KEYS: Final = 64
MAX_LABELS: Final = 64
#: Characters of a request's label value.
MAX_LABEL_VALUE: Final = 1024
#: Config versions are numbered from 1 and stored as 32-bit integers.
MAX_VERSION: Final = 2**31 - 1


def bounded_text(field: str, value: object, most: int) -> str:
    """Text every backend stores as it is: at most ``most`` characters, no NUL, no lone
    surrogate (what a command line makes of bytes that are not UTF-8)."""
    text = string(field, value)
    if len(text) > most:
        raise InvalidInput(field, clipped(text), f"must be at most {most} characters")
    if "\x00" in text:
        raise InvalidInput(field, text, "must not contain NUL characters")
    return check_unicode(field, text)


def check_unicode(field: str, value: str) -> str:
    """``value`` unless it holds a lone surrogate (``is_unicode``)."""
    if not is_unicode(value):
        raise InvalidInput(field, value, "must be valid Unicode text")
    return value


def nonprinting(value: str) -> str | None:
    """The first character of ``value`` that does not print as itself (``str.isprintable``:
    controls such as newline and ESC, format characters, separators but the space), as
    ``U+001B``; None when there is none. Printed raw, a name holding one could forge lines or
    send escape sequences in a diff, a table or a terminal."""
    if value.isprintable():
        return None
    return next(f"U+{ord(char):04X}" for char in value if not char.isprintable())


def printing_problem(value: str, shown: str) -> str | None:
    """Why ``value`` (``shown`` as a message shows it) is no name: the first character
    ``nonprinting`` finds in it; None when there is none. One wording for every front-end."""
    unprinted = nonprinting(value)
    if unprinted is None:
        return None
    return (f"must not contain control or other non-printing characters (got {shown}, "
            f"with {unprinted})")


def check_printing(field: str, value: str) -> str:
    """``value`` unless ``printing_problem`` finds one, so that every name a table, a
    message or a diff prints is refused alike."""
    problem = printing_problem(value, repr(clipped(value)))
    if problem:
        raise InvalidInput.from_message(field, f"{field}: {problem}")
    return value


def check_key_count(field: str, mapping: Sized, most: int) -> None:
    """At most ``most`` keys, worded as the API words it."""
    if len(mapping) > most:
        raise InvalidInput(field, len(mapping), f"must have at most {most} keys")

#: Why a name the API addresses in its paths (``/pools/{name}``, ``/queues/{name}``) may not
#: contain "/": it splits the path, even escaped as %2F.
SLASH_REASON: Final = '"/": the API addresses it in URL paths'
#: Why a new such name may not be "." or "..": a browser's or curl's URL drops the segment
#: (``GET /pools/../requests`` reached the request list, helper-96).
DOT_SEGMENTS: Final = (".", "..")
DOT_REASON: Final = 'must not be "." or "..": URLs drop such a path segment'
