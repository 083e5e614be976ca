"""``fairpool resource-pool ...``: ZenML v1's ``zenml resource-pool`` commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from fairpool.cli import output as o
from fairpool.cli.common import parse_mapping, service
from fairpool.views import COMPONENT_TYPES

POOL_COLUMNS = ("id", "name", "capacity", "occupied", "queue_length")
POLICY_COLUMNS = ("id", "component", "component_type", "pool", "priority", "reserved", "limit",
                  "created")
POOL_REQUEST_COLUMNS = ("id", "state", "status", "component", "resources", "position", "reason")
ACTIVE_COLUMNS = ("id", "component", "resources", "priority", "allocated_at")
QUEUED_COLUMNS = ("id", "component", "resources", "position", "reason")


F = TypeVar("F", bound=Callable[..., Any])


def policy_arguments(help: str) -> Callable[[F], F]:
    """``POOL COMPONENT [--component-type T]``: the policy a command is about."""
    def decorate(command: F) -> F:
        command = click.option(
            "--component-type", "-t", type=click.Choice(COMPONENT_TYPES), default="orchestrator",
            show_default=True, help=help,
        )(command)
        return click.argument("resource_pool_name_or_id")(click.argument("component")(command))

    return decorate


def occupied_cell(pool: dict[str, Any]) -> str:
    """Occupied vs total per key, e.g. ``gpu 6/8, step_run 6/32``; a key held that the
    pool no longer has shows its total as 0."""
    occupied = pool.get("occupied") or {}
    capacity = pool["capacity"]
    return ", ".join(
        f"{key} {occupied.get(key, 0)}/{capacity.get(key, 0)}"
        for key in {**capacity, **occupied}
    )


def queue_place(request: dict[str, Any], pool_name: str) -> dict[str, Any] | None:
    """The request's queue entry for one pool, if it waits there."""
    for place in request.get("queue") or ():
        if place.get("pool") == pool_name:
            return dict(place)
    return None


def position_cell(place: dict[str, Any] | None) -> str:
    if place is None:
        return ""
    position = place.get("position")
    if not position:
        return "not eligible"
    return f"{position} (holding)" if place.get("holding") else str(position)


def request_row(request: dict[str, Any], pool_name: str) -> dict[str, Any]:
    """A table row for a request as seen from one pool."""
    row = dict(request)
    if request.get("state") == "active":
        row["position"] = row["reason"] = ""
        return row
    place = queue_place(request, pool_name)
    row["position"] = position_cell(place)
    row["reason"] = (place or {}).get("reason") or request.get("status_reason") or ""
    return row


def pool_row(pool: dict[str, Any]) -> dict[str, Any]:
    return {**pool, "occupied": occupied_cell(pool)}


def policy_row(policy: dict[str, Any]) -> dict[str, Any]:
    return dict(policy)


def print_pool(pool: dict[str, Any], output: str) -> None:
    """One pool: the object (json/yaml), or ZenML's key/value table plus its policies and
    requests."""
    if output != "table":
        o.dump(pool, output)
        return
    name = pool["name"]
    o.print_properties(
        f"Resource pool '{name}'",
        [
            ("id", pool["id"]),
            ("name", name),
            ("description", pool.get("description")),
            ("capacity", pool["capacity"]),
            ("occupied", occupied_cell(pool)),
            ("queue_length", pool.get("queue_length")),
            ("created", pool.get("created")),
            ("updated", pool.get("updated")),
        ],
    )
    o.print_section(
        "Policies",
        [policy_row(p) for p in pool.get("policies") or ()],
        ("id", "component", "component_type", "priority", "reserved", "limit"),
        empty_message="no policies attached.",
    )
    o.print_section(
        "Active requests",
        [request_row(r, name) for r in pool.get("active_requests") or ()],
        ACTIVE_COLUMNS,
        empty_message="none.",
    )
    o.print_section(
        "Queued requests",
        [request_row(r, name) for r in pool.get("queued_requests") or ()],
        QUEUED_COLUMNS,
        empty_message="none.",
    )


