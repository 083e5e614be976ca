"""What the API's routes answer, as its OpenAPI document shows them: the views
(``fairpool.views``, ``fairpool.scheduling``, ``fairpool.trees_service``), whose ``as_dict``
writes the JSON, and every list's one page shape (``fairpool.paging.page_dict``). Where an
``as_dict`` writes other than its view's fields (a ``SharesView`` flattened into its element,
usage rows, a config's issues) or a route builds its answer itself, a model here describes
the JSON as written, named after the view it describes if there is one. Documentation only:
the routes write their answers themselves. Without these, every answer's schema was ``{}``,
and a client generated from the document knew none of their fields (helper-96)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Generic, TypeVar, get_type_hints

from pydantic import BaseModel, create_model
from pydantic.json_schema import SkipJsonSchema

from fairpool import trees_service
from fairpool.scheduling import ConfigVersionView

V = TypeVar("V")


class Pagination(BaseModel):
    """Where a page stands among the items a list's filters match."""

    index: int
    max_size: int
    total_pages: int
    total: int
    #: The cursor to ask for the page after this one with (``after``); null: none follows.
    next: str | None


class Listed(BaseModel, Generic[V]):
    """A list's answer: one page of items."""

    items: list[V]
    pagination: Pagination


# -- the scheduler config, queues ------------------------------------------------------------


class ConfigIssue(BaseModel):
    """One problem or advisory of a config document: where, what, and its line if known."""

    path: str
    message: str
    #: Absent when the line is not known.
    line: int | SkipJsonSchema[None] = None


class ConfigValidation(BaseModel):
    """A valid document (``POST /config/validate``); an invalid one is a 400 or 422."""

    valid: bool
    #: Empty: a document with errors is answered 400 or 422, with them.
    errors: list[ConfigIssue]
    warnings: list[ConfigIssue]


class ConfigPreview(BaseModel):
    """What applying a document would change, worked out against the active version."""

    #: The active version's number (0: none yet), to apply the document ``based_on``.
    based_on: int
    changes: list[str]
    warnings: list[ConfigIssue]


class AppliedConfig(BaseModel):
    """What an apply or a rollback did: the new version, and the workloads it moved."""

    version: ConfigVersionView
    warnings: list[ConfigIssue]
    changes: list[str]
    orphaned: list[str]
    admitted: list[str]
    failed: list[str]
    preempted: list[str]


class ConfigDiff(BaseModel):
    """What applying a version again would change, queue by queue."""

    version: int
    changes: list[str]


class QueueUsage(BaseModel):
    """A queue's usage of one flavor's resource, in units as a user writes them ("0.5")."""

    #: Null on a passthrough queue (no flavors, no quota).
    flavor: str | None
    resource: str
    used: str
    #: Null: unlimited.
    nominal_quota: str | None
    workloads: int


class QueueView(BaseModel):
    """A queue of the active config, with its usage against quota."""

    name: str
    passthrough: bool
    preemption: str
    queued: int
    admitted: int
    usage: list[QueueUsage]


# -- pool trees ------------------------------------------------------------------------------


def _fields(view: type, *, without: tuple[str, ...] = ()) -> dict[str, Any]:
    """A view dataclass's fields as ``create_model`` takes them: each with its type, none
    with a default (``as_dict`` writes every field), but those ``without``."""
    hints = get_type_hints(view)
    return {f.name: (hints[f.name], ...) for f in fields(view) if f.name not in without}


class Shares(BaseModel):
    """An element's dynamic characteristics (``SharesView``), as YTsaurus's Orchid shows them."""

    dominant_resource: str
    fair_share: float
    usage_share: float
    demand_share: float
    #: usage / fair share on the dominant resource; null without a fair share.
    satisfaction: float | None
    weight: float
    starving: bool
    below_fair_share_since: str | None
    #: Per kind of share (strong_guarantee, ..., demand_share), per resource.
    detailed: dict[str, dict[str, float]]
    #: Burst and relaxed pools: YTsaurus's Orchid integral fields; null elsewhere.
    integral: dict[str, Any] | None


class LiveShares(BaseModel):
    """``Shares`` but the weight, all there while a one-tree operation is live, else absent."""

    dominant_resource: str | SkipJsonSchema[None] = None
    fair_share: float | SkipJsonSchema[None] = None
    usage_share: float | SkipJsonSchema[None] = None
    demand_share: float | SkipJsonSchema[None] = None
    satisfaction: float | None = None
    starving: bool | SkipJsonSchema[None] = None
    below_fair_share_since: str | None = None
    detailed: dict[str, dict[str, float]] | SkipJsonSchema[None] = None
    integral: dict[str, Any] | None = None


class TreeElement(Shares):
    """One line of a tree shown: the root, a pool or an operation, with its shares."""

    name: str
    #: root, pool or operation.
    kind: str
    depth: int
    #: Pools (and the root): running / started operations in the subtree; null otherwise.
    running_operations: int | None
    operations: int | None
    #: Operations: running or pending; null otherwise.
    status: str | None


class TreeView(BaseModel):
    """A pool tree: its options, nodes, counts and (shown) its elements depth first."""

    name: str
    default: bool
    #: The explicit options (YTsaurus's ``config`` attribute).
    config: dict[str, Any]
    resources: dict[str, int]
    nodes: list[str]
    pools: int
    running_operations: int
    pending_operations: int
    #: Empty in lists and in a create's or a change's answer.
    elements: list[TreeElement]
    warnings: list[str]


class TreeDocument(BaseModel):
    """A tree as ``POST /pool-trees/apply`` takes it: its name, options and nested pools."""

    name: str
    #: Absent when the tree has no explicit options.
    config: dict[str, Any] | SkipJsonSchema[None] = None
    #: Each pool's options by name, its children under its own ``pools``.
    pools: dict[str, dict[str, Any]]


class DefaultTreeName(BaseModel):
    """The tree commands use when they name none."""

    #: Null: no tree yet.
    default_tree: str | None


class TreePoolView(Shares):
    """A pool of a tree: its options, the values in effect, its operations and shares."""

    name: str
    tree: str
    parent: str | None
    ephemeral: bool
    #: Options set on the pool itself.
    config: dict[str, Any]
    #: Resolved values: presets applied, inherited pool -> parent -> tree.
    effective: dict[str, Any]
    children: list[str]
    running_operation_count: int
    operation_count: int


# The views' own fields, their shares flattened (``as_dict``): a field added to a view is
# described with it.
PlacementView = create_model(
    "PlacementView", __base__=LiveShares,
    __doc__="An operation in one of its trees: its pool, weight, limits, status and shares.",
    **_fields(trees_service.PlacementView, without=("shares",)))
OperationView = create_model(
    "OperationView", __base__=LiveShares,
    __doc__="An operation, its jobs and trees; its shares while live in one tree (not in lists).",
    interrupting_jobs=(int, ...), preempted_jobs=(int, ...),
    **_fields(trees_service.OperationView, without=("shares", "trees")),
    trees=(list[PlacementView], ...),  # type: ignore[valid-type]
)
