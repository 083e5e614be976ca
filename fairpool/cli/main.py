"""The ``fairpool`` command: parse, call the service, print.

Every error the service raises on purpose (``FairpoolError``, ``LookupError``, ``ValueError``,
pydantic's ``ValidationError``) and ``OSError`` become one line ``Error: <message>`` on stderr
and exit code 1; click's own usage errors keep exit code 2. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from typing import Any

import click
from click.exceptions import NoArgsIsHelpError

from fairpool import backends
from fairpool.cli import output as o
from fairpool.cli import streams
from fairpool.cli.common import Duration, database_url_option, service
from fairpool.cli.component import component
from fairpool.cli.config import config
from fairpool.cli.queue import queue
from fairpool.cli.resource_pool import resource_pool
from fairpool.cli.resource_request import resource_request
from fairpool.cli.run import run, server
from fairpool.cli.token import token
from fairpool.cli.trees import node, operation, pool, pool_tree
from fairpool.cli.workload import workload
from fairpool.errors import FairpoolError, InvalidInput, one_line, said
from fairpool.frontends.names import check_unicode
from fairpool.integrations.zenml.cli import zenml
from fairpool.store.revision import SCHEMA_HEAD
from fairpool.views import MAX_RETENTION, PruneView


def error_message(error: Exception) -> str:
    """The text after ``Error:``: field and value for validation errors, no KeyError quotes."""
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        problems = []
        from fairpool.settings import MEMORY_REGEX, memory_problem

        for item in error.errors():
            field = ".".join(str(part) for part in item["loc"]) or "input"
            if item.get("ctx", {}).get("pattern") == MEMORY_REGEX:
                problems.append(f"{field}: {memory_problem(item['input'])}")
            else:
                problems.append(f"{field}: {item['msg']} (got {item['input']!r})")
        return "; ".join(problems)
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error) or type(error).__name__


def database_error(error: Exception) -> str | None:
    """A database's failure as one line (None: ``error`` is not one). SQLAlchemy is looked
    for only where it is loaded: a remote command never loads it."""
    exc = sys.modules.get("sqlalchemy.exc")
    # DatabaseError itself: a damaged file (``database disk image is malformed``), which was
    # a traceback (helper-78); its other kinds (an IntegrityError) would be fairpool's bug.
    if exc is None or not (isinstance(error, exc.OperationalError)
                           or type(error) is exc.DatabaseError):
        return None
    from fairpool.store.db import LOCK_TIMEOUT_MS

    reason = said(error)
    if reason == "database is locked":
        # As the store says it when a write cannot begin (``DatabaseLocked``).
        return (f"the database stayed locked by another process for {LOCK_TIMEOUT_MS // 1000} "
                "s (a long write, or many writing at once)")
    return f"database error: {reason}"


class UsageLine(click.ClickException):
    """A usage error (a missing option, a value its type refuses) on one ``Error:`` line,
    with where to look, in place of click's usage block; exit code 2, as click's."""

    exit_code = 2

    @classmethod
    def of(cls, error: click.UsageError, ctx: click.Context) -> click.UsageError | UsageLine:
        if isinstance(error, NoArgsIsHelpError):  # a group given no command: its help
            return error
        path = error.ctx.command_path if error.ctx is not None else _command_path(ctx)
        return cls(f"{error.format_message()} (see '{path} -h')")


def _command_path(ctx: click.Context) -> str:
    """The path of the command the arguments name, from the root's context: click's parser
    raises its errors (an option missing its value) without the command's context."""
    command, path = ctx.command, [ctx.command_path]
    for arg in ctx.meta.get(_ARGS, ()):
        if isinstance(command, click.Group) and arg in command.commands:
            command = command.commands[arg]
            path.append(arg)
    return " ".join(path)


def _own(args: list[str], commands: Mapping[str, click.Command]) -> list[str]:
    """The arguments fairpool reads: all but those of the command ``run`` runs (all after
    ``run``, whose own options are checked where they are read)."""
    taking_value = False
    for i, arg in enumerate(args):
        if taking_value:  # the value of a root option (``--home run``): not a command
            taking_value = False
        elif arg in _VALUED_ROOT_OPTIONS:
            taking_value = True
        elif not arg.startswith("-"):  # the command
            return args[: i + 1] if arg == "run" and arg in commands else args
    return args


#: The root's options that take a value as the next argument.
_VALUED_ROOT_OPTIONS = frozenset({"--home", "--url", "--database-url", "--token"})


#: Where the root keeps its arguments, for ``_command_path``.
_ARGS = "fairpool.args"