@click.group("resource-pool")
def resource_pool() -> None:
    """Create, inspect and manage resource pools and their policies."""


@resource_pool.command("create")
@click.argument("name")
@click.option(
    "--capacity", "-c", required=True, metavar="JSON|YAML",
    help='Capacity per resource key, e.g. \'{"gpu": 8, "step_run": 32}\'.',
)
@click.option("--description", "-d", default=None, help="Description of the pool.")
@o.output_option
def create(name: str, capacity: str, description: str | None, output: str) -> None:
    """Create a resource pool."""
    parsed = parse_mapping("capacity", capacity)
    assert parsed is not None
    with o.spinner(f"Creating resource pool '{name}'...\n"):
        pool = service().create_pool(name, parsed, description)
    o.declare(f"Created resource pool `{pool.name}`.")
    print_pool(pool.as_dict(), output)


@resource_pool.command("list")
@o.output_option
def list_pools(output: str) -> None:
    """List resource pools with occupied vs total capacity."""
    pools = [pool.as_dict() for pool in service().list_pools()]
    o.print_list(
        pools, POOL_COLUMNS, output,
        empty_message="No resource pools found.", row_formatter=pool_row,
    )


@resource_pool.command("describe")
@click.argument("name_id_or_prefix")
@o.output_option
def describe(name_id_or_prefix: str, output: str) -> None:
    """Show one resource pool (name, ID prefix or full ID)."""
    print_pool(service().get_pool(name_id_or_prefix).as_dict(), output)


@resource_pool.command("update")
@click.argument("name_id_or_prefix")
@click.option(
    "--capacity", "-c", default=None, metavar="JSON|YAML",
    help="New capacity per key; 0 removes a key from the pool.",
)
@click.option("--description", "-d", default=None, help="New description.")
@o.output_option
def update(
    name_id_or_prefix: str, capacity: str | None, description: str | None, output: str
) -> None:
    """Update a resource pool's capacity or description."""
    if capacity is None and description is None:
        service().get_pool(name_id_or_prefix)  # ZenML's words, but a typo is still told
        o.declare("No updates specified.")
        return
    parsed = parse_mapping("capacity", capacity)
    with o.spinner(f"Updating resource pool '{name_id_or_prefix}'...\n"):
        pool = service().update_pool(name_id_or_prefix, parsed, description)
    o.declare(f"Updated resource pool `{pool.name}`.")
    print_pool(pool.as_dict(), output)


@resource_pool.command("delete")
@click.argument("name_id_or_prefix")
@click.option("--yes", "-y", is_flag=True, default=False, help="Don't ask for confirmation.")
def delete(name_id_or_prefix: str, yes: bool) -> None:
    """Delete a resource pool (refused while it has live allocations)."""
    svc = service()
    if not yes:  # a submitter is refused before it is asked, not after
        svc.check_admin()
    name = svc.get_pool(name_id_or_prefix).name
    if not yes and not click.confirm(
        f"Are you sure you want to delete resource pool `{name}`?", err=True
    ):
        o.declare("Resource pool deletion canceled.")
        return
    svc.delete_pool(name_id_or_prefix)
    o.declare(f"Deleted resource pool `{name}`.")


@resource_pool.command("attach-policy")
@policy_arguments("Kind of stack component that sends the requests.")
@click.option(
    "--priority", "-p", type=int, required=True, help="Higher means preferred in the queue."
)
@click.option("--reserved", "-r", default=None, metavar="JSON|YAML", help="Reserved per key.")
@click.option("--limit", "-l", default=None, metavar="JSON|YAML", help="Limit per key.")
def attach_policy(
    resource_pool_name_or_id: str,
    component: str,
    component_type: str,
    priority: int,
    reserved: str | None,
    limit: str | None,
) -> None:
    """Attach a component's policy (priority, reserved, limit) to a resource pool."""
    reserved_map = parse_mapping("reserved", reserved) or {}
    limit_map = parse_mapping("limit", limit) or {}
    policy = service().attach_policy(
        resource_pool_name_or_id, component, component_type, priority, reserved_map, limit_map
    )
    o.declare(
        f"Attached pool policy for component `{policy.component}` to resource pool "
        f"`{policy.pool}` with priority {policy.priority}."
    )


