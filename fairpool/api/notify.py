"""Wake-ups for long-polls, per request id, without holding a thread.

After every operation the app runs (each one transaction ending in a reconcile pass) and
after every pass of the reconciler thread, the app calls ``notify(ids)`` with the requests
whose status that transaction changed (granted, rejected, preempted, expired, retried, or the
operation's own request). A long-poll on request X registers a ``watch(X)`` *before* it
re-reads X's status, then sleeps on the watch's event: a change committed between the read and
the sleep has already set the event, so no wake-up is lost, and a write wakes only the
waiters it concerns instead of every waiter re-reading the database.

Changes made by other processes on the same database are not notified here: waiters also
re-read on a short interval for those.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class Watch:
    """One waiter's event, set from any thread by ``ChangeNotifier.notify``."""

    def __init__(self, notifier: ChangeNotifier) -> None:
        self._notifier = notifier
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def set_threadsafe(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # its loop is closed: nobody left to wake
            pass

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """True when notified (or shutting down), False after ``timeout`` seconds."""
        if self._notifier.closed:
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout))
            return True
        except TimeoutError:
            return False


class ChangeNotifier:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def watch(self, key: str) -> Iterator[Watch]:
        """Register a waiter for ``key`` (a request id) for the duration of the block."""
        watch = Watch(self)
        with self._lock:
            self._watches.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                watchers = self._watches.get(key)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._watches[key]

    def notify(self, keys: Iterable[str]) -> None:
        """These requests changed: wake whoever waits on them."""
        with self._lock:
            woken = [w for key in keys for w in self._watches.get(key, ())]
        for watch in woken:
            watch.set_threadsafe()

    def close(self) -> None:
        """Shutting down: wake every waiter now; later waits return at once."""
        self._closed = True
        with self._lock:
            woken = [w for watchers in self._watches.values() for w in watchers]
        for watch in woken:
            watch.set_threadsafe()

    def waiting(self) -> int:
        """How many waiters are registered (for tests and metrics)."""
        with self._lock:
            return sum(len(w) for w in self._watches.values())
