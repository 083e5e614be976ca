"""Errors every front-end turns into one clear line and a non-zero exit."""

from __future__ import annotations

import numbers
import re
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the CLI imports this module: asyncio would cost it ~50 ms a start
    import asyncio


def one_line(text: str) -> str:
    """``text`` on one line (a log line, an error line, an HTTP error's detail): its lines
    stripped and joined by single spaces. Spaces within a line are kept: a value shown in
    it, ``(got '   ')``, is shown as it was."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def from_database(error: BaseException) -> bool:
    """Whether ``error`` is the database's own (SQLAlchemy's ``DBAPIError``: a full disk, a
    damaged file), not fairpool's. SQLAlchemy is looked for only where it is loaded: a remote
    client never loads it."""
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(error, exc.DBAPIError)


def said(error: BaseException) -> str:
    """``error`` on one line: ours as it is (``DatabaseUnreachable`` names the database);
    SQLAlchemy's wraps its driver's in lines of its own (the statement, a link), so the
    driver's own words are said."""
    plain = isinstance(error, FairpoolError)
    return one_line(str(error if plain else getattr(error, "orig", None) or error))


#: The most characters of an error's words a log line or an answer shows: the cause comes
#: last (`cannot reach the database URL: connection failed: ... FATAL: ...`), and a cut at
#: 200 lost it behind a long URL (helper-90).
MAX_WORDS = 1000


def words(error: BaseException) -> str:
    """``error`` as a log line or an answer says it: the driver's own words for the
    database's (``said``: not SQLAlchemy's statement and link), on one line, at most
    ``MAX_WORDS`` characters; its type's name when it says nothing."""
    return said(error)[:MAX_WORDS] or type(error).__name__


#: What every backend can store (PostgreSQL's name columns are VARCHAR(255)): no name or id
#: is longer.
MAX_NAME: Final = 255


def clipped(text: str) -> str:
    """A long value as an error line shows it: its first 20 characters."""
    return text if len(text) <= 20 else text[:20] + "..."


#: The most characters of a value an error line shows.
MAX_SHOWN: Final = 80


