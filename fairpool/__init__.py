"""fairpool: share scarce compute between teams and pipelines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairpool.async_client import AsyncClient
    from fairpool.client import Cancelled, Client, NotGranted, Preempted, Rejected, WaitTimeout
    from fairpool.errors import (
        AmbiguousReference,
        Conflict,
        FairpoolError,
        Forbidden,
        InvalidInput,
        NotFound,
        Unauthorized,
        Unreachable,
    )
    from fairpool.settings import ResourceSettings

__all__ = ["AmbiguousReference", "AsyncClient", "Cancelled", "Client", "Conflict",
           "FairpoolError", "Forbidden", "InvalidInput", "NotFound", "NotGranted", "Preempted",
           "Rejected", "ResourceSettings", "Unauthorized", "Unreachable", "WaitTimeout"]
__version__ = "0.1.0"

# Loaded on first use: every CLI call imports this package, and most never need pydantic
# or httpx.
_LAZY = {
    "AsyncClient": "fairpool.async_client",
    **dict.fromkeys(["Cancelled", "Client", "NotGranted", "Preempted", "Rejected",
                     "WaitTimeout"], "fairpool.client"),
    **dict.fromkeys(["AmbiguousReference", "Conflict", "FairpoolError", "Forbidden",
                     "InvalidInput", "NotFound", "Unauthorized", "Unreachable"],
                    "fairpool.errors"),
    "ResourceSettings": "fairpool.settings",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fairpool' has no attribute {name!r}")
