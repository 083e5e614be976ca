"""What a child forked from a process using fairpool starts over: the objects that hold
the parent's connections, locks or queues (a database, a group commit) register here, and
each is told in the child (``_forked``), before it is used there. Only threads that called
``os.fork`` exist in the child: a lock another thread held, a batch it led, a connection it
used, are the parent's, and waiting on them waited for ever (helper-94, helper-97)."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Forkable(Protocol):
    def _forking(self) -> None:
        """Before a fork, in the thread forking: wait for what a child cannot start over
        from; ``_forked`` or ``_forked_parent`` follows."""

    def _forked_parent(self) -> None:
        """After the fork, in the parent."""

    def _forked(self) -> None:
        """Start over in a forked child, taking no lock (a subprocess's child runs it too,
        before its exec)."""


_REGISTERED: weakref.WeakSet[Forkable] = weakref.WeakSet()


def start_over_in_children(thing: Forkable) -> None:
    """Tell ``thing`` in every child forked from now on, while it lives."""
    _REGISTERED.add(thing)


def _before_fork() -> None:
    for thing in list(_REGISTERED):
        thing._forking()


def _after_fork_in_parent() -> None:
    for thing in list(_REGISTERED):
        thing._forked_parent()


def _after_fork_in_child() -> None:
    for thing in list(_REGISTERED):
        thing._forked()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
