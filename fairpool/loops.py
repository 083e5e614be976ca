"""Handing work to an asyncio event loop from any thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def call_on(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop``: now when called on its thread (saving a turn of
    the loop and a wake-up of its selector), else at its next turn; not at all once it is
    closed (nobody is left to care)."""
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs on this thread
        here = False
    if here:
        callback(*args)
        return
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # closed meanwhile
        pass