def shown(value: object) -> str:
    """``value`` as an error line shows it: a long string clipped, any other long value's
    text cut (a tree's whole 100 kB config was echoed in its error line)."""
    if isinstance(value, str) and len(value) > MAX_SHOWN:
        value = clipped(value)
    text = _written(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _written(value: object) -> str:
    """A lone value as YAML, JSON and the command line spell it, where Python's repr would
    not: ``true``, ``null``, an exact number as a number (a ``Decimal`` as written, a weight's
    ``Fraction`` as its value). Anything else (a string, a mapping) as its repr."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int | float) or not isinstance(value, numbers.Number):
        return repr(value)
    if isinstance(value, numbers.Rational):
        return str(value.numerator) if value.denominator == 1 else repr(float(value))
    return str(value)


def counted(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``: a count as a message writes it (regular plurals only)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def password_hidden(url: str) -> str:
    """A URL as shown in a message: what stands for its password (up to the last ``@`` of
    its authority) as ``***``."""
    return re.sub(r"(://[^/:@]*:)[^/]*@", r"\1***@", url)


class FairpoolError(Exception):
    """Base class: the message is the whole line shown to the user."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (raised in a multiprocessing worker), rebuilt from its arguments and
        # attributes, not by its constructor, whose parameters differ from ``args``: loading
        # one failed, and a Pool waited for ever.
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception with ``args`` and no constructor run (``FairpoolError.__reduce__``)."""
    return cls.__new__(cls, *args)


class NotFound(FairpoolError, LookupError):
    """A name, ID or ID prefix matched nothing."""

    def __str__(self) -> str:  # LookupError would otherwise repr-quote a lone argument
        return str(self.args[0]) if self.args else ""

    @classmethod
    def of(cls, what: str, ref: object, where: str = "") -> NotFound:
        """The one wording, which the remote client also gives for a ref it cannot send:
        ``no resource pool 'x'``, ``no pool 'x' in tree t``. A ref longer than any name is shown
        clipped (a whole file pasted was echoed whole)."""
        if isinstance(ref, str) and len(ref) > MAX_NAME:
            ref = clipped(ref)
        return cls(f"no {what} {ref!r}{where}")

    @classmethod
    def of_queue(cls, name: object) -> NotFound:
        """A queue looked for in the active scheduler config (an older version's may still
        hold workloads: ``workload list --queue`` finds them)."""
        return cls.of("resource queue", name, " in the active scheduler config")

    @classmethod
    def of_policy(cls, kind: str, component: str, pool: str) -> NotFound:
        """ZenML's words for a policy that is not there."""
        return cls(f"No policy found for {kind} `{component}` in resource pool `{pool}`")


class InvalidInput(FairpoolError, ValueError):
    """Bad input; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        super().__init__(f"{field}: {problem} (got {shown(value)})")
        self.field = field
        self.value = value

    @classmethod
    def from_message(cls, field: str, message: str) -> InvalidInput:
        """One already worded (by a server): kept as it is."""
        error = cls.__new__(cls)
        FairpoolError.__init__(error, message)
        error.field = field
        error.value = None
        return error

    @classmethod
    def no_tree(cls, trees: bool = True) -> InvalidInput:
        """No pool tree named and no default set (``trees``: there are some): the same words
        embedded and remote. With none at all, how to make one (it said to set a default)."""
        if not trees:
            return cls.from_message("tree", "tree: there is no pool tree yet (`fairpool "
                                    "pool-tree create NAME` makes one; resource pools are "
                                    "`fairpool resource-pool`)")
        return cls.from_message("tree", "tree: no tree given and no default_tree set "
                                "(`fairpool pool-tree default NAME` sets one)")


def is_unicode(value: str) -> bool:
    """Whether ``value`` holds no lone surrogate, which no backend stores, no URL carries and
    no JSON answer encodes (what Python makes of command-line bytes that are not UTF-8)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_ref(ref: object) -> str:
    """``ref``, a name or id to look something up by, if it could be one: a string with no
    NUL and no lone surrogate, which no name or id holds. Refused in the server's words for a
    path's ref, so that the embedded store and the remote client refuse it alike (the
    PostgreSQL driver raised its own error for a NUL, and the UTF-8 encoder for a
    surrogate)."""
    if not isinstance(ref, str):
        raise InvalidInput("ref", ref, "must be a name or id (a string)")
    if "\x00" in ref:
        raise InvalidInput("ref", ref, "must not contain NUL characters")
    if not is_unicode(ref):
        raise InvalidInput("ref", ref, "must be valid Unicode text")
    return ref


def mapping(field: str, value: object) -> Mapping[str, object]:
    """``value``, if it is a mapping; refused in the words the API's check uses, so that the
    embedded service and the remote client (where the API names the field otherwise) say the
    same (``dict(["gpu"])`` raised Python's own ValueError)."""
    if not isinstance(value, Mapping):
        raise InvalidInput(field, value, "must be a mapping")
    return value


def string(field: str, value: object) -> str:
    """``value``, if it is a string; refused in the words the API's check uses, before any
    other check, so that a number given for a name is told so embedded as over HTTP."""
    if not isinstance(value, str):
        raise InvalidInput(field, value, "must be a string")
    return value


def listed(field: str, value: object) -> list[Any]:
    """``value``'s items, if it is a list of them (or another collection): refused, in the
    words the API's check uses, for a string or a mapping, which ``list()`` would split into
    characters or keys, and for a single value."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidInput(field, value, "must be a list")
    return list(value)


def one_of(field: str, value: str, choices: Iterable[str]) -> str:
    """``value``, if it is one of ``choices``; else ``InvalidInput`` naming them."""
    if value not in choices:
        raise InvalidInput(field, value, f"must be one of {', '.join(choices)}")
    return value


def validate_int(field: str, value: object, low: int, high: int) -> int:
    """An integer from ``low`` to ``high``; refused in the words the API's checks use
    (``fairpool.api.errors``), so that a command says the same embedded and remote."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, value, "must be an integer")
    if value < low:
        raise InvalidInput(field, value, at_least(low))
    if value > high:
        raise InvalidInput(field, value, f"must be at most {high}")
    return value


def at_least(low: int) -> str:
    """How a check words an integer's lower bound."""
    return {0: "must be a non-negative integer", 1: "must be a positive integer"}.get(
        low, f"must be at least {low}"
    )


class Conflict(FairpoolError):
    """The request is valid but the current state forbids it (e.g. live allocations)."""


class AmbiguousReference(Conflict, LookupError):
    """An ID prefix matched more than one object: a conflict (409) like the others, so that
    ``except Conflict`` catches it embedded as through a server."""

    #: How its message ends, which tells it from other conflicts in a server's answer.
    ENDING = "is ambiguous; type more of it"

    @classmethod
    def of(cls, what: str, ref: str) -> AmbiguousReference:
        return cls(f"{what} id prefix {ref!r} {cls.ENDING}")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Unauthorized(FairpoolError):
    """The server asked for an API token: none was sent, or it is unknown or revoked (401)."""


class Forbidden(FairpoolError):
    """The caller's API token does not allow this: an admin's operation, or a component the
    token does not name (403)."""


class Unreachable(FairpoolError):
    """The server could not be reached, after retries, or the database could not be opened:
    perhaps a passing outage, unlike the errors above, which are the server's answer."""


class SchemaMoved(Unreachable):
    """The database's schema is no longer this process's (``Database.schema_moved``): it
    writes nothing more. Retrying does not help; the fairpool that migrated it does."""


class WouldWait(Exception):
    """Not a user error: raised, before anything was written, by a write told not to wait
    (a batch on an event loop's thread) that would have had to wait for a lock or do long
    work; the caller runs it again where waiting is fine."""


class Later(Exception):
    """Not an error: raised by a write queued by ``Service.later``, before anything was
    written, with the future its answer (or error) will come in."""

    def __init__(self, future: asyncio.Future[Any]) -> None:
        super().__init__("the write was queued")
        self.future = future