class FairpoolGroup(click.Group):
    """The root group: turns expected errors into click's ``Error:`` line (exit code 1)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Bytes that are not UTF-8 reach us as lone surrogates, which neither a store nor a
        # URL takes: refused here once, for every argument and option alike; but the
        # command `run` runs gets its arguments as they came (a file's name is bytes).
        for arg in _own(args, self.commands):
            try:
                check_unicode("argument", arg)
            except InvalidInput as error:
                raise click.ClickException(str(error)) from None
        ctx.meta[_ARGS] = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            raise UsageLine.of(error, ctx) from None
        except BrokenPipeError:
            raise  # output into `head`: click ends quietly, as Unix tools do
        except OSError as error:  # -h or --version into a full disk: it was a traceback
            raise click.ClickException(one_line(error_message(error))) from error

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            raise UsageLine.of(error, ctx) from None
        except KeyboardInterrupt:
            # Ctrl-C exits 130, as a shell's convention and `--wait` and `run` have it (click
            # says "Aborted!" and exits 1).
            click.echo("\nAborted!", err=True)
            ctx.exit(128 + signal.SIGINT)
        except BrokenPipeError:
            raise  # output into `head`: click ends quietly, as Unix tools do
        # OSError: e.g. --home names a file, or a directory we may not write to.
        except (FairpoolError, LookupError, ValueError, OSError) as error:
            raise click.ClickException(one_line(error_message(error))) from error
        except Exception as error:
            message = database_error(error)
            if message is None:
                raise
            raise click.ClickException(message) from error


@click.group(cls=FairpoolGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    envvar="FAIRPOOL_HOME",
    default=None,
    help="Directory holding the fairpool database (env FAIRPOOL_HOME; default: the user data "
    "directory).",
)
@click.option(
    "--url",
    envvar="FAIRPOOL_URL",
    default=None,
    help="A fairpool server to talk to instead of the embedded store (env FAIRPOOL_URL).",
)
@database_url_option("A database to work on directly instead of the store under --home: a "
                     "server's PostgreSQL, say. Env FAIRPOOL_DATABASE_URL; with FAIRPOOL_URL "
                     "also set, the server is used.", envvar="FAIRPOOL_DATABASE_URL")
@click.option("--token", envvar="FAIRPOOL_TOKEN", default=None, hidden=True)
@click.version_option(package_name="fairpool", prog_name="fairpool",
                      message=f"%(prog)s, version %(version)s (store schema {SCHEMA_HEAD})")
@click.pass_context
def cli(ctx: click.Context, home: str | None, url: str | None, database_url: str | None,
        token: str | None) -> None:
    """fairpool: share GPUs and other scarce resources between teams and pipelines."""
    o.declare_logged()
    ctx.ensure_object(dict)
    ctx.obj["home"] = home
    commandline = click.core.ParameterSource.COMMANDLINE
    ctx.obj["url"], ctx.obj["database_url"] = backends.target(url, database_url, [
        name for name in ("url", "database_url", "home")
        if ctx.get_parameter_source(name) is commandline
    ])
    ctx.obj["token"] = token


@cli.command("prune")
@click.option("--older-than", type=Duration(0, MAX_RETENTION), required=True,
              help="Delete what ended longer ago than this: 30d, 12h, 90m, 3600s "
              "(0: all that ended; under a minute, a holder may read 'deleted' for a "
              "request that ended before it heard how).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@o.output_option
def prune(older_than: int, dry_run: bool, output: str) -> None:
    """Delete what ended long ago: finished requests and their history (and the history of
    deleted ones), finished workloads and operations. Nothing live is touched."""
    with o.spinner("Counting...\n" if dry_run else "Pruning...\n") as say:

        def progress(so_far: PruneView) -> None:
            deleted = ", ".join(f"{n:,} {what}" for what, n in so_far.counts().items() if n)
            say(f"Pruning... deleted {deleted} so far\n")

        done = service().prune(older_than, dry_run=dry_run, progress=progress)
    if output != "table":
        o.dump(done.as_dict(), output)
        return
    o.print_properties("Would delete" if dry_run else "Deleted", [
        ("ended before", done.before.isoformat(timespec="seconds")), *done.counts().items(),
    ])


@cli.command("reconcile")
@o.output_option
def reconcile(output: str) -> None:
    """Run one reconcile pass by hand and print what it changed."""
    with o.spinner("Reconciling...\n"):
        summary = service().reconcile()
    if output != "table":
        o.dump(summary.as_dict(), output)
        return
    # Counts of what it changed; not the per-grant wait times and the requests created in
    # its transaction, which the metrics take (they read "waits 1", "created 0": helper-90).
    o.print_properties("Reconcile pass", [
        *((what, len(ids)) for what, ids in [
            ("granted", summary.granted), ("preempted", summary.preempted),
            ("rejected", summary.rejected), ("retried", summary.retried),
            ("lease expired", summary.expired)]),
        ("still queued", summary.waiting), ("seconds", summary.seconds),
    ])


cli.add_command(component)
cli.add_command(config)
cli.add_command(resource_pool)
cli.add_command(resource_request)
cli.add_command(run)
cli.add_command(server)
cli.add_command(token)
cli.add_command(workload)
cli.add_command(queue)
cli.add_command(node)
cli.add_command(pool_tree)
cli.add_command(pool)
cli.add_command(operation)
cli.add_command(zenml)


def main() -> None:
    """Console script entry point."""
    streams.prepare()
    cli(prog_name="fairpool")


if __name__ == "__main__":
    main()