@resource_pool.command("update-policy")
@policy_arguments("Kind of stack component.")
@click.option("--priority", "-p", type=int, default=None, help="New priority.")
@click.option(
    "--reserved", "-r", default=None, metavar="JSON|YAML", help="New reserved per key (whole map)."
)
@click.option(
    "--limit", "-l", default=None, metavar="JSON|YAML", help="New limit per key (whole map)."
)
@o.output_option
def update_policy(
    resource_pool_name_or_id: str,
    component: str,
    component_type: str,
    priority: int | None,
    reserved: str | None,
    limit: str | None,
    output: str,
) -> None:
    """Change a component's policy in place, in use or not (allocations keep their units)."""
    policy = service().update_policy(
        resource_pool_name_or_id, component, component_type, priority,
        parse_mapping("reserved", reserved), parse_mapping("limit", limit),
    )
    o.declare(
        f"Updated pool policy for component `{policy.component}` on resource pool "
        f"`{policy.pool}`."
    )
    shown = policy.as_dict()
    if output != "table":
        o.dump(shown, output)
        return
    o.print_properties(
        f"Policy of {policy.component_type} '{policy.component}' on '{policy.pool}'",
        [(field, shown[field]) for field in (
            "id", "priority", "reserved", "limit", "effective_reserved", "effective_limit")],
    )


@resource_pool.command("detach-policy")
@policy_arguments("Kind of stack component.")
def detach_policy(resource_pool_name_or_id: str, component: str, component_type: str) -> None:
    """Remove a component's policy from a resource pool."""
    service().detach_policy(resource_pool_name_or_id, component, component_type)
    o.declare(
        f"Detached pool policy for component `{component}` from resource pool "
        f"`{resource_pool_name_or_id}`."
    )


@resource_pool.command("list-policies")
@click.argument("resource_pool_name_or_id", required=False)
@click.option("--component", "-c", default=None, help="Only this component's policies.")
@click.option(
    "--component-type", "-t", type=click.Choice(COMPONENT_TYPES), default=None,
    help="Only components of this type.",
)
@o.output_option
def list_policies(
    resource_pool_name_or_id: str | None,
    component: str | None,
    component_type: str | None,
    output: str,
) -> None:
    """List the policies of a pool, or the pools a component is attached to."""
    if resource_pool_name_or_id is None and component is None:
        raise click.UsageError("Specify a resource pool, a component (--component), or both.")
    policies = [
        p.as_dict()
        for p in service().list_policies(resource_pool_name_or_id, component, component_type)
    ]
    o.print_list(policies, POLICY_COLUMNS, output, empty_message="No policies found.")


@resource_pool.command("requests")
@click.argument("resource_pool_name_or_id")
@click.option(
    "--view", type=click.Choice(("queued", "active", "all")), default="all", show_default=True,
    help="Queued requests, active (allocated) ones, or both.",
)
@o.output_option
def requests(
    resource_pool_name_or_id: str, view: Literal["queued", "active", "all"], output: str
) -> None:
    """List the requests queued in or holding units of a pool."""
    svc = service()
    pool_name = svc.get_pool(resource_pool_name_or_id).name
    items = [r.as_dict() for r in svc.pool_requests(resource_pool_name_or_id, view)]
    o.print_list(
        items, POOL_REQUEST_COLUMNS, output,
        empty_message=f"No {'' if view == 'all' else view + ' '}requests in resource pool "
        f"`{pool_name}`.",
        row_formatter=lambda row: request_row(row, pool_name),
    )
