"""Wake-ups for long-polls, per request id, without holding a thread.

After every operation the app runs (each one transaction ending in a reconcile pass) and
after every pass of the reconciler thread, the app calls ``notify(ids)`` with the requests
that transaction took out of the queue (granted or rejected by the pass, or cancelled): a
long-poll waits for nothing else. A long-poll on request X registers a ``watch(X)`` *before* it
re-reads X's status, then sleeps on the watch's event: a change committed between the read and
the sleep has already set the event, so no wake-up is lost, and a write wakes only the
waiters it concerns instead of every waiter re-reading the database. This process's own
passes also hand each waiter the view of its request as they committed it, so a waiter they
wake answers without reading at all (``Watch.take_view``).

On SQLite the server is the only process writing through the API, and that is all.

On PostgreSQL several server processes (replicas) may share one database, and a request
waited for in replica A may be granted by a pass in replica B. ``PostgresChangeNotifier``
therefore also publishes: once an operation has committed, its ids go to a sender thread that
sends ``NOTIFY fairpool_changes, '<id>,<id>,...'`` on a connection of its own (ids gathered
while the previous NOTIFY was on its way go out together; payloads are split below
PostgreSQL's 8000-byte limit). A listener thread, on another connection, ``LISTEN``s on
``fairpool_changes`` and wakes this process's waiters for the ids it receives (skipping the
ones its own sender published: they were woken locally already). NOTIFY is sent only after the
commit, so a woken waiter always reads the new state.

Nothing depends on a notification arriving: a waiter still re-reads its request every second
(``RECHECK_SECONDS`` in ``app.py``) and the reconciler tick still runs. A failed NOTIFY is
logged and dropped; when the listener's connection breaks it reconnects (backing off) and,
having maybe missed notifications meanwhile, wakes every local waiter once to re-read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING

from fairpool.errors import words
from fairpool.loops import call_on
from fairpool.store.db import connect_defaults

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy import URL

    from fairpool.store.db import Database
    from fairpool.views import RequestView

log = logging.getLogger("fairpool.api")

_NONE: Mapping[str, RequestView] = MappingProxyType({})
#: The channel every fairpool server on a PostgreSQL database publishes and listens on.
CHANNEL = "fairpool_changes"
#: PostgreSQL refuses NOTIFY payloads of 8000 bytes or more; ids are sent in chunks below.
MAX_PAYLOAD_BYTES = 7900
#: How long the listener waits for notifications before it looks whether it should stop.
LISTEN_POLL_SECONDS = 0.5
#: ``start()`` waits at most this long for the listener to be listening.
START_SECONDS = 5.0
#: Reconnecting after a lost connection backs off up to this many seconds.
MAX_BACKOFF_SECONDS = 5.0


class Watch:
    """One waiter's event, set from any thread by ``ChangeNotifier.notify``, and the view of
    its request that the notifying pass handed it, if any."""

    def __init__(self, notifier: ChangeNotifier) -> None:
        self._notifier = notifier
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._view: RequestView | None = None

    def set_threadsafe(self, view: RequestView | None = None) -> None:
        if view is not None:
            self._view = view  # before the event: whoever it wakes finds it
        call_on(self._loop, self._event.set)

    def take_view(self) -> RequestView | None:
        """The view handed by the last wake-up that had one (then forgotten): the request
        as the pass that took it out of the queue committed it."""
        view, self._view = self._view, None
        return view

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
    """Wakes the waiters of this process (all there is on SQLite)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """Begin hearing about other processes' changes (nothing to do in one process)."""

    def stop(self) -> None:
        """Stop the threads ``start`` began, once the last operation has notified."""

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

    def notify(self, keys: Iterable[str], views: Mapping[str, RequestView] = _NONE) -> None:
        """These requests changed (committed): wake whoever waits on them, handing them the
        ``views`` given of their requests."""
        self._wake(keys, views)

    def close(self) -> None:
        """Shutting down: wake every waiter now; later waits return at once."""
        self._closed = True
        self._wake_all()

    def waiting(self) -> int:
        """How many waiters are registered (for tests and metrics)."""
        with self._lock:
            return sum(len(w) for w in self._watches.values())

    def _wake(self, keys: Iterable[str], views: Mapping[str, RequestView] = _NONE) -> None:
        with self._lock:
            woken = [(w, views.get(key)) for key in keys for w in self._watches.get(key, ())]
        for watch, view in woken:
            watch.set_threadsafe(view)

    def _wake_all(self) -> None:
        with self._lock:
            woken = [w for watchers in self._watches.values() for w in watchers]
        for watch in woken:
            watch.set_threadsafe()


