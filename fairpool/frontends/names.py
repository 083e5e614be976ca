"""What every front-end allows in a name. A module of its own, light (no engine, no YAML), so
that each front-end and the API's models share one rule."""

from __future__ import annotations

from typing import Final

#: What every backend can store (PostgreSQL's name columns are VARCHAR(255)).
MAX_NAME: Final = 255

#: Why a name the API addresses in its paths (``/pools/{name}``, ``/queues/{name}``) may not
#: contain "/": it splits the path, even escaped as %2F.
SLASH_REASON: Final = '"/": the API addresses it in URL paths'
