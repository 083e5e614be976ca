"""HTTP routes of the pool trees (seed 003): nodes, pool trees, their pools, operations.

Thin over ``TreesService``: each route is one service call and answers the view's
``as_dict()``, so the remote CLI prints what the embedded one prints. The bodies are strict
and bounded; what they cannot say (option names and values, resource keys, units, names) the
service checks and names the field, as it does for the CLI: 422. Unknown trees, pools, nodes
and operations answer 404; a name taken, an operation already ended, a pool or node still in
use answer 409.

Tree options and pool attributes keep their YTsaurus names and are sent as JSON values
(``{"weight": 10}``); ``PATCH`` sets one of them from its command-line text (``"10"``,
``"{cpu: 100}"``), as ``pool set`` and ``pool-tree set`` do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, params
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from fairpool.api.answers import (
    DefaultTreeName,
    Listed,
    OperationView,
    TreeDocument,
    TreePoolView,
    TreeView,
)
from fairpool.api.auth import Auth, Caller, answering, listed_for, owner_of
from fairpool.api.models import (
    DEFAULT_PAGE_SIZE,
    TEXT_PATTERN,
    IdempotencyHeader,
    IdempotencyKey,
    PageAfter,
    PageLimit,
    PageOffset,
    PathText,
    QueryText,
    one_key,
    text,
)
from fairpool.api.semantics import CREATED, located, segment
from fairpool.frontends.names import MAX_KEYS, MAX_NAME
from fairpool.frontends.trees import MAX_OPTION_TEXT, MAX_TAGS, MAX_TREE_DOCUMENT
from fairpool.paging import page_dict
from fairpool.store.tree_records import OperationStatus
from fairpool.trees_service import MAX_JOB_COUNT, AppliedTree, NodeView, TreesService

#: The body limit of the route that takes a whole-tree document: JSON may spell each of its
#: characters (``MAX_TREE_DOCUMENT``: the service checks it) as a 12-byte surrogate-pair escape.
MAX_TREE_DOCUMENT_BODY = 12 * MAX_TREE_DOCUMENT + 1024
#: A string the database stores as it is (no NUL, no lone surrogates); the service checks
#: what it must look like (names, resource keys, tag formulas) and how long it may be
#: (``MAX_OPTION_TEXT``), naming the field as the command line does; the body's size bounds
#: it here.
Text = Annotated[str, StringConstraints(pattern=TEXT_PATTERN), AfterValidator(text)]
#: A name in a body (a node's, a tree's, a pool's, a user's): the service checks what it
#: must look like and names the field as the command line does (``pool``, not the body's
#: ``name``); the body's size bounds its length.
BodyName = Annotated[str, StringConstraints(pattern=TEXT_PATTERN), AfterValidator(text)]
#: A key in resources: bounded by the service, as a name
#: (``MAX_NAME``), in its words embedded and remote.
OptionKey = BodyName


def _stored_as_is(options: dict[str, Any]) -> dict[str, Any]:
    """Every text in ``options`` (keys too, at any depth) is one the database stores as it
    is. The rest is the service's to check, in its words, as the command line's is: a shape
    checked here (it had lists and mappings of at most 64 entries, five levels deep) refused
    valid options (65 presets) and named no option in its errors. Iterative: the body's JSON
    may nest as deeply as the parser allows."""
    values: list[Any] = [options]
    while values:
        value = values.pop()
        if isinstance(value, str):
            text(value)
        elif isinstance(value, dict):
            for key in value:
                text(key)
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)
    return options


#: Options as JSON gives them; numbers may be infinite or NaN here, for the service to refuse
#: in the words of the option's own check ("weight: must be a finite number ..."), as the
#: command line does.
Options = Annotated[dict[str, Any], AfterValidator(_stored_as_is)]
#: A resource amount: an integer, or for ``memory`` a size such as "512GiB"; None too, for
#: the service to refuse after the key (``{cpu:1}`` in YAML is the key "cpu:1", no value).
Amount = int | Annotated[float, Field(allow_inf_nan=False)] | Text | None
Resources = Annotated[dict[OptionKey, Amount], Field(max_length=MAX_KEYS)]
#: Its text's length is the service's to bound, in its words.
Weight = int | float | Text
#: The text of one option value, as the command line gives it (parsed as YAML).
OptionText = Annotated[
    str, StringConstraints(max_length=MAX_OPTION_TEXT, pattern=TEXT_PATTERN), AfterValidator(text)
]

TreeName = Annotated[PathText, Path(description="The pool tree's name.")]
PathName = Annotated[PathText, Path(description="A node's or pool's name.")]
OperationRef = Annotated[PathText, Path(description="Operation id or unique id prefix.")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class NodeCreate(Strict):
    name: BodyName
    # What a tag must look like (its characters, its length): the service says.
    tags: Annotated[list[str], Field(max_length=MAX_TAGS)] = Field(
        default_factory=list, description="For trees' node_tag_filter, e.g. [\"gpu\", \"a100\"]."
    )
    resources: Resources = Field(
        description="e.g. {\"cpu\": 64, \"memory\": \"512GiB\", \"gpu\": 8, \"user_slots\": 64}."
    )


class TreeCreate(Strict):
    name: BodyName
    config: Options = Field(
        default_factory=dict,
        description="Tree options by their YTsaurus names; durations in milliseconds.",
    )


class TreeApply(Strict):
    document: str = Field(description="A whole tree as YAML: name, config, pools.")
    name: BodyName | None = Field(
        default=None, description="Refuse the document unless it describes this tree."
    )
    create: bool = Field(
        default=False,
        description="Refuse (409) an existing tree, as a create does (pool-tree create "
        "--config-file).",
    )


class OptionSet(Strict):
    option: Annotated[str, StringConstraints(max_length=MAX_NAME, pattern=TEXT_PATTERN),
                      AfterValidator(text)]
    value: OptionText = Field(description="As on the command line: YAML, e.g. \"10\" or "
                              "\"{cpu: 100}\".")


class DefaultTree(Strict):
    name: BodyName


class TreePoolCreate(Strict):
    name: BodyName
    parent: BodyName | None = Field(default=None, description="Default: the tree's root.")
    config: Options = Field(default_factory=dict,
                            description="Pool attributes by their YTsaurus names.")


class OperationStart(Strict):
    user: BodyName
    job_resources: Resources = Field(description="One job's resources.")
    job_count: Annotated[int, Field(ge=1, le=MAX_JOB_COUNT)]
    pool_trees: list[BodyName] = Field(
        default_factory=list,
        description="The trees it runs in (YTsaurus pool_trees). Default: the default_tree.",
    )
    pool: BodyName | None = Field(default=None, description="Its pool in each tree. Default: the "
                              "user's name (an ephemeral pool).")
    weight: Weight = 1
    gang: bool = False
    resource_limits: Resources | None = None
    scheduling_options_per_pool_tree: Options | None = Field(
        default=None, description="Per tree, what differs from pool / weight / "
        "resource_limits: {tree: {pool, weight, resource_limits}}.",
    )
    interruptible: bool = Field(
        default=False, description="Its jobs, when preempted, are interrupted first and keep "
        "their units for the tree's allocation_preemption_timeout.",
    )
    idempotency_key: IdempotencyKey = None


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def trees_router(
    trees: TreesService, prefix: str, dependencies: Sequence[params.Depends], tokens: Auth
) -> APIRouter:
    router = APIRouter(prefix=prefix, dependencies=dependencies)

    shown = answering(tokens, "operation")  # a submitter reads "another operation" for others'

    # -- nodes -------------------------------------------------------------------------------

    @router.post("/nodes", status_code=201, tags=["nodes"], response_model=NodeView)
    def add_node(body: NodeCreate) -> JSONResponse:
        """Add a node; every tree whose node_tag_filter selects it grows at once."""
        return _json(trees.add_node(body.name, body.tags, body.resources).as_dict(), 201)

    @router.get("/nodes", tags=["nodes"], response_model=Listed[NodeView])
    def list_nodes() -> JSONResponse:
        """Nodes, their tree and what runs on them."""
        return _json(page_dict([n.as_dict() for n in trees.list_nodes()]))

    @router.delete("/nodes/{name}", status_code=204, tags=["nodes"])
    def remove_node(name: PathName) -> Response:
        """Remove a node; refused (409) while it runs jobs."""
        trees.remove_node(name)
        return Response(status_code=204)

    # -- pool trees --------------------------------------------------------------------------

    @router.post("/pool-trees", status_code=201, tags=["pool trees"], response_model=TreeView,
                 responses=CREATED)
    def create_pool_tree(body: TreeCreate) -> JSONResponse:
        """Create a tree (the first one becomes the default_tree)."""
        tree = trees.create_tree(body.name, body.config)
        return located(_json(tree.as_dict(), 201), f"{prefix}/pool-trees/{segment(tree.name)}")

    @router.post("/pool-trees/apply", tags=["pool trees"], response_model=AppliedTree)
    def apply_pool_tree(body: TreeApply) -> JSONResponse:
        """Create or update a whole tree from YAML; pools missing from it are deleted.
        Idempotent: the answer lists what changed (nothing, the second time). With
        ``create``, an existing tree is refused (409)."""
        return _json(trees.apply_tree(body.document, body.name, body.create).as_dict())

    @router.get("/pool-trees", tags=["pool trees"], response_model=Listed[TreeView])
    def list_pool_trees() -> JSONResponse:
        return _json(page_dict([t.as_dict() for t in trees.list_trees()]))

    @router.get("/default-tree", tags=["pool trees"], response_model=DefaultTreeName)
    def get_default_tree() -> JSONResponse:
        """``default_tree``: the tree commands use when they name none (null: none yet)."""
        return _json({"default_tree": trees.default_tree()})

    @router.put("/default-tree", tags=["pool trees"], response_model=DefaultTreeName)
    def set_default_tree(body: DefaultTree) -> JSONResponse:
        return _json({"default_tree": trees.default_tree(body.name)})

    @router.get("/pool-trees/{name}", tags=["pool trees"], response_model=TreeView)
    def show_pool_tree(name: TreeName, caller: Caller) -> JSONResponse:
        """The tree with each element's fair / usage / demand share, dominant resource and
        starvation."""
        return shown(caller, trees.show_tree(name).as_dict())

    @router.get("/pool-trees/{name}/document", tags=["pool trees"],
                response_model=TreeDocument)
    def export_pool_tree(name: TreeName) -> JSONResponse:
        """The tree as a document ``POST /pool-trees/apply`` takes (``name``, ``config``,
        nested ``pools`` with their options): applied, it changes nothing."""
        return _json(trees.export_tree(name))

    @router.patch("/pool-trees/{name}", tags=["pool trees"], response_model=TreeView)
    def set_pool_tree(name: TreeName, body: OptionSet) -> JSONResponse:
        """Set one tree option, validated with every pool (YTsaurus units: milliseconds)."""
        return _json(trees.set_tree(name, body.option, body.value).as_dict())

    @router.delete("/pool-trees/{name}", status_code=204, tags=["pool trees"])
    def delete_pool_tree(name: TreeName) -> Response:
        """Delete a tree and its pools; refused (409) while operations are started in it.
        Ended operations lose their history in it."""
        trees.delete_tree(name)
        return Response(status_code=204)

    @router.post("/pool-trees/{name}/reconcile", tags=["pool trees"], response_model=TreeView)
    def reconcile_pool_tree(name: TreeName) -> JSONResponse:
        """One pass now: promote pending operations, grant jobs, preempt for starving ones."""
        return _json(trees.reconcile(name).as_dict())

    # -- pools of a tree ---------------------------------------------------------------------

    @router.post("/pool-trees/{tree}/pools", status_code=201, tags=["pool trees"],
                 response_model=TreePoolView, responses=CREATED)
    def create_tree_pool(tree: TreeName, body: TreePoolCreate) -> JSONResponse:
        """Create a pool, validated with the whole tree."""
        view = trees.create_pool(tree, body.name, body.parent, body.config)
        return located(_json(view.as_dict(), 201),
                       f"{prefix}/pool-trees/{segment(view.tree)}/pools/{segment(view.name)}")

    @router.get("/pool-trees/{tree}/pools/{name}", tags=["pool trees"],
                response_model=TreePoolView)
    def describe_tree_pool(tree: TreeName, name: PathName) -> JSONResponse:
        """Every attribute, the effective_* values, operation counts and shares."""
        return _json(trees.describe_pool(tree, name).as_dict())

    @router.patch("/pool-trees/{tree}/pools/{name}", tags=["pool trees"],
                  response_model=TreePoolView)
    def set_tree_pool(tree: TreeName, name: PathName, body: OptionSet) -> JSONResponse:
        """Set one attribute (``parent`` moves the pool), validated with the whole tree."""
        return _json(trees.set_pool(tree, name, body.option, body.value).as_dict())

    @router.delete("/pool-trees/{tree}/pools/{name}", status_code=204, tags=["pool trees"])
    def delete_tree_pool(tree: TreeName, name: PathName) -> Response:
        """Delete a pool; refused (409) while it has child pools or started operations."""
        trees.delete_pool(tree, name)
        return Response(status_code=204)

    # -- operations --------------------------------------------------------------------------

    @router.post("/operations", status_code=201, tags=["operations of pool trees"],
                 response_model=OperationView, responses=CREATED)
    def start_operation(
        body: OperationStart, caller: Caller, idempotency_header: IdempotencyHeader = None
    ) -> JSONResponse:
        """Start an operation in one or more pool trees: rejected (422) at a
        max_operation_count of any of them, pending at a max_running_operation_count, else
        running with the jobs that fit; its jobs run in any of its trees."""
        view = trees.start_operation(
            user=body.user, job_resources=body.job_resources, job_count=body.job_count,
            trees=body.pool_trees, pool=body.pool, weight=body.weight, gang=body.gang,
            resource_limits=body.resource_limits, interruptible=body.interruptible,
            tree_options=body.scheduling_options_per_pool_tree, created_by=owner_of(caller),
            idempotency_key=one_key(idempotency_header, body.idempotency_key),
        )
        return located(shown(caller, view.as_dict(), 201), f"{prefix}/operations/{view.id}")

    @router.get("/operations", tags=["operations of pool trees"],
                response_model=Listed[OperationView])  # type: ignore[valid-type]
    def list_operations(
        caller: Caller,
        tree: QueryText | None = None,
        status: OperationStatus | None = None,
        limit: PageLimit = DEFAULT_PAGE_SIZE,
        offset: PageOffset = 0,
        after: PageAfter | None = None,
    ) -> JSONResponse:
        """Operations, oldest first, optionally of one tree and one status, one page:
        ``{"items", "pagination"}``; a submitter's own only."""
        page = trees.operation_page(
            tree, status, limit=limit, offset=offset, after=after,
            created_by=listed_for(caller)
        )
        return shown(caller, page.as_dict())

    @router.get("/operations/{ref}", tags=["operations of pool trees"],
                response_model=OperationView)
    def describe_operation(ref: OperationRef, caller: Caller) -> JSONResponse:
        """Fair share, running / pending jobs, why pending, interrupted and preempted jobs."""
        return shown(caller, trees.describe_operation(ref).as_dict())

    @router.post("/operations/{ref}/complete", tags=["operations of pool trees"],
                 response_model=OperationView)
    def complete_operation(ref: OperationRef, caller: Caller) -> JSONResponse:
        """The operation finished: its jobs' units return."""
        return shown(caller, trees.complete_operation(ref).as_dict())

    @router.post("/operations/{ref}/abort", tags=["operations of pool trees"],
                 response_model=OperationView)
    def abort_operation(ref: OperationRef, caller: Caller) -> JSONResponse:
        """Stop the operation: its jobs' units return."""
        return shown(caller, trees.abort_operation(ref).as_dict())

    return router


__all__ = ["MAX_TREE_DOCUMENT_BODY", "trees_router"]
