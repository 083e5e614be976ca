"""``fairpool token create|list|revoke``: API tokens for a server that requires them.

Tokens are written straight to a database, never through a server: run these where the
server's database is reachable (the embedded store under ``--home``, or ``--database-url``).
A secret is printed once, when it is created; the database keeps only its SHA-256.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import database_url_option

if TYPE_CHECKING:
    from fairpool.service import Service
    from fairpool.store.records import ApiToken

TOKEN_COLUMNS = ("id", "name", "role", "components", "prefix", "status", "created", "revoked")
ROLES = ("admin", "submitter")


@click.group("token")
def token() -> None:
    """API tokens for `fairpool server` with auth on (a non-loopback --host, or --auth).

    Clients send one as FAIRPOOL_TOKEN. These commands work on the database directly (the
    embedded store under --home, or --database-url), not through --url / FAIRPOOL_URL.
    """


database_option = database_url_option(
    "The server's database (default: fairpool --database-url or FAIRPOOL_DATABASE_URL, "
    "else the embedded store under --home)."
)


@contextmanager
def _store(url: str | None) -> Iterator[Service]:
    from fairpool.service import open_service

    root = click.get_current_context().find_root().obj or {}
    url = url or root.get("database_url")
    svc = open_service(root.get("home"), url)
    if root.get("url"):
        # Which database, by name: a token made in another one than the server serves is
        # answered 401 there (it said "--home" of a home given as FAIRPOOL_HOME; helper-93).
        o.declare(
            f"Note: tokens are kept in the database {svc.db.where}, not sent to the server at "
            f"{root['url']}: that server accepts them only if it serves this database."
        )
    try:
        yield svc
    finally:
        svc.close()


def token_dict(found: ApiToken) -> dict[str, Any]:
    """A token as every output shows it: never its secret."""
    return {
        "id": found.id,
        "name": found.name,
        "role": found.role.value,
        "components": list(found.components),
        "prefix": found.prefix,
        "status": "active" if found.active else "revoked",
        "created": found.created_at.isoformat(),
        "revoked": found.revoked_at.isoformat() if found.revoked_at else None,
    }


def _row(row: dict[str, Any]) -> dict[str, Any]:
    shown = dict(row)
    for column in ("created", "revoked"):
        if shown.get(column):
            shown[column] = datetime.fromisoformat(shown[column]).strftime("%Y-%m-%d %H:%M:%S")
    return shown


def _describe(found: ApiToken) -> str:
    what = f"`{found.name}` ({found.prefix}…)" if found.name else f"{found.prefix}…"
    return f"{found.role.value} token {what}, id {found.id}"


@token.command("create")
@click.option("--role", type=click.Choice(ROLES), required=True,
              help="admin: everything. submitter: create requests for its components, manage "
              "its own requests, workloads and pool-tree operations, read pools and "
              "policies.")
@click.option("--component", "components", multiple=True, metavar="NAME",
              help="A component a submitter may create requests for (repeatable; required "
              "for submitters).")
@click.option("--name", default=None, help="A label: who or what holds the token.")
@database_option
@o.output_option
def create(role: str, components: tuple[str, ...], name: str | None, database_url: str | None,
           output: str) -> None:
    """Create a token and print its secret, once: only its hash is stored."""
    with _store(database_url) as svc:
        found, secret = svc.create_token(role, components, name)
    if output != "table":
        o.dump({**token_dict(found), "token": secret}, output)
        return
    allowed = f" for {', '.join(found.components)}" if found.components else ""
    o.declare(f"Created {_describe(found)}{allowed}.")
    o.declare("Its secret follows; it is shown only now. Clients send it as FAIRPOOL_TOKEN.")
    click.echo(secret)


@token.command("list")
@database_option
@o.output_option
def list_tokens(database_url: str | None, output: str) -> None:
    """Every token, revoked ones included (never their secrets)."""
    with _store(database_url) as svc:
        rows = [token_dict(t) for t in svc.list_tokens()]
    o.print_list(rows, TOKEN_COLUMNS, output, empty_message="No API tokens.", row_formatter=_row)


@token.command("revoke")
@click.argument("token_id", metavar="ID|SECRET")
@database_option
@o.output_option
def revoke(token_id: str, database_url: str | None, output: str) -> None:
    """Revoke a token by id or id prefix, or by its secret (or the secret's first characters,
    the PREFIX that `token list` shows): the server refuses it from its next call."""
    with _store(database_url) as svc:
        found, changed = svc.revoke_token(token_id)
    if output != "table":
        o.dump(token_dict(found), output)
    elif changed:
        o.declare(f"Revoked {_describe(found)}.")
    else:
        o.declare(f"Already revoked: {_describe(found)}.")
