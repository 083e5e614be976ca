"""``fairpool zenml ...``: set a ZenML installation up for fairpool.

Importing this module does not import ZenML (the ``fairpool`` command must start without
it); the commands do, and say how to install it when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from fairpool.integrations.zenml import FLAVOR_SOURCE, SOURCE

ENV_SOURCE = "ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE"


def _load(module: str) -> Any:
    try:
        # importlib: type checkers of the main project do not follow it into ZenML.
        return importlib.import_module(f"fairpool.integrations.zenml.{module}")
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "zenml":
            raise click.ClickException(
                "ZenML is not installed in this environment: pip install 'fairpool[zenml]'"
            ) from error
        raise


@click.group()
def zenml() -> None:
    """fairpool as ZenML's resource-pool implementation (ZenML 0.95-0.96)."""


@zenml.command()
@click.option(
    "--orchestrator", default="fairpool", show_default=True,
    help="Name of the fairpool_local orchestrator to register ('' for none).",
)
@click.option("--stack", default=None, help="Also register a stack with that orchestrator.")
@click.option("--set", "activate", is_flag=True, help="Activate the stack.")
def install(orchestrator: str, stack: str | None, activate: bool) -> None:
    """Register the fairpool_local orchestrator flavor (and an orchestrator, optionally a
    stack) on the connected ZenML store; report what is left to plug fairpool in.
    Idempotent."""
    try:
        report = _load("install").install(
            orchestrator=orchestrator or None, stack=stack, activate=activate
        )
    except ValueError as error:  # a name taken by something else: one line, exit 1
        raise click.ClickException(str(error)) from None
    for line in report.done:
        click.echo(f"ok: {line}")
    for line in report.todo:
        click.echo(line if line.startswith(" ") else f"todo: {line}")


@zenml.command()
def env() -> None:
    """Print the server setting that plugs fairpool in, for eval "$(fairpool zenml env)"."""
    click.echo(f"export {ENV_SOURCE}={SOURCE}")


@zenml.command()
def flavor() -> None:
    """Print the orchestrator flavor's source, for zenml orchestrator flavor register."""
    click.echo(FLAVOR_SOURCE)


if __name__ == "__main__":
    zenml()
