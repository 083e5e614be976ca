"""``fairpool queue ...``: the active scheduler config's queues, usage against quota."""

from __future__ import annotations

from typing import Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import scheduling

USAGE_COLUMNS = ("flavor", "resource", "used", "nominal_quota", "workloads")


def _summary(queue: dict[str, Any]) -> dict[str, Any]:
    used = [f"{row['flavor'] or '-'} {row['resource']} {row['used']}"
            f"/{row['nominal_quota'] or 'unlimited'}"
            for row in queue["usage"] if row["nominal_quota"] is not None or row["used"] != "0"]
    return {**queue, "usage": ", ".join(used)}


@click.group("queue")
def queue() -> None:
    """Resource queues of the active scheduler config."""


@queue.command("list")
@o.output_option
def list_queues(output: str) -> None:
    """Every queue: passthrough or not, preemption, queued and admitted workloads, usage."""
    rows = [q.as_dict() for q in scheduling().list_queues()]
    o.print_list(
        [_summary(row) for row in rows] if output == "table" else rows,
        ("name", "passthrough", "preemption", "queued", "admitted", "usage"), output,
        empty_message="No queues: no scheduler config applied, or it has none.",
    )


@queue.command("describe")
@click.argument("name")
@o.output_option
def describe(name: str, output: str) -> None:
    """One queue: usage against quota per flavor and resource."""
    data = scheduling().describe_queue(name).as_dict()
    if output != "table":
        o.dump(data, output)
        return
    o.print_properties(f"Resource queue '{name}'", [
        (key, data[key]) for key in ("passthrough", "preemption", "queued", "admitted")
    ])
    # An unlimited resource's quota is None: said as `queue list` says it, not left blank.
    usage = [{**row, "nominal_quota": row["nominal_quota"] or "unlimited"}
             for row in data["usage"]]
    o.print_section("Usage against quota", usage, USAGE_COLUMNS, empty_message="none")