class PostgresChangeNotifier(ChangeNotifier):
    """Also tells, and hears from, the other server processes on the same PostgreSQL
    database through ``LISTEN``/``NOTIFY`` on ``CHANNEL`` (see the module's docstring)."""

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._cond = threading.Condition()
        self._outbox: set[str] = set()
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._threads: list[threading.Thread] = []
        #: The backend pid of the sender's connection: notifications from it are our own.
        self._sender_pid: int | None = None

    @property
    def listening(self) -> bool:
        """The listener is connected and LISTENing (for tests and readiness)."""
        return self._listening.is_set()

    def start(self) -> None:
        """Start the sender and the listener; return once listening (or after
        ``START_SECONDS``, the listener then keeps trying in the background)."""
        if self._threads:
            raise RuntimeError("the notifier is already running")
        self._stopping.clear()
        for target, name in ((self._send_loop, "fairpool-notify"),
                             (self._listen_loop, "fairpool-listen")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self._listening.wait(START_SECONDS):
            log.warning("not yet listening on %s: other replicas' changes reach waiters "
                        "at their next re-read until the listener connects", CHANNEL)

    def stop(self) -> None:
        """Send what is still pending, then end both threads and their connections."""
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout=LISTEN_POLL_SECONDS + 5.0)

    def notify(self, keys: Iterable[str], views: Mapping[str, RequestView] = _NONE) -> None:
        ids = set(keys)
        self._wake(ids, views)  # the other replicas get the ids only, and read
        if not ids or not self._threads or self._stopping.is_set():
            return
        with self._cond:
            self._outbox |= ids
            self._cond.notify()

    # -- the sender --------------------------------------------------------------------

    def _send_loop(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        delay = 0.1
        try:
            while True:
                with self._cond:
                    while not self._outbox and not self._stopping.is_set():
                        self._cond.wait()
                    if not self._outbox:
                        return  # stopping, and everything was sent
                    batch, self._outbox = self._outbox, set()
                for attempt in (1, 2):  # once more on a fresh connection if it broke
                    try:
                        if conn is None:
                            conn = self._connect()
                            self._sender_pid = conn.info.backend_pid
                        conn.execute(
                            "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload",
                            (CHANNEL, payloads(batch)),
                        )
                        delay = 0.1
                        break
                    except Exception as error:
                        _close_quietly(conn)
                        conn = None
                        if attempt == 2:
                            log.warning(
                                "NOTIFY %s failed (%s): %d change(s) reach other replicas at "
                                "their next re-read", CHANNEL, words(error), len(batch),
                            )
                            # Do not hammer a database that is away.
                            self._stopping.wait(delay)
                            delay = min(delay * 2, MAX_BACKOFF_SECONDS)
        finally:
            _close_quietly(conn)

    # -- the listener ------------------------------------------------------------------

    def _listen_loop(self) -> None:
        delay = 0.1
        connected_before = False
        while not self._stopping.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    if connected_before:
                        # Notifications sent while we were away are lost: re-read them all.
                        self._wake_all()
                    connected_before = True
                    delay = 0.1
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=LISTEN_POLL_SECONDS):
                            if note.pid != self._sender_pid:
                                self._wake(i for i in note.payload.split(",") if i)
            except Exception as error:
                self._listening.clear()
                if self._stopping.is_set():
                    return
                log.warning("LISTEN %s: %s; reconnecting in %.1f s", CHANNEL,
                            words(error), delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
        self._listening.clear()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        import psycopg

        return psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=5,
            application_name="fairpool-notify",
        )


def payloads(ids: Iterable[str]) -> list[str]:
    """``ids`` as comma-separated NOTIFY payloads, each under ``MAX_PAYLOAD_BYTES``."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for request_id in sorted(ids):
        length = len(request_id.encode()) + 1
        if current and size + length > MAX_PAYLOAD_BYTES:
            chunks.append(",".join(current))
            current, size = [], 0
        current.append(request_id)
        size += length
    if current:
        chunks.append(",".join(current))
    return chunks


def conninfo(url: URL) -> str:
    """A libpq connection string for a SQLAlchemy PostgreSQL ``url``, with what the store's
    connections are made with where it does not say (``connect_defaults``: keepalives, so
    that a listener whose peer is gone without a word is found, and made again)."""
    from psycopg.conninfo import make_conninfo

    params = {k: str(v) for k, v in connect_defaults(url).items()}
    params.update((k, v) for k, v in url.query.items() if isinstance(v, str))
    params.update(
        (k, str(v))
        for k, v in url.translate_connect_args(username="user", database="dbname").items()
        if v is not None
    )
    return make_conninfo(**params)


def notifier_for(db: Database) -> ChangeNotifier:
    """The notifier a server on ``db`` needs: ``PostgresChangeNotifier`` on PostgreSQL, where
    other replicas may share the database, else the in-process ``ChangeNotifier``."""
    with db.read() as connection:
        url = connection.engine.url
    if url.get_backend_name() == "postgresql":
        return PostgresChangeNotifier(conninfo(url))
    return ChangeNotifier()


def _close_quietly(conn: psycopg.Connection[tuple[object, ...]] | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


