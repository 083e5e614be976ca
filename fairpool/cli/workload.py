"""``fairpool workload ...``: submit workloads to the scheduler config's queues and follow
them (seed 004). ``fairpool config explain`` takes the same options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import parse_pairs, reason_option, scheduling
from fairpool.frontends.labels import RESERVED_LABEL_KEYS
from fairpool.views import WORKLOAD_STATUSES

WORKLOAD_COLUMNS = ("id", "status", "queue", "flavors", "priority", "demand", "reason")

#: The reserved label keys, each set by its own flag (seed 004's "reserved keys").
_RESERVED_FLAGS = tuple((f"--{key}", key.replace("-", "_")) for key in RESERVED_LABEL_KEYS)
_RESOURCE_FLAGS = (("--gpu", "gpu"), ("--cpu", "cpu"), ("--memory-gb", "memory_gb"),
                   ("--tpu", "tpu"))


def workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Labels, reserved keys, priority and demand: what routing and flavors look at."""
    for flag, dest in reversed(_RESOURCE_FLAGS):
        func = click.option(flag, dest, default=None, metavar="UNITS",
                            help=f"{dest} asked for (up to 3 decimals).")(func)
    func = click.option("--priority", type=int, default=None,
                        help="Requested priority (default: the matching rule's default).")(func)
    for flag, dest in reversed(_RESERVED_FLAGS):
        func = click.option(flag, dest, default=None,
                            help=f"Reserved label {flag[2:]}.")(func)
    return click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
                        help="A custom tag (repeatable; a key given twice keeps its last value); "
                        "reserved keys have their own flags.")(
        func
    )


def workload_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The options as the service's keyword arguments."""
    return {
        "labels": parse_pairs("label", options["labels"]),
        "priority": options["priority"],
        "demand": {dest: options[dest] for _, dest in _RESOURCE_FLAGS
                   if options[dest] is not None},
        **{dest: options[dest] for _, dest in _RESERVED_FLAGS},
    }


def print_workload(data: dict[str, Any], output: str) -> None:
    if output != "table":
        o.dump(data, output)
        return
    o.print_properties(f"Workload '{data['id']}'", [
        ("id", data["id"]),  # a row of its own, as a request's: whole, to copy, at any width
        ("status", data["status"]),
        ("reason", data["reason"]),
        ("queue", data["queue"]),
        ("position", data["position"]),
        ("flavors", data["flavors"]),
        ("priority", data["priority"]),
        ("requested_priority", data["requested_priority"]),
        ("labels", data["labels"]),
        ("demand", data["demand"]),
        ("preemptions", data["preemptions"]),
        ("config_version", data["config_version"]),
        ("submitted_at", data["submitted_at"]),
        ("requeued_at", data["requeued_at"]),
        ("admitted_at", data["admitted_at"]),
        ("finished_at", data["finished_at"]),
    ])
    for note in data["notes"]:
        click.echo(f"  note: {note}")


@click.group("workload")
def workload() -> None:
    """Workloads routed by the scheduler config: submit, list, describe, release, cancel."""


@workload.command("submit")
@workload_options
@o.output_option
def submit(output: str, **options: Any) -> None:
    """Submit a workload: routed, given a flavor and admitted or queued at once."""
    data = scheduling().submit_workload(**workload_fields(options)).as_dict()
    print_workload(data, output)
    if data["status"] in ("failed", "rejected"):
        click.get_current_context().exit(1)


@workload.command("list")
@click.option("--status", type=click.Choice(WORKLOAD_STATUSES), default=None,
              help="Only workloads with this status.")
@click.option("--queue", default=None, help="Only workloads routed to this queue.")
@o.page_options("workloads")
@o.output_option
def list_workloads(
    status: str | None, queue: str | None, page: tuple[int | None, int], output: str
) -> None:
    """Workloads in submission order."""
    limit, offset = page
    o.print_page(scheduling().workload_page(status, queue, limit=limit, offset=offset),
                 WORKLOAD_COLUMNS, output, empty_message="No workloads found.")


@workload.command("describe")
@click.argument("workload_id")
@o.output_option
def describe(workload_id: str, output: str) -> None:
    """A workload: status, queue, flavors, priority, reason and position."""
    print_workload(scheduling().get_workload(workload_id).as_dict(), output)


@workload.command("release")
@click.argument("workload_id")
@o.output_option
def release(workload_id: str, output: str) -> None:
    """The workload ended: give its quota back."""
    print_workload(scheduling().release_workload(workload_id).as_dict(), output)


@workload.command("cancel")
@click.argument("workload_id")
@reason_option
@o.output_option
def cancel(workload_id: str, reason: str | None, output: str) -> None:
    """Withdraw a queued or admitted workload."""
    print_workload(scheduling().cancel_workload(workload_id, reason).as_dict(), output)
