"""Lists a page at a time: requests, workloads and operations, oldest first, each page with
how many the filters match in all and, while more follow, the cursor of the next."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from fairpool.errors import InvalidInput, validate_int

#: The most requests one page holds (the API's ``limit``, the CLI's ``--size``), and the
#: largest ``offset`` (the database's OFFSET is a signed 64-bit integer).
MAX_PAGE_SIZE = 10_000
MAX_OFFSET = 2**62


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page of a list ended: its last item's time and id, in the list's order. The
    next page starts after it, wherever a delete since has moved it (an offset would skip
    as many items as were deleted before it). Shown as opaque text (``str``)."""

    at: datetime
    id: str

    def __str__(self) -> str:
        text = f"{self.at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(text).decode().rstrip("=")

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The cursor ``str`` made; anything else is refused as ``after``."""
        if not isinstance(text, str):
            raise InvalidInput("after", text, "must be a string")
        try:
            padded = text + "=" * (-len(text) % 4)
            decoded = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
            at, _, id_ = decoded.partition("|")
            cursor = cls(datetime.fromisoformat(at), id_)
        except ValueError:
            cursor = None
        if cursor is None or cursor.at.tzinfo is None or not cursor.id:
            raise InvalidInput("after", text, "not the cursor of a page (a page's `next`)")
        return cursor


def check_page(limit: int | None, offset: int, after: str | None = None) -> Cursor | None:
    """A page's ``limit`` (None: to the end), ``offset`` and ``after``, refused in the
    API's words; the cursor ``after`` is."""
    if limit is not None:
        validate_int("limit", limit, 1, MAX_PAGE_SIZE)
    validate_int("offset", offset, 0, MAX_OFFSET)
    return None if after is None else Cursor.parse(after)


def page_dict(
    items: Sequence[Mapping[str, Any]], total: int | None = None, limit: int | None = None,
    offset: int = 0, cursor: str | None = None,
) -> dict[str, Any]:
    """ZenML's page shape: ``{"items", "pagination": {"index" (1-based), "max_size",
    "total_pages" (at least 1), "total", "next"}}``, ``next`` the ``cursor`` of the page after
    (null: nothing follows); without ``total`` and ``limit``, one page holding everything.
    Every list answers this one shape."""
    total = len(items) if total is None else total
    size = total if limit is None else limit
    return {
        "items": list(items),
        "pagination": {
            "index": offset // size + 1 if size else 1,
            "max_size": size,
            "total_pages": max(1, math.ceil(total / size)) if size else 1,
            "total": total,
            "next": cursor,
        },
    }


class _Viewed(Protocol):
    def as_dict(self) -> Mapping[str, Any]: ...


V = TypeVar("V", bound=_Viewed)


@dataclass(frozen=True, slots=True)
class Page(Generic[V]):
    """Items ``offset`` to ``offset + limit`` of those a list's filters match (requests,
    workloads, operations; oldest first), and how many they match; ``limit`` None: all from
    ``offset``. Asked ``after`` a cursor, the offset counts from there."""

    items: tuple[V, ...]
    total: int
    limit: int | None = None
    offset: int = 0
    #: While more items follow: the cursor to ask for the page after this one with
    #: (``after``), which a delete meanwhile does not move as it moves an offset.
    next: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return page_dict(
            [v.as_dict() for v in self.items], self.total, self.limit, self.offset, self.next
        )
