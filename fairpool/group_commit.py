"""Group commit: operations arriving from many threads at once share one write transaction.

Writers are serialized anyway (one database write lock), so while one transaction runs, the
operations that queue up behind it are taken together by the next one: one lock, one reconcile
pass and one commit for all of them instead of one each. No thread of its own: the first
waiting caller leads the next batch (leader/follower), the others sleep until their operation
is done. A lone caller runs its operation at once, as without batching.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Pending(Generic[T]):
    """One operation waiting for its batch: what to run, then its answer or its error."""

    __slots__ = ("_done", "error", "result", "work")

    def __init__(self, work: T) -> None:
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = False

    def succeed(self, result: Any) -> None:
        self.result, self._done = result, True

    def fail(self, error: BaseException) -> None:
        self.error, self._done = error, True

    @property
    def done(self) -> bool:
        return self._done


class GroupCommit(Generic[T]):
    """Runs ``run_batch`` on the operations queued while the previous batch ran.

    ``run_batch`` must settle every operation it is given (``succeed`` or ``fail``); one it
    leaves unsettled fails with a ``RuntimeError``.
    """

    def __init__(self, run_batch: Callable[[list[Pending[T]]], None]) -> None:
        self._run_batch = run_batch
        self._queue: list[Pending[T]] = []
        self._queue_lock = threading.Lock()
        # Held by the thread running a batch; the others wait here for their turn to lead.
        self._leader = threading.Lock()

    def submit(self, work: T) -> Any:
        """Run ``work`` in the next batch; its result, or its error raised here."""
        pending = Pending(work)
        with self._queue_lock:
            self._queue.append(pending)
        with self._leader:
            if not pending.done:  # nobody took it while we waited: lead the next batch
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                try:
                    self._run_batch(batch)
                finally:
                    for unsettled in (p for p in batch if not p.done):
                        unsettled.fail(RuntimeError("the batch ended without settling it"))
        if pending.error is not None:
            raise pending.error
        return pending.result
