"""``fairpool node | pool-tree | pool | operation ...``: YTsaurus-style pool trees (seed 003).

Names and options follow YTsaurus: tree options and pool attributes keep their YTsaurus names
(``fairpool pool set project-batch --tree physical weight 10``), durations are milliseconds.
Embedded or through a server (``--url``): the same commands, the same output.
"""

from __future__ import annotations

from typing import Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import parse_mapping, trees
from fairpool.cli.config import read_config_file
from fairpool.views import OPERATION_STATUSES

NODE_COLUMNS = ("name", "tags", "resources", "tree", "running_jobs", "used")
TREE_COLUMNS = ("name", "default", "nodes", "pools", "running_operations", "pending_operations",
                "resources")
ELEMENT_COLUMNS = ("element", "fair_share", "usage_share", "demand_share", "dominant_resource",
                   "weight", "starving", "operations")
OPERATION_COLUMNS = ("id", "tree", "pool", "user", "status", "running_jobs", "pending_jobs",
                     "reason")

PLACEMENT_SHARES = ("fair_share", "usage_share", "demand_share", "dominant_resource",
                    "satisfaction", "starving")
PLACEMENT_COLUMNS = ("tree", "pool", "weight", "resource_limits", "status", "running_jobs",
                     *PLACEMENT_SHARES, "reason")

#: Preempted jobs ``operation describe`` lists in its table (all of them in JSON / YAML).
PREEMPTED_ROWS = 10

#: ``pool set p weight -1``: a VALUE starting with '-' is the value, not an unknown option.
NEGATIVE_VALUES = {"ignore_unknown_options": True}

tree_option = click.option("--tree", default=None,
                           help="The pool tree (default: the default_tree).")


def _tree_required(func: Any) -> Any:
    return click.option("--tree", required=True, help="The pool tree.")(func)


# -- node --------------------------------------------------------------------------------------


@click.group("node")
def node() -> None:
    """Cluster nodes: tags (for trees' node_tag_filter) and resources."""


@node.command("add")
@click.argument("name")
@click.option("--tags", default="", help="Comma-separated tags, e.g. gpu,a100.")
@click.option("--resources", required=True,
              help='JSON or YAML mapping, e.g. \'{"cpu": 64, "memory": "512GiB", "gpu": 8}\'.')
@o.output_option
def add_node(name: str, tags: str, resources: str, output: str) -> None:
    """Add a node; every tree whose filter selects it grows at once."""
    given = parse_mapping("resources", resources) or {}
    tag_list = [tag.strip() for tag in tags.split(",") if tag.strip()]
    view = trees().add_node(name, tag_list, given).as_dict()
    _print_node(view, output)


@node.command("list")
@o.output_option
def list_nodes(output: str) -> None:
    """Nodes, their tree and what runs on them."""
    rows = [n.as_dict() for n in trees().list_nodes()]
    o.print_list(rows, NODE_COLUMNS, output, empty_message="No nodes found.")


@node.command("remove")
@click.argument("name")
def remove_node(name: str) -> None:
    """Remove a node that runs no jobs."""
    trees().remove_node(name)
    o.declare(f"Node '{name}' removed.")


def _print_node(data: dict[str, Any], output: str) -> None:
    if output != "table":
        o.dump(data, output)
        return
    o.print_properties(f"Node '{data['name']}'", [(key, data[key]) for key in NODE_COLUMNS])


# -- pool-tree ---------------------------------------------------------------------------------


@click.group("pool-tree")
def pool_tree() -> None:
    """Pool trees: their config, pools and dynamic characteristics."""


@pool_tree.command("create")
@click.argument("name")
@click.option("--node-tag-filter", default=None, help="Which nodes belong to the tree.")
@click.option("--main-resource", default=None, help="The resource guarantees must name.")
@click.option("--config", "config", default=None,
              help="More tree options as a JSON or YAML mapping.")
@click.option("--config-file", default=None, metavar="PATH",
              help="A whole tree as YAML (name, config, pools), applied as one change.")
@o.output_option
def create_tree(
    name: str, node_tag_filter: str | None, main_resource: str | None, config: str | None,
    config_file: str | None, output: str,
) -> None:
    """Create a tree (the first one becomes the default_tree)."""
    options = parse_mapping("config", config) or {}
    if node_tag_filter is not None:
        options["node_tag_filter"] = node_tag_filter
    if main_resource is not None:
        options["main_resource"] = main_resource
    service = trees()
    if config_file is not None:
        if options:
            raise click.UsageError("--config-file describes the whole tree; give the other "
                                   "options in it")
        service.apply_tree(read_config_file(config_file), name, create=True)
        _print_tree(service.show_tree(name).as_dict(), output)
        return
    _print_tree(service.create_tree(name, options).as_dict(), output)


