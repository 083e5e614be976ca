"""What every front-end allows in a name, and how many keys a mapping may hold. A module of its
own, light (no engine, no YAML), so that each front-end and the API's models share one rule."""

from __future__ import annotations

from collections.abc import Sized
from typing import Final

from fairpool.errors import InvalidInput

#: What every backend can store (PostgreSQL's name columns are VARCHAR(255)).
MAX_NAME: Final = 255
#: Keys of one mapping of resource amounts, and labels of one request or workload: what a
#: pass plans and a row holds stays bounded, embedded as over HTTP.
MAX_KEYS: Final = 64
MAX_LABELS: Final = 64


def check_key_count(field: str, mapping: Sized, most: int) -> None:
    """At most ``most`` keys, worded as the API words it."""
    if len(mapping) > most:
        raise InvalidInput(field, len(mapping), f"must have at most {most} keys")

#: Why a name the API addresses in its paths (``/pools/{name}``, ``/queues/{name}``) may not
#: contain "/": it splits the path, even escaped as %2F.
SLASH_REASON: Final = '"/": the API addresses it in URL paths'
