"""fairpool's HTTP API (FastAPI): ``create_app(service)`` and ``serve(...)``."""

from __future__ import annotations

from fairpool.api.app import create_app
from fairpool.api.server import serve

__all__ = ["create_app", "serve"]
