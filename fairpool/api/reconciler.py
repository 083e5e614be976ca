"""The reconciler thread: one pass now, then one every ``tick`` seconds until stopped.

Each pass expires leases whose holders stopped sending heartbeats, and grants, rejects or
preempts whatever changed since the last one, including changes made by other processes on
the same database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fairpool.api.errors import log_failure


class Reconciler:
    def __init__(self, run_pass: Callable[[], object], tick: float = 1.0) -> None:
        if not tick > 0:
            raise ValueError(f"tick must be a positive number of seconds (got {tick!r})")
        self._run_pass = run_pass
        self.tick = tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the reconciler is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fairpool-reconciler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and wait for its pass in progress to end."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._run_pass()
            except Exception as error:  # the database may be away a while: try next tick
                log_failure("reconcile pass failed", error)
            self._stop.wait(self.tick)
