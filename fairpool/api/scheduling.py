"""HTTP routes of the scheduler config (seed 004): versions, workloads, queues.

An invalid config answers every problem at once, each with its path: 422 when the document's
shape is wrong, 400 when it is well formed but names a flavor or queue that does not exist
(or changes an applied queue's spec).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, params
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from fairpool.api.answers import (
    AppliedConfig,
    ConfigDiff,
    ConfigPreview,
    ConfigValidation,
    Listed,
    QueueView,
)
from fairpool.api.auth import Auth, Caller, answering, listed_for, owner_of
from fairpool.api.models import (
    DEFAULT_PAGE_SIZE,
    Cancel,
    IdempotencyHeader,
    IdempotencyKey,
    PageAfter,
    PageLimit,
    PageOffset,
    PathText,
    QueryText,
    Version,
    one_key,
)
from fairpool.api.semantics import CREATED, located
from fairpool.frontends.config import (
    MAX_DOCUMENT,
    MAX_PRIORITY,
    MAX_VERSION,
    ConfigError,
    load_config,
    warnings,
)
from fairpool.paging import page_dict
from fairpool.scheduling import (
    Applied,
    ConfigVersionView,
    ExplainView,
    SchedulingService,
    WorkloadView,
)
from fairpool.store.records import WorkloadStatus

#: The body limit of the routes that take a config document: JSON may spell each of its
#: characters (``MAX_DOCUMENT``: the service checks it) as a 12-byte surrogate-pair escape.
MAX_DOCUMENT_BODY = 12 * MAX_DOCUMENT + 1024


#: Only if the active version is still this one (0: none yet): a change confirmed against
#: what was shown does not undo another applied meanwhile (409 if it did).
BasedOn = Annotated[int, Field(ge=0, le=MAX_VERSION)] | None


class ConfigBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    #: The YAML document, as a user writes it in a file.
    document: str
    based_on: BasedOn = None
    idempotency_key: IdempotencyKey = None


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    #: The YAML document, as a user writes it in a file.
    document: str


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    based_on: BasedOn = None
    idempotency_key: IdempotencyKey = None


class WorkloadBody(BaseModel):
    """The values of labels and demand, and the reserved labels, are any JSON here: the
    service checks them (``workloads.validate_workload``) and words each problem as it does
    embedded (a reserved label named by its key, ``instance-type``). The body limit bounds
    them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    labels: dict[str, JsonValue] | None = None
    instance_type: JsonValue = None
    accelerator_type: JsonValue = None
    market_type: JsonValue = None
    cloud_resource_id: JsonValue = None
    workload_type: JsonValue = None
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY)] | None = None
    demand: dict[str, JsonValue] | None = None


async def _exact_demand(request: Request) -> Mapping[str, object] | None:
    """The body's ``demand`` with its numbers as written (``Decimal``): a float read
    1.5e-400 as 0, a demand of nothing that was admitted (helper-101), and 1e400 as inf; the
    service refuses each as it does the CLI's text. Anything but a mapping is the body model's
    to refuse."""
    try:
        body = json.loads(await request.body(), parse_float=Decimal)
    except ValueError:
        return None
    demand = body.get("demand") if isinstance(body, dict) else None
    return demand if isinstance(demand, dict) else None


#: A workload's demand as its JSON wrote it (``_exact_demand``); out of the OpenAPI schema.
ExactDemand = Annotated[Mapping[str, object] | None, Depends(_exact_demand)]


class WorkloadSubmit(WorkloadBody):
    idempotency_key: IdempotencyKey = None


def invalid_config(error: ConfigError) -> JSONResponse:
    """Every problem, each with its path; 400 when all are references, else 422."""
    status = 400 if all(issue.reference for issue in error.errors) else 422
    return JSONResponse(
        {
            "detail": error.summary,
            "field": "document",
            "errors": [issue.as_dict() for issue in error.errors],
        },
        status_code=status,
    )


