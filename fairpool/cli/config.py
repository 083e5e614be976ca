"""``fairpool config ...``: the scheduler config (seed 004; Anyscale's ``anyscale scheduler
config``). ``validate`` is local and pure (no store, no server); the other commands work on
the versions stored in the database (or on the server at ``--url``).
"""

from __future__ import annotations

import codecs
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import scheduling, service
from fairpool.cli.workload import workload_fields, workload_options
from fairpool.errors import counted

if TYPE_CHECKING:
    from fairpool.frontends.config import ConfigError


@click.group("config")
def config() -> None:
    """Scheduler config: flavors, queues and routing rules in one YAML document."""


def read_config_file(path: str) -> str:
    """The file's text (``-`` reads stdin); a file that cannot be read is one ``Error:`` line,
    and so is one longer than a document may be, read no further (``yes x |`` grew to
    gigabytes, ``/dev/zero`` too, before the length was checked)."""
    from fairpool.frontends.config import MAX_DOCUMENT
    from fairpool.frontends.trees import MAX_TREE_DOCUMENT

    most = max(MAX_DOCUMENT, MAX_TREE_DOCUMENT)
    enough = 4 * most + len(codecs.BOM_UTF8) + 1  # past ``most`` characters however written
    try:
        if path == "-":
            data = sys.stdin.buffer.read(enough)
        else:
            with open(path, "rb") as file:
                data = file.read(enough)
    except OSError as error:
        raise click.ClickException(
            f"cannot read {_named(path)}: {error.strerror or error}"
        ) from None
    if len(data) == enough:
        raise click.ClickException(
            f"cannot read {_named(path)}: it holds more than {most} characters, the most a "
            "document may have"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise click.ClickException(f"cannot read {_named(path)}: not UTF-8 text") from None


def _answers(path: str, yes: bool) -> AbstractContextManager[None]:
    """Where a confirmation is read: stdin, unless the document came through it (``-f -``
    from a pipe, used up: the answer was always no), then the terminal. Without one, --yes
    is asked for before anything is read."""
    if yes or path != "-" or sys.stdin.isatty():
        return nullcontext()
    try:
        os.close(os.open(_TERMINAL, os.O_RDONLY))
    except OSError:
        raise click.UsageError(
            "the config comes from stdin, which cannot then answer the confirmation: give "
            "--yes (there is no terminal to ask on)"
        ) from None
    return _reading_terminal()


#: The process's controlling terminal.
_TERMINAL = "/dev/tty"


@contextmanager
def _reading_terminal() -> Iterator[None]:
    """Prompts read from the terminal meanwhile."""
    stdin = sys.stdin
    with open(_TERMINAL) as sys.stdin:
        try:
            yield
        finally:
            sys.stdin = stdin


def _named(path: str) -> str:
    """The file as messages name it."""
    return "stdin" if path == "-" else path


@config.command("validate")
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    metavar="PATH",
    help="The scheduler config YAML file ('-' for stdin).",
)
@o.output_option
def validate(path: str, output: str) -> None:
    """Validate a scheduler config file and list every problem, each with its path.

    Exit code 0 when the config is valid (warnings go to stderr), 1 when it is not.
    """
    # Imported here: ``fairpool --help`` and the other commands never pay for it.
    from fairpool.frontends.config import ConfigError, load_config, warnings

    text = read_config_file(path)
    try:
        parsed = load_config(text)
    except ConfigError as error:
        _print_invalid(path, error, output)
        return
    advisories = warnings(parsed)
    counts = {
        "flavors": len(parsed.resource_flavors),
        "queues": len(parsed.resource_queues),
        "rules": len(parsed.scheduling_rules),
    }
    if output != "table":
        o.dump(
            {
                "valid": True,
                "errors": [],
                **counts,
                "warnings": [issue.as_dict() for issue in advisories],
            },
            output,
        )
        return
    click.echo(
        f"Config is valid: {counted(counts['flavors'], 'flavor')}, "
        f"{counted(counts['queues'], 'queue')}, {counted(counts['rules'], 'rule')}."
    )
    for issue in advisories:
        o.declare(f"Warning: {issue}")


