"""``fairpool config ...``: the scheduler config (seed 004; Anyscale's ``anyscale scheduler
config``). For now only ``validate``: every problem at once, each with its path.

Validation is local and pure (no store, no server), so this command never opens a database.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fairpool.cli import output as o


@click.group("config")
def config() -> None:
    """Scheduler config: flavors, queues and routing rules in one YAML document."""


def read_config_file(path: str) -> str:
    """The file's text (``-`` reads stdin); a file that cannot be read is one ``Error:`` line."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise click.ClickException(f"cannot read {path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise click.ClickException(f"cannot read {path}: not UTF-8 text") from None


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


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
        if output != "table":
            o.dump({"valid": False, "errors": [issue.as_dict() for issue in error.errors]}, output)
        else:
            click.echo(
                f"Error: {path} is not a valid scheduler config "
                f"({_plural(len(error.errors), 'problem')}):",
                err=True,
            )
            for issue in error.errors:
                click.echo(str(issue), err=True)
        click.get_current_context().exit(1)
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
        f"Config is valid: {_plural(counts['flavors'], 'flavor')}, "
        f"{_plural(counts['queues'], 'queue')}, {_plural(counts['rules'], 'rule')}."
    )
    for issue in advisories:
        o.declare(f"Warning: {issue}")
