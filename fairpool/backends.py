"""Where the CLI's and the SDK's operations go: a fairpool server, or the embedded store.

Both choose alike: a ``url`` names a server (``RemoteService`` and its front-ends, over
HTTP); else a ``database_url`` (a server's PostgreSQL, say) or, without one, the SQLite store
under ``home`` (or ``FAIRPOOL_HOME``) is opened directly. The scheduler config and the pool
trees are served by the same server or store. Imports are lazy: remote mode never loads
SQLAlchemy, and ``fairpool --help`` loads neither.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from fairpool.errors import InvalidInput, password_hidden

if TYPE_CHECKING:
    from fairpool.remote import RemoteScheduling, RemoteService, RemoteTrees
    from fairpool.scheduling import SchedulingService
    from fairpool.service import Service
    from fairpool.trees_service import TreesService


def target(url: str | None, database_url: str | None, given: Collection[str]
           ) -> tuple[str | None, str | None]:
    """The server to talk to and the database to open (directly when there is no server;
    ``fairpool server`` and ``token`` open it in any case), from the values of ``url``,
    ``database_url`` and ``home`` given outright (``given``: on the command line, or as
    arguments) or taken from the environment. One given outright wins over the environment:
    ``home`` too, which then drops both; of the environment's, the server wins."""
    if {"url", "database_url"} <= set(given):
        raise InvalidInput("database-url", password_hidden(str(database_url)),
                           f"give a server (url {url!r}) or a database, not both")
    if "url" in given:
        return url, database_url
    if "database_url" in given:
        return None, database_url
    if "home" in given:
        return None, None
    return url, database_url


def open_service(url: str | None, token: str | None, home: str | None,
                 database_url: str | None = None) -> Service | RemoteService:
    """The server at ``url`` (``token`` sent with every call), else the database at
    ``database_url``, else the store under ``home``; see ``target``."""
    if url:
        from fairpool.remote import RemoteService

        return RemoteService(url, token)
    from fairpool.service import open_service as open_embedded

    return open_embedded(home, database_url, catch_up=True)


def where(service: Service | RemoteService) -> str:
    """What ``service`` works on, for ``repr``: ``server URL`` or ``database URL``, a
    password hidden."""
    from fairpool.remote import RemoteService

    if isinstance(service, RemoteService):
        return f"server {service.where}"
    return f"database {service.db.where}"


def scheduling_of(service: Service | RemoteService) -> SchedulingService | RemoteScheduling:
    """The scheduler config front-end (seed 004) on ``service``'s server or store."""
    from fairpool.remote import RemoteService

    if isinstance(service, RemoteService):
        from fairpool.remote import RemoteScheduling

        return RemoteScheduling(service)
    from fairpool.scheduling import SchedulingService

    return SchedulingService(service.db)


def trees_of(service: Service | RemoteService) -> TreesService | RemoteTrees:
    """The pool-tree front-end (seed 003) on ``service``'s server or store."""
    from fairpool.remote import RemoteService

    if isinstance(service, RemoteService):
        from fairpool.remote import RemoteTrees

        return RemoteTrees(service)
    from fairpool.trees_service import TreesService

    return TreesService(service.db)