def scheduling_router(
    scheduling: SchedulingService,
    prefix: str,
    dependencies: Sequence[params.Depends],
    tokens: Auth,
) -> APIRouter:
    router = APIRouter(prefix=prefix, dependencies=dependencies)

    shown = answering(tokens, "workload")  # a submitter reads "another workload" for others'

    @router.post("/config/validate", tags=["scheduler config"],
                 response_model=ConfigValidation)
    def validate_config(
        body: ConfigBody, idempotency_header: IdempotencyHeader = None
    ) -> JSONResponse:
        """Validate a document without applying it: every error at once, with its path."""
        one_key(idempotency_header, body.idempotency_key)  # checked as an apply's, unused
        try:
            config = load_config(body.document)
        except ConfigError as error:
            return invalid_config(error)
        return JSONResponse({
            "valid": True,
            "errors": [],
            "warnings": [issue.as_dict() for issue in warnings(config)],
        })

    @router.post("/config/preview", tags=["scheduler config"], response_model=ConfigPreview)
    def preview_config(body: Document) -> JSONResponse:
        """What applying a document would change, without applying it: refused as an apply
        would refuse it, else the change from the active version (``based_on``: its number,
        to apply it only if it is still active) and the advisories."""
        try:
            return JSONResponse(scheduling.preview_config(body.document).as_dict())
        except ConfigError as error:
            return invalid_config(error)

    def applied_answer(applied: Applied) -> JSONResponse:
        """A new version's 201, located where ``GET /config`` answers it."""
        return located(JSONResponse(applied.as_dict(), status_code=201),
                       f"{prefix}/config?version={applied.version.version}")

    @router.post("/config", status_code=201, tags=["scheduler config"],
                 response_model=AppliedConfig, responses=CREATED)
    def apply_config(
        body: ConfigBody, idempotency_header: IdempotencyHeader = None
    ) -> JSONResponse:
        """Apply a document as the new active version (identical content too)."""
        key = one_key(idempotency_header, body.idempotency_key)
        try:
            applied = scheduling.apply_config(body.document, body.based_on, key)
        except ConfigError as error:
            return invalid_config(error)
        return applied_answer(applied)

    @router.get("/config", tags=["scheduler config"], response_model=ConfigVersionView)
    def get_config(
        version: Annotated[Version, Query()] | None = None,
    ) -> JSONResponse:
        """A version (default: the active one); 404 before the first apply."""
        found = scheduling.get_config(version)
        if found is None:
            return JSONResponse(
                {"detail": "no scheduler config has been applied yet", "field": None},
                status_code=404,
            )
        return JSONResponse(found.as_dict())

    @router.get("/config/versions", tags=["scheduler config"],
                response_model=Listed[ConfigVersionView])
    def list_configs() -> JSONResponse:
        """Every version, newest first, without its document (``GET /config?version=N``)."""
        return JSONResponse(page_dict([v.as_dict() for v in scheduling.list_configs()]))

    @router.get("/config/versions/{version}/diff", tags=["scheduler config"],
                response_model=ConfigDiff)
    def diff_config(version: Annotated[Version, Path()]) -> JSONResponse:
        """What applying ``version`` again would change, queue by queue."""
        return JSONResponse({"version": version,
                             "changes": list(scheduling.diff_config(version))})

    @router.post("/config/versions/{version}/rollback", status_code=201,
                 tags=["scheduler config"], response_model=AppliedConfig, responses=CREATED)
    def rollback_config(
        version: Annotated[Version, Path()],
        body: RollbackBody | None = None,
        idempotency_header: IdempotencyHeader = None,
    ) -> JSONResponse:
        """Apply ``version`` again, as a new version (the body, optional: ``based_on``)."""
        body = body or RollbackBody()
        key = one_key(idempotency_header, body.idempotency_key)
        return applied_answer(scheduling.rollback_config(version, body.based_on, key))

    @router.post("/config/explain", tags=["scheduler config"], response_model=ExplainView)
    def explain(body: WorkloadBody, caller: Caller, demand: ExactDemand) -> JSONResponse:
        """What a workload would get now (rule, queue, flavors, priority) and why not others;
        nothing is stored."""
        asked = body.model_dump() | {"demand": demand}
        return shown(caller, scheduling.explain(**asked).as_dict())

    @router.post("/workloads", status_code=201, tags=["workloads"], response_model=WorkloadView,
                 responses=CREATED)
    def submit_workload(
        body: WorkloadSubmit, caller: Caller, demand: ExactDemand,
        idempotency_header: IdempotencyHeader = None,
    ) -> JSONResponse:
        """Submit a workload; the answer carries the decision already made."""
        key = one_key(idempotency_header, body.idempotency_key)
        asked = body.model_dump() | {"demand": demand, "idempotency_key": key}
        view = scheduling.submit_workload(**asked, created_by=owner_of(caller))
        return located(shown(caller, view.as_dict(), 201), f"{prefix}/workloads/{view.id}")

    @router.get("/workloads", tags=["workloads"], response_model=Listed[WorkloadView])
    def list_workloads(
        caller: Caller,
        status: WorkloadStatus | None = None,
        queue: QueryText | None = None,
        limit: PageLimit = DEFAULT_PAGE_SIZE,
        offset: PageOffset = 0,
        after: PageAfter | None = None,
    ) -> JSONResponse:
        """Workloads in submission order, optionally by status and queue, one page:
        ``{"items", "pagination"}``; a submitter's own only."""
        page = scheduling.workload_page(
            status, queue, limit=limit, offset=offset, after=after,
            created_by=listed_for(caller)
        )
        return shown(caller, page.as_dict())

    @router.get("/workloads/{ref}", tags=["workloads"], response_model=WorkloadView)
    def get_workload(ref: PathText, caller: Caller) -> JSONResponse:
        return shown(caller, scheduling.get_workload(ref).as_dict())

    @router.post("/workloads/{ref}/release", tags=["workloads"], response_model=WorkloadView)
    def release_workload(ref: PathText, caller: Caller) -> JSONResponse:
        """The workload ended: its quota is free again."""
        return shown(caller, scheduling.release_workload(ref).as_dict())

    @router.post("/workloads/{ref}/cancel", tags=["workloads"], response_model=WorkloadView)
    def cancel_workload(
        ref: PathText, caller: Caller, body: Cancel | None = None
    ) -> JSONResponse:
        """Withdraw a queued or admitted workload (the body, optional, says why)."""
        view = scheduling.cancel_workload(ref, body.reason if body else None)
        return shown(caller, view.as_dict())

    @router.get("/queues", tags=["queues"], response_model=Listed[QueueView])
    def list_queues() -> JSONResponse:
        """The active config's queues with usage against quota per flavor and resource."""
        return JSONResponse(page_dict([q.as_dict() for q in scheduling.list_queues()]))

    @router.get("/queues/{name}", tags=["queues"], response_model=QueueView)
    def describe_queue(name: PathText) -> JSONResponse:
        return JSONResponse(scheduling.describe_queue(name).as_dict())

    return router
