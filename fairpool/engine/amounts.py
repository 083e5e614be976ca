"""Resource amounts as messages and tables say them: a pool tree's ``memory`` (bytes) in the
unit it is a whole number of, the largest (``6GiB``, ``16GB``), as it was most likely
written; and the front-ends read it back. Every other amount as it is. Programs (JSON) get
bytes."""

from __future__ import annotations

#: Units the trees' front-end reads (``512GiB``, ``4G``), largest first within each system.
_UNITS = (
    ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10),
    ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3),
)  # fmt: skip


def amount_text(key: str, amount: object) -> str:
    """``amount`` of ``key`` as a message or a table cell says it (memory: 6442450944 was
    6GiB to whoever wrote it; helper-89)."""
    if key != "memory" or not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return str(amount)
    exact = [(amount // size, unit) for unit, size in _UNITS if amount % size == 0]
    if not exact:
        return str(amount)
    count, unit = min(exact)
    return f"{count}{unit}"
