"""``fairpool component ...``: who asks for units (orchestrators and step operators)."""

from __future__ import annotations

import click

from fairpool.cli import output as o
from fairpool.cli.common import service
from fairpool.views import COMPONENT_TYPES

COMPONENT_COLUMNS = ("id", "name", "type", "pools", "allocated", "queued", "created")


@click.group("component")
def component() -> None:
    """Components: known from their first policy (a request needs its component to have one)."""


@component.command("list")
@click.option(
    "--component-type", "-t", type=click.Choice(COMPONENT_TYPES), default=None,
    help="Only components of this type.",
)
@o.output_option
def list_components(component_type: str | None, output: str) -> None:
    """List components: the pools each has a policy on, its requests holding units and
    waiting."""
    rows = [c.as_dict() for c in service().list_components(component_type)]
    o.print_list(rows, COMPONENT_COLUMNS, output, empty_message="No components found.")