def _print_invalid(path: str, error: ConfigError, output: str) -> None:
    """Every problem of an invalid config: one per line after the ``Error:`` line, or the
    structured list."""
    if output != "table":
        o.dump({"valid": False, "errors": [issue.as_dict() for issue in error.errors]}, output)
    else:
        click.echo(
            f"Error: {_named(path)} is not a valid scheduler config "
            f"({counted(len(error.errors), 'problem')}):",
            err=True,
        )
        for issue in error.errors:
            click.echo(str(issue), err=True)
    click.get_current_context().exit(1)


def _print_change(changes: Sequence[str], warnings: Sequence[dict[str, Any]], tense: str) -> None:
    """A new version's warnings and what it changes (``tense``: "would change", "changed")."""
    for issue in warnings:
        o.declare(f"Warning: {issue['path']}: {issue['message']}")
    if changes:
        o.declare(f"This {tense}:")
        for line in changes:
            o.declare(f"  {line}")
    else:
        # Before any version, the config in force is the empty one (not an active version).
        o.declare("No change from the config in force (a new version is made all the same).")


def _version_of(active: Any) -> int:
    """The active config's version number (0: none yet), for ``based_on``."""
    return 0 if active is None else int(active.as_dict()["version"])


def _print_applied(applied: dict[str, Any], output: str, *, confirmed: bool) -> None:
    """The applied version; its warnings and change too, unless shown before the question."""
    if output != "table":
        o.dump(applied, output)
        return
    if not confirmed:
        _print_change(applied["changes"], applied["warnings"], "changed")
    version = applied["version"]
    click.echo(
        f"Scheduler config version {version['version']} is active: "
        f"{counted(version['flavors'], 'flavor')}, {counted(version['queues'], 'queue')}, "
        f"{counted(version['rules'], 'rule')}."
    )
    if applied["orphaned"]:
        orphans = len(applied["orphaned"])
        o.declare(
            f"{counted(orphans, 'admitted workload')} whose queue or flavor this version "
            f"removes {'keeps' if orphans == 1 else 'keep'} running, charged to no quota, "
            f"until {'it ends' if orphans == 1 else 'they end'}: " + ", ".join(applied["orphaned"])
        )
    for key, verb in (("admitted", "admitted"), ("failed", "rejected or failed")):
        if applied[key]:
            o.declare(f"{counted(len(applied[key]), 'queued workload')} {verb} under it.")
    if applied["preempted"]:
        o.declare(f"{counted(len(applied['preempted']), 'running workload')} preempted under "
                  "it: " + ", ".join(applied["preempted"]))


@config.command("apply")
@click.option("-f", "--file", "path", required=True, metavar="PATH",
              help="The scheduler config YAML file ('-' for stdin).")
@click.option("--yes", "-y", is_flag=True, help="Apply without asking to confirm.")
@o.output_option
def apply(path: str, yes: bool, output: str) -> None:
    """Validate a config and make it the new active version (warns when no catch-all rule)."""
    from fairpool.frontends.config import ConfigError, load_config

    answers = _answers(path, yes)
    text = read_config_file(path)
    try:
        load_config(text)
    except ConfigError as error:
        _print_invalid(path, error, output)
        return
    svc = scheduling()
    based_on = None
    if not yes:
        # A changed queue, or a submitter's token, is refused before the change is shown and
        # confirmed, not after.
        service().check_admin()
        try:
            preview = svc.preview_config(text).as_dict()
        except ConfigError as error:
            _print_invalid(path, error, output)
            return
        _print_change(preview["changes"], preview["warnings"], "would change")
        with answers:
            click.confirm("Apply it as a new version?", abort=True, err=True)
        based_on = int(preview["based_on"])  # what was confirmed is what changes
    try:
        applied = svc.apply_config(text, based_on)
    except ConfigError as error:  # e.g. a queue whose spec differs from an earlier version
        _print_invalid(path, error, output)
        return
    _print_applied(applied.as_dict(), output, confirmed=not yes)