@pool_tree.command("apply")
@click.option("-f", "--file", "path", required=True, metavar="PATH",
              help="A whole tree as YAML ('-' for stdin).")
@o.output_option
def apply_tree(path: str, output: str) -> None:
    """Create or update a whole tree; pools missing from the file are deleted. Idempotent."""
    applied = trees().apply_tree(read_config_file(path)).as_dict()
    if output != "table":
        o.dump(applied, output)
        return
    if not applied["changes"]:
        click.echo(f"Pool tree '{applied['tree']}' is unchanged.")
    for change in applied["changes"]:
        click.echo(change)


@pool_tree.command("set", context_settings=NEGATIVE_VALUES)
@click.argument("name")
@click.argument("option")
@click.argument("value")
@o.output_option
def set_tree(name: str, option: str, value: str, output: str) -> None:
    """Set one tree option, e.g. fair_share_starvation_timeout 1000 (milliseconds)."""
    _print_tree(trees().set_tree(name, option, value).as_dict(), output)


@pool_tree.command("delete")
@click.argument("name")
def delete_tree(name: str) -> None:
    """Delete a tree and its pools (no started operations; ended ones lose their history
    in it). Nodes stay: they belong to no tree."""
    trees().delete_tree(name)
    o.declare(f"Pool tree '{name}' deleted.")


@pool_tree.command("show")
@click.argument("name", required=False)
@o.output_option
def show_tree(name: str | None, output: str) -> None:
    """The tree with fair / usage / demand share, dominant resource and starvation."""
    _print_tree(trees().show_tree(name).as_dict(), output)


@pool_tree.command("export")
@click.argument("name", required=False)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml",
              show_default=True, help="The document's format.")
def export_tree(name: str | None, output: str) -> None:
    """The tree as a document `pool-tree apply -f` takes: its config and its pools with
    their options (ephemeral pools left out). Applied unchanged, it changes nothing."""
    o.dump(trees().export_tree(name), output)


@pool_tree.command("list")
@o.output_option
def list_trees(output: str) -> None:
    """Pool trees: the default one marked, nodes, pools, operations and resources."""
    rows = [t.as_dict() for t in trees().list_trees()]
    o.print_list(rows, TREE_COLUMNS, output, empty_message="No pool trees found.")


@pool_tree.command("default")
@click.argument("name", required=False)
def default_tree(name: str | None) -> None:
    """Show the default_tree, or set it to NAME."""
    click.echo(trees().default_tree(name) or "No default_tree set.")


@pool_tree.command("reconcile")
@click.argument("name", required=False)
@o.output_option
def reconcile_tree(name: str | None, output: str) -> None:
    """One pass by hand: promote pending operations, grant jobs, preempt for starving ones."""
    _print_tree(trees().reconcile(name).as_dict(), output)


def _print_tree(data: dict[str, Any], output: str) -> None:
    if output != "table":
        o.dump(data, output)
        return
    o.print_properties(f"Pool tree '{data['name']}'", [
        (key, data[key]) for key in ("default", "config", "nodes", "resources", "pools",
                                     "running_operations", "pending_operations")
    ])
    rows = [
        {
            **row,
            # Operation ids cut to 8 characters, as `operation describe` accepts prefixes
            # ("another operation", what a submitter reads of another's, whole).
            "element": "  " * row["depth"]
            + (row["name"][:8] if row["kind"] == "operation" and len(row["name"]) == 36
               else row["name"]),
            "starving": "starving" if row["starving"] else "",
            "operations": f"{row['running_operations']}/{row['operations']}"
            if row["operations"] is not None else row["status"],
        }
        for row in data["elements"]
    ]
    if rows:
        o.print_table(rows, ELEMENT_COLUMNS)
    for warning in data["warnings"]:
        o.declare(f"Warning: {warning}")


# -- pool --------------------------------------------------------------------------------------


@click.group("pool")
def pool() -> None:
    """Pools of a pool tree (YTsaurus scheduler_pool attributes)."""


