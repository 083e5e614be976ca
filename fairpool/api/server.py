"""Running the API with uvicorn: ``serve()`` and ``python -m fairpool.api``.

Shutdown on SIGTERM, SIGINT or SIGHUP is graceful: the listening socket closes, long-polls
answer at once, in-flight requests finish (for at most ``GRACE_SECONDS``), the reconciler
thread ends its pass and stops, and the database is closed. The process then exits normally
(status 0).
A second SIGINT forces the exit: requests still in flight are answered 503
(``errors.AnswerCancelled``), as they are when the grace is over.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

from fairpool.api.app import Api, create_app
from fairpool.api.auth import auth_enabled, is_loopback
from fairpool.errors import FairpoolError, InvalidInput
from fairpool.service import Service, open_service
from fairpool.store.records import TokenRole

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8600
#: How long in-flight requests may take to finish once shutdown has begun.
GRACE_SECONDS = 30


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the app at once that shutdown has begun (so that
    long-polls answer instead of holding the shutdown up), and which does not re-raise the
    signal after a clean shutdown (uvicorn does, to die of it)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # uvicorn says where it listens only on a socket it bound itself
            host = self.config.host
            shown = f"[{host}]" if ":" in host else host
            logging.getLogger("uvicorn.error").info(
                "Serving on http://%s:%d (Ctrl-C to stop)", shown, self.config.port
            )

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        # A closed terminal's SIGHUP ends the server as SIGTERM does, gracefully: uvicorn
        # takes SIGINT and SIGTERM only, and SIGHUP ended the process at once. Not under nohup.
        hup = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN)
        previous = signal.signal(signal.SIGHUP, self.handle_exit) if hup else None
        try:
            with super().capture_signals():
                yield
        finally:
            if hup:
                signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler runs between two bytecodes of the loop's thread, perhaps while it
        # holds the notifier's lock, which waking the long-polls takes: the loop does that.
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)
        except RuntimeError:  # no loop running yet, or any more: nothing holds the lock
            self._on_exit()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    home: str | None = None,
    database_url: str | None = None,
    tick: float = 1.0,
    log_level: str = "info",
    auth: bool | None = None,
    insecure: bool = False,
    keep_history: int | None = None,
    root_path: str = "",
) -> None:
    """Serve the API until SIGTERM, SIGINT or SIGHUP, on the embedded store under ``home``
    (else ``$FAIRPOOL_HOME``, else the user data dir) or on ``database_url``.

    ``auth``: require API tokens; by default only when ``host`` is not a loopback address.
    ``auth=False`` on such a host raises ``AuthSetupError`` unless ``insecure``.
    ``keep_history``: seconds what ended is kept, then pruned (``Service.prune``); None: for
    ever. ``root_path``: the path prefix a proxy serves it under (``/fairpool``), which the
    proxy removes: the documentation pages and the schema's ``servers`` name it.
    """
    root_path = _prefix(root_path)
    # `[::1]`, as a URL writes it (and the server's own "Serving on" line): the address.
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    enabled = auth_enabled(host, auth, insecure)
    # uvicorn closes the socket at its shutdown; the block, if it never got to start.
    with _listen(host, port) as listening:
        service = open_service(home, database_url)
        try:
            app = create_app(service, tick=tick, auth=enabled,
                             loopback_only=not enabled and is_loopback(host),
                             keep_history=keep_history)
            api: Api = app.state.api
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                lifespan="on",
                timeout_graceful_shutdown=GRACE_SECONDS,
                server_header=False,
                root_path=root_path,
            )
            # After Config: it sets uvicorn's logging up. fairpool's own lines (a prune's, a
            # failed pass's) go where uvicorn's go, at its level: they had no handler, so
            # only Python's last resort printed warnings and errors, bare, and info was lost.
            log = logging.getLogger("uvicorn.error")
            ours = logging.getLogger("fairpool")
            ours.handlers, ours.propagate = logging.getLogger("uvicorn").handlers, False
            ours.setLevel(log.level)
            log.info("Store: %s", service.db.where)
            _announce_auth(log, service, enabled, host)
            # What is alive now (modules, the app) lives as long as the process: kept out of
            # the collector's full passes, each of which otherwise walked it all and stalled
            # the event loop for 60-100 ms every few seconds under load.
            gc.collect()
            gc.freeze()
            _Server(config, on_exit=api.begin_shutdown).run(sockets=[listening])
        finally:
            service.close()  # the group commit's writer thread, then the database


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the store is opened: a port in use or a host that
    is not this machine's is one error line, and nothing was created or written."""
    # The family as uvicorn chooses it (IPv6 only for an address with a colon): `localhost`
    # is 127.0.0.1, where clients look by default, even where it resolves to ::1 first.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = None
    try:
        _, kind, proto, _, address = socket.getaddrinfo(
            host, port, family=family, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listening = socket.socket(family, kind, proto)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
    except (OSError, OverflowError, UnicodeError) as error:
        if listening is not None:
            listening.close()
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise FairpoolError(f"cannot listen on {host!r} port {port}: {why}") from None
    return listening


def _announce_auth(log: logging.Logger, service: Service, enabled: bool, host: str) -> None:
    if not enabled and is_loopback(host):
        log.info("API tokens not required (auth off: loopback host); only requests "
                 "addressed to a loopback name, and none from another site's web page")
        return
    if not enabled:
        log.warning("API tokens not required (--no-auth --insecure) on %s: anyone who can "
                    "reach it can change pools and requests", host)
        return
    log.info("API tokens required (auth on): Authorization: Bearer <token>")
    if not any(t.active and t.role is TokenRole.ADMIN for t in service.list_tokens()):
        log.warning(
            "auth is on but no admin token exists: create one with "
            "`fairpool token create --role admin` on this database"
        )


def _prefix(root_path: str) -> str:
    """``root_path`` as a path prefix (``/fairpool``, no trailing "/"), or refused."""
    if root_path in ("", "/"):
        return ""
    if not root_path.startswith("/") or not _PREFIX.fullmatch(root_path.rstrip("/")):
        raise InvalidInput("root-path", root_path, "must be a path such as /fairpool: the "
                           "prefix a proxy serves the server under")
    return root_path.rstrip("/")


#: A path prefix: segments of URL path characters, no query or fragment.
_PREFIX = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")