@config.command("rollback")
@click.option("--version", "version", type=int, required=True, help="The version to apply again.")
@click.option("--yes", "-y", is_flag=True, help="Roll back without asking to confirm.")
@o.output_option
def rollback(version: int, yes: bool, output: str) -> None:
    """Apply an earlier version again, as a new version (history is never rewritten)."""
    from fairpool.frontends.config import load_config, warnings

    svc = scheduling()
    based_on = None
    if not yes:
        service().check_admin()
        active = svc.get_config()
        changes = svc.diff_config(version)  # first: it names an unknown version
        found = svc.get_config(version)
        advisories = (warnings(load_config(found.as_dict()["document"], stored=True))
                      if found else ())
        _print_change(changes, [issue.as_dict() for issue in advisories], "would change")
        click.confirm(f"Apply version {version} again as a new version?", abort=True, err=True)
        based_on = _version_of(active)
    _print_applied(svc.rollback_config(version, based_on).as_dict(), output, confirmed=not yes)


@config.command("get")
@click.option("--version", "version", type=int, default=None,
              help="A version number (default: the active one).")
@click.option("--output", "-o", "output", type=click.Choice(("yaml", "json")), default="yaml",
              show_default=True, help="yaml: the document as applied; json: its canonical form.")
def get(version: int | None, output: str) -> None:
    """Print a config version: the active one by default."""
    from fairpool.frontends.config import load_config

    found = scheduling().get_config(version)
    if found is None:
        raise click.ClickException(
            "no scheduler config has been applied yet (every workload passes through): "
            "fairpool config apply -f FILE"
        )
    data = found.as_dict()
    if output == "yaml":
        o.declare(f"# version {data['version']}{' (active)' if data['active'] else ''}, "
                  f"applied {data['applied_at']}")
        click.echo(data["document"], nl=not data["document"].endswith("\n"))
    else:
        data.pop("document")
        data["config"] = load_config(found.as_dict()["document"], stored=True).to_dict()
        o.dump(data, output)


@config.command("list")
@o.output_option
def list_versions(output: str) -> None:
    """Every applied version, newest first."""
    rows = []
    for version in scheduling().list_configs():
        row = version.as_dict()
        row.pop("document", None)
        rows.append(row)
    o.print_list(rows, ("version", "active", "applied_at", "rolled_back_from", "flavors",
                        "queues", "rules"), output,
                 empty_message="No scheduler config applied yet: every workload passes through.")


@config.command("diff")
@click.option("--version", "version", type=int, required=True,
              help="The version to compare the active one with.")
@o.output_option
def diff(version: int, output: str) -> None:
    """What applying a version again (--version N) would change, queue by queue."""
    changes = scheduling().diff_config(version)
    if output != "table":
        o.dump({"version": version, "changes": list(changes)}, output)
    elif not changes:
        click.echo(f"Version {version} is the same as the active config.")
    else:
        for line in changes:
            click.echo(line)


@config.command("explain")
@workload_options
@o.output_option
def explain(output: str, **options: Any) -> None:
    """Which rule, queue, flavor and priority a workload would get now (behind those that
    wait); and why not others."""
    data = scheduling().explain(**workload_fields(options)).as_dict()
    if output != "table":
        o.dump(data, output)
        return
    o.print_properties("Scheduling decision", [
        ("status", data["status"]),
        ("rule", "" if data["rule"] is None else f"scheduling_rules[{data['rule']}]"),
        ("queue", data["queue"]),
        ("flavors", data["flavors"]),
        ("priority", data["priority"]),
        ("position", data["position"]),
        ("reason", data["reason"]),
        ("config_version", data["config_version"]),
    ])
    for note in data["notes"]:
        click.echo(f"  note: {note}")