@pool.command("create")
@click.argument("name")
@_tree_required
@click.option("--parent", default=None, help="Parent pool (default: the tree's root).")
@click.option("--weight", default=None, help="Share of the parent's resources (positive).")
@click.option("--strong-guarantee", default=None,
              help='strong_guarantee_resources, e.g. \'{"cpu": 100}\'.')
@click.option("--resource-limits", default=None, help='resource_limits, e.g. \'{"cpu": 10}\'.')
@click.option("--mode", type=click.Choice(("fair_share", "fifo")), default=None)
@click.option("--max-running-operation-count", type=int, default=None)
@click.option("--max-operation-count", type=int, default=None)
@click.option("--config", "config", default=None,
              help="Any other pool attributes as a JSON or YAML mapping.")
@o.output_option
def create_pool(
    name: str, tree: str, parent: str | None, weight: str | None, strong_guarantee: str | None,
    resource_limits: str | None, mode: str | None, max_running_operation_count: int | None,
    max_operation_count: int | None, config: str | None, output: str,
) -> None:
    """Create a pool, validated with the whole tree."""
    from fairpool.frontends.yaml_text import load_yaml  # only now, as parse_mapping's

    options: dict[str, Any] = parse_mapping("config", config) or {}
    flags: dict[str, Any] = {
        # As `pool set NAME weight VALUE` reads it: YAML (quoted, it is text, refused).
        "weight": None if weight is None else load_yaml("weight", weight, weight),
        "strong_guarantee_resources": parse_mapping("strong_guarantee", strong_guarantee),
        "resource_limits": parse_mapping("resource_limits", resource_limits),
        "mode": mode,
        "max_running_operation_count": max_running_operation_count,
        "max_operation_count": max_operation_count,
    }
    options.update({key: value for key, value in flags.items() if value is not None})
    _print_pool(trees().create_pool(tree, name, parent, options).as_dict(), output)


@pool.command("set", context_settings=NEGATIVE_VALUES)
@click.argument("name")
@_tree_required
@click.argument("option")
@click.argument("value")
@o.output_option
def set_pool(name: str, tree: str, option: str, value: str, output: str) -> None:
    """Set one attribute (parent moves the pool), e.g. weight 10."""
    _print_pool(trees().set_pool(tree, name, option, value).as_dict(), output)


@pool.command("describe")
@click.argument("name")
@tree_option
@o.output_option
def describe_pool(name: str, tree: str | None, output: str) -> None:
    """Every attribute, the effective_* values, operation counts and shares."""
    _print_pool(trees().describe_pool(tree, name).as_dict(), output)


@pool.command("delete")
@click.argument("name")
@_tree_required
def delete_pool(name: str, tree: str) -> None:
    """Delete a pool with no child pools and no started operations."""
    trees().delete_pool(tree, name)
    o.declare(f"Pool '{name}' deleted from tree '{tree}'.")


def _print_pool(data: dict[str, Any], output: str) -> None:
    if output != "table":
        o.dump(data, output)
        return
    keys = ("tree", "parent", "ephemeral", "config", "children", "running_operation_count",
            "operation_count", "fair_share", "usage_share", "demand_share", "dominant_resource",
            "satisfaction", "weight", "starving", "below_fair_share_since")
    o.print_properties(f"Pool '{data['name']}'", [(key, data[key]) for key in keys])
    # The shares per resource, the strong guarantee as scaled and clamped: only JSON had them.
    o.print_properties("Detailed fair share", list(data["detailed"].items()))
    o.print_properties("Effective values", list(data["effective"].items()))
    if data["integral"] is not None:
        o.print_properties("Integral guarantees", list(data["integral"].items()))


# -- operation ---------------------------------------------------------------------------------


@click.group("operation")
def operation() -> None:
    """Operations: N identical jobs in a pool of a tree."""


@operation.command("start")
@click.option("--tree", "tree_names", multiple=True,
              help="A pool tree it runs in; repeat for several (YTsaurus pool_trees). "
              "Default: the default_tree.")
@click.option("--pool", default=None,
              help="Its pool in each tree (default: the user's name, ephemeral).")
@click.option("--user", required=True, help="Who starts it.")
@click.option("--job-resources", required=True,
              help='One job\'s resources, e.g. \'{"cpu": 1, "memory": "4GiB"}\'.')
@click.option("--job-count", type=int, required=True, help="How many jobs.")
@click.option("--weight", default="1", show_default=True,
              help="Weight within its pool, in each tree.")
@click.option("--gang", is_flag=True, help="All jobs at once or none.")
@click.option("--resource-limits", default=None,
              help="The operation's own resource_limits, in each tree.")
