"""What the API's routes answer, as its OpenAPI document shows them: the views
(``fairpool.views``, whose ``as_dict`` writes the JSON), and every list's one page shape
(``fairpool.paging.page_dict``). Documentation only: the routes write their answers
themselves. Without these, every answer's schema was ``{}``, and a client generated from the
document knew none of their fields (helper-96)."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

V = TypeVar("V")


class Pagination(BaseModel):
    """Where a page stands among the items a list's filters match."""

    index: int
    max_size: int
    total_pages: int
    total: int
    #: The cursor to ask for the page after this one with (``after``); null: none follows.
    next: str | None


class Listed(BaseModel, Generic[V]):
    """A list's answer: one page of items."""

    items: list[V]
    pagination: Pagination
