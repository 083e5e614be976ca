"""Signals that must not be lost: Python drops an exception raised in a ``__del__`` or a
weak reference's callback (cpython#95959), so a handler that raises (``KeyboardInterrupt``
for a Ctrl-C, ``SystemExit`` for a ``kill``) and runs while the garbage collector finalizes
something would leave the program going on as if nothing had come."""

from __future__ import annotations

import _thread
import _weakrefset
import signal
import threading
import weakref
from types import FrameType

#: Where the weak containers and ``weakref.finalize`` of the standard library keep the
#: callbacks the garbage collector runs.
_WEAKREF_FILES = frozenset({weakref.__file__, _weakrefset.__file__})


def resent_from_finalizer(signum: int, frame: FrameType | None) -> bool:
    """At the top of a handler that raises: True when ``frame`` runs within a finalizer,
    and the signal was sent again from another thread (from this one it would be handled
    there again), to be handled once the finalizer has returned; the handler then returns."""
    if not _in_finalizer(frame):
        return False
    again = threading.Timer(0.01, signal_main, (signum,))
    again.daemon = True
    again.start()
    return True


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs within a ``__del__`` or a standard weak reference callback.
    Other callbacks are not known as such."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False


def signal_main(signum: int) -> None:
    """``signum`` to the main thread, even when it is blocked in a call such as
    ``time.sleep`` or a socket read: a real signal sent to that thread interrupts the call,
    where ``_thread.interrupt_main`` only has it handled once the call has returned. Nothing
    where Python does not handle it."""
    main = threading.main_thread().ident
    if main is not None and hasattr(signal, "pthread_kill") and callable(
        signal.getsignal(signum)
    ):
        signal.pthread_kill(main, signum)
    else:  # no pthread_kill (Windows): handled at the next bytecode
        _thread.interrupt_main(signal.Signals(signum))