@click.option("--tree-options", default=None,
              help="Per tree, what differs from --pool / --weight / --resource-limits "
              "(YTsaurus scheduling_options_per_pool_tree), e.g. "
              "'{\"cpus\": {\"pool\": \"nightly\", \"weight\": 2}}'.")
@click.option("--interruptible", is_flag=True,
              help="Its jobs, when preempted, are interrupted first and keep their units for "
              "the tree's allocation_preemption_timeout.")
@o.output_option
def start_operation(
    tree_names: tuple[str, ...], pool: str | None, user: str, job_resources: str, job_count: int,
    weight: str, gang: bool, resource_limits: str | None, tree_options: str | None,
    interruptible: bool, output: str,
) -> None:
    """Start an operation in one or more trees: rejected at a max_operation_count of any of
    them, pending at max_running_operation_count, else running with the jobs that fit. Its
    jobs run in any of its trees; pending jobs are one count for all of them."""
    view = trees().start_operation(
        trees=tree_names, pool=pool, user=user,
        job_resources=parse_mapping("job_resources", job_resources) or {},
        job_count=job_count, weight=weight, gang=gang,
        resource_limits=parse_mapping("resource_limits", resource_limits),
        interruptible=interruptible,
        tree_options=parse_mapping("tree_options", tree_options),
    )
    _print_operation(view.as_dict(), output)


@operation.command("describe")
@click.argument("operation_id")
@o.output_option
def describe_operation(operation_id: str, output: str) -> None:
    """Fair share, running / pending jobs, why pending, interrupted and preempted jobs."""
    _print_operation(trees().describe_operation(operation_id).as_dict(), output)


@operation.command("list")
@click.option("--tree", default=None, help="Only operations in this pool tree (default: all).")
@click.option("--status", type=click.Choice(OPERATION_STATUSES), default=None,
              help="Only operations with this status.")
@o.page_options("operations")
@o.output_option
def list_operations(
    tree: str | None, status: str | None, page: tuple[int | None, int], output: str
) -> None:
    """Operations, oldest first: tree, pool, user, status, jobs and reason."""
    limit, offset = page
    o.print_page(trees().operation_page(tree, status, limit=limit, offset=offset),
                 OPERATION_COLUMNS, output, empty_message="No operations found.")


@operation.command("complete")
@click.argument("operation_id")
@o.output_option
def complete_operation(operation_id: str, output: str) -> None:
    """The operation finished: its jobs' units return."""
    _print_operation(trees().complete_operation(operation_id).as_dict(), output)


@operation.command("abort")
@click.argument("operation_id")
@o.output_option
def abort_operation(operation_id: str, output: str) -> None:
    """Stop the operation: its jobs' units return."""
    _print_operation(trees().abort_operation(operation_id).as_dict(), output)


def _print_operation(data: dict[str, Any], output: str) -> None:
    if output != "table":
        o.dump(data, output)
        return
    keys: tuple[str, ...] = (
        "id", "tree", "pool", "user", "status", "reason", "job_resources", "job_count", "gang",
        "interruptible", "weight", "resource_limits", "running_jobs", "pending_jobs", "nodes",
        "interrupting_jobs", "preempted_jobs", *PLACEMENT_SHARES, "created_at", "started_at",
        "finished_at",
    )
    if len(data["trees"]) > 1:  # its shares are per tree: in the table below
        keys = tuple(key for key in keys if key not in PLACEMENT_SHARES)
    o.print_properties(f"Operation '{data['id']}'", [(key, data.get(key)) for key in keys])
    if len(data["trees"]) > 1:
        rows = [{**row, "starving": "starving" if row.get("starving") else ""}
                for row in data["trees"]]
        o.print_section("Pool trees", rows, PLACEMENT_COLUMNS, empty_message="")
    if data["interrupting"]:
        o.print_section("Interrupting jobs", data["interrupting"],
                        ("job", "node", "preempted_by", "deadline", "reason"), empty_message="")
    if data["preempted"]:  # in preemption order: the newest ten, saying what is left out
        shown = data["preempted"][-PREEMPTED_ROWS:]
        earlier = len(data["preempted"]) - len(shown)
        title = "Preempted jobs" + (
            f" (the newest {len(shown)}; {earlier} earlier not shown)" if earlier else "")
        o.print_section(title, shown, ("job", "node", "preempted_by", "at", "reason"),
                        empty_message="")
