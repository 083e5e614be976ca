"""``python -m fairpool.api [--host H] [--port P] [--home DIR] [--database-url URL]
[--auth | --no-auth [--insecure]]``."""

from __future__ import annotations

import argparse
import os
import sys

from fairpool.api.auth import AuthSetupError, auth_enabled
from fairpool.api.server import DEFAULT_HOST, DEFAULT_PORT, serve
from fairpool.backends import target
from fairpool.cli.common import duration_seconds
from fairpool.errors import FairpoolError, one_line
from fairpool.views import MAX_RETENTION, MIN_KEEP_HISTORY


def _duration(text: str) -> int:
    try:
        return duration_seconds(text, MIN_KEEP_HISTORY, MAX_RETENTION)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairpool.api", description="Serve the fairpool HTTP API."
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument(
        "--home", default=None, help="directory of the embedded SQLite store ($FAIRPOOL_HOME)"
    )
    parser.add_argument(
        "--database-url", default=None,
        help="sqlite:///PATH or postgresql+psycopg://... ($FAIRPOOL_DATABASE_URL)"
    )
    parser.add_argument(
        "--tick", type=float, default=1.0, help="seconds between reconcile passes (default 1)"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    parser.add_argument(
        "--auth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="require API tokens (default: only when --host is not a loopback address)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow --no-auth on a non-loopback host (a trusted network only)",
    )
    parser.add_argument(
        "--keep-history", type=_duration, default=None, metavar="DURATION",
        help="prune what ended longer ago than this (30d, 12h; at least 1h), at start and "
        "then hourly (default: keep everything)",
    )
    parser.add_argument(
        "--root-path", default="", metavar="PREFIX",
        help="the path prefix a proxy serves the server under, e.g. /fairpool (default: none)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be from 1 to 65535 (got {args.port})")
    if not args.tick > 0:
        parser.error("--tick must be a positive number of seconds")
    try:
        auth_enabled(args.host, args.auth, args.insecure)
    except AuthSetupError as error:
        parser.error(str(error))
    try:
        # As `fairpool server`: FAIRPOOL_DATABASE_URL unless --home or --database-url is given.
        given = [name for name in ("home", "database_url") if getattr(args, name) is not None]
        _, database_url = target(
            None, args.database_url or os.environ.get("FAIRPOOL_DATABASE_URL"), given
        )
        serve(args.host, args.port, args.home, database_url, args.tick, args.log_level,
              auth=args.auth, insecure=args.insecure, keep_history=args.keep_history,
              root_path=args.root_path)
    except FairpoolError as error:  # the database cannot be opened: one line, as the CLI's
        print(f"Error: {one_line(str(error))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
